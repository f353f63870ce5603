"""Print one JSON line of torch, GPU and Horovod facts (run by the doctor in a subprocess)."""

import json

import torch

facts = {
    "torch": torch.__version__,
    "cuda": torch.version.cuda,
    "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
}
try:
    import horovod
    import horovod.torch as hvd

    facts["horovod"] = {
        "version": horovod.__version__,
        "mpi_built": bool(hvd.mpi_built()),
        "gloo_built": bool(hvd.gloo_built()),
        "nccl_built": bool(hvd.nccl_built()),
    }
except Exception as exc:  # noqa: BLE001 - any import failure is the finding itself
    facts["horovod"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
print(json.dumps(facts))
