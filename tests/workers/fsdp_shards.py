"""Run under mpirun: the GPT CPU spec's model sharded by fsdp, as FsdpParts shards it.

argv: OUT_DIR. Writes OUT_DIR/rank-N.json with the parameter elements this rank holds, the
model's total, and the sha256 of the gathered whole parameters.
"""

import hashlib
import json
import os
import sys
from pathlib import Path

import torch

from hpc_train.launch.identity import rank_from_env
from hpc_train.models import build_model, shard_units
from hpc_train.parallel.fsdp import FsdpBackend, full_parameters, local_numel
from hpc_train.spec.schema import FsdpSpec

identity = rank_from_env(os.environ)
backend = FsdpBackend(identity, torch.device("cpu"))
torch.manual_seed(0)
model = build_model("gpt", 256, {"layers": 4, "dim": 64, "heads": 4}, seq_len=64)
total = sum(p.numel() for p in model.parameters())
model = backend.shard(model, shard_units("gpt", model), FsdpSpec())
digest = hashlib.sha256()
for name, tensor in full_parameters(model):
    digest.update(name.encode() + tensor.detach().contiguous().numpy().tobytes())
Path(sys.argv[1], f"rank-{identity.rank}.json").write_text(json.dumps(
    {"rank": identity.rank, "local": local_numel(model), "total": total,
     "digest": digest.hexdigest()}))
backend.shutdown()
