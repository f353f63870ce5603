"""Workflows: stages (shard, train, evaluate, export, command) chained by Slurm's own
dependencies, sweeps as one job array, a workflow directory with status, resume and cancel.
Login-node code: no torch, horovod or h5py at import. See docs/workflows.md."""
