"""Run under mpirun: accumulation 2 x B on each of N ranks vs. one process on the whole batch.

argv: BACKEND (horovod | ddp | fsdp) OUT_DIR. Writes OUT_DIR/rank-N.json with the largest parameter
difference from the single-process reference after a few optimizer steps (a file per rank:
lines that ranks print can interleave in mpirun's forwarded stdout).
"""

import copy
import json
import os
import sys
from pathlib import Path

import torch

from hpc_train.parallel.data_parallel import make_backend
from hpc_train.launch.identity import rank_from_env
from hpc_train.train.precision import Precision
from hpc_train.train.step import optimizer_step

STEPS, ACCUMULATION, BATCH, FEATURES, CLASSES = 3, 2, 4, 8, 3

identity = rank_from_env(os.environ)
if sys.argv[1] == "fsdp":
    from hpc_train.parallel.fsdp import FsdpBackend
    from hpc_train.spec.schema import FsdpSpec

    backend = FsdpBackend(identity, torch.device("cpu"))
else:
    backend = make_backend(sys.argv[1], identity, torch.device("cpu"))
torch.manual_seed(0)
# No BatchNorm: batch statistics would make 2 x B and 2B legitimately different.
model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, CLASSES))
reference = copy.deepcopy(model)
if sys.argv[1] == "fsdp":     # sharded before its optimizer is built, as FsdpParts does
    model = backend.shard(model, [model[0], model[2]], FsdpSpec())
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
if sys.argv[1] != "fsdp":
    model, optimizer = backend.prepare(model, optimizer, accumulation=ACCUMULATION, compression="none")
criterion = torch.nn.CrossEntropyLoss()

data = torch.Generator().manual_seed(1)
shape = (STEPS, identity.size, ACCUMULATION, BATCH)
inputs = torch.randn(*shape, FEATURES, generator=data)
labels = torch.randint(CLASSES, shape, generator=data)

precision = Precision("fp32", "cpu")
for step in range(STEPS):
    micro = [(inputs[step, identity.rank, k], labels[step, identity.rank, k]) for k in range(ACCUMULATION)]
    optimizer_step(model, optimizer, micro, lambda m, x, y: criterion(m(x), y), precision, backend)

reference_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
for step in range(STEPS):
    reference_opt.zero_grad()
    criterion(reference(inputs[step].reshape(-1, FEATURES)), labels[step].reshape(-1)).backward()
    reference_opt.step()

whole = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
diff = max((a - b).abs().max().item() for a, b in zip(whole, reference.parameters()))
Path(sys.argv[2], f"rank-{identity.rank}.json").write_text(json.dumps({"rank": identity.rank, "max_diff": diff}))
backend.shutdown()
