"""Slurm side of a job: sbatch options, the standalone script, submitit submission, the driver."""
