"""Login-node inspection of a run directory: status, logs, failure diagnosis, plots.

Nothing here imports torch, horovod, h5py or mpi4py: these commands must start fast on a login
node. Slurm (squeue, sacct) only adds live state to what the run directory already says.
"""
