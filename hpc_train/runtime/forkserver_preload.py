"""Imported by the data workers' forkserver only, first of its preloads (train/data.py): binds the
server's life to the rank that started it (runtime/parent_death.py). The job's stop signals reach
it blocked (start_worker_server spawns it so), and its workers ignore them. Nothing else imports
it."""

from hpc_train.runtime.parent_death import die_with_parent, served_pid

die_with_parent(served_pid())
