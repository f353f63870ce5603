"""Slurm on the login node: sbatch options, the standalone script, submitit submission, resume.

What runs inside the job (driver, requeue decision, the ranks' entry point) is in `job/`.
"""
