"""The one Slurm client: the only code that runs sbatch, squeue, sacct, scontrol, scancel or sinfo
or reads what they print (tests/test_slurm_boundary.py holds every other module to that).

client.py runs the commands (bounded, one retry policy); parse.py and accounting.py turn their
text into typed values (pure). Used inside the job (the driver's requeue) and on the login node
(submission, inspection, workflows, doctor), so it sits in the base layer.
"""

from hpc_train.scheduler.accounting import Segment, Step
from hpc_train.scheduler.client import (accounted, accounting_problem, cancel, controller_problem,
                                        installed, job_end_time, live_state, partitions, queue,
                                        requeue, segments, show_job, smallest_memory, submit)
from hpc_train.scheduler.parse import (ACTIVE_STATES, FAILED_STATES, RUNNING_STATES, Job, JobState,
                                       array_tasks, job_ref, parse_duration)

__all__ = ["ACTIVE_STATES", "FAILED_STATES", "RUNNING_STATES", "Job", "JobState", "Segment", "Step",
           "accounted", "accounting_problem", "array_tasks", "cancel", "controller_problem",
           "installed", "job_end_time", "job_ref", "live_state", "parse_duration", "partitions",
           "queue", "requeue", "segments", "show_job", "smallest_memory", "submit"]
