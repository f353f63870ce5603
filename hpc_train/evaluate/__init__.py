"""`python -m hpc_train evaluate RUN_DIR`: a run's checkpoint on a split of its data.

data.py picks and checks the data, run.py evaluates (one process, or the ranks of mpirun/srun)
and report.py makes the figures and the eval-<split>-<step>.json document.
"""
