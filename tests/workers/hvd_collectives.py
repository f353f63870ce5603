"""Run under mpirun: Horovod collectives and one DistributedOptimizer step.

argv: OUT_DIR. Writes OUT_DIR/rank-N.json (a file per rank: printed lines can interleave).
"""

import json
import sys
from pathlib import Path

import horovod.torch as hvd
import torch

hvd.init()
rank, size = hvd.rank(), hvd.size()

summed = hvd.allreduce(torch.full((4,), float(rank + 1)), op=hvd.Sum, name="sum")
averaged = hvd.allreduce(torch.full((4,), float(rank + 1)), op=hvd.Average, name="avg")
root_value = hvd.broadcast(torch.tensor([float(rank + 10)]), root_rank=0, name="bcast")

# Different initial weights per rank; broadcast makes them equal, then one averaged-gradient step.
torch.manual_seed(rank)
model = torch.nn.Linear(3, 1, bias=False)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
start = model.weight.detach().clone()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                               named_parameters=model.named_parameters(),
                               compression=hvd.Compression.fp16)
x = torch.full((1, 3), float(rank + 1))  # d(sum(w.x))/dw = x, so the mean gradient is mean(rank+1)
opt.zero_grad()
model(x).sum().backward()
opt.step()

Path(sys.argv[1], f"rank-{rank}.json").write_text(json.dumps({
    "rank": rank, "size": size, "sum": summed.tolist(), "avg": averaged.tolist(),
    "bcast": root_value.item(), "start": start.flatten().tolist(),
    "after": model.weight.detach().flatten().tolist(),
}))
