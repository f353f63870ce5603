"""hpc_train: from a YAML job spec on a Slurm login node to Horovod/DDP ranks and back.

Login-node modules (cli, spec, slurm, launch, inspect, doctor) must not import torch, horovod or
h5py at module level: `python -m hpc_train --help` has to start fast on a node without GPUs.

The Python API (hpc_train/api) is here by name, loaded on first use: `hpc_train.submit(...)`,
`hpc_train.open_run(...)`; `import hpc_train` alone loads nothing else.
"""

__version__ = "0.1.0"

_API = ("submit", "resume", "open_run", "Run", "RunStatus", "WaitTimeout")


def __getattr__(name: str):
    # Only on a name the package lacks; every other name (a submodule) is an AttributeError,
    # so `from hpc_train import events` still imports the submodule.
    if name in _API:
        from hpc_train import api

        return getattr(api, name)
    raise AttributeError(f"module 'hpc_train' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
