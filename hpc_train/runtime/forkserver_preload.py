"""Imported by the data workers' forkserver only, first of its preloads (train/data.py): binds the
server's life to the rank that started it (runtime/parent_death.py). Nothing else imports it."""

from hpc_train.runtime.parent_death import die_with_parent, served_pid

die_with_parent(served_pid())
