"""hpc_train: from a YAML job spec on a Slurm login node to Horovod/DDP ranks and back.

Login-node modules (cli, spec, slurm, launch, inspect, doctor) must not import torch, horovod or
h5py at module level: `python -m hpc_train --help` has to start fast on a node without GPUs.
"""

__version__ = "0.1.0"
