"""Code that runs inside the job, on the batch host: the driver (starts the ranks with mpirun,
watches them, requeues or finishes the job) and the ranks' entry point (`job.worker`).

Nothing here runs on the login node; login-node code (submit, render, resume) is in `slurm/`.
"""
