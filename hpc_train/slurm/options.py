"""sbatch options from a job spec: one pure function shared by submitit and the rendered script.

The one-driver pattern (docs/architecture.md): Slurm reserves `tasks_per_node` slots per node,
but the batch script runs one driver process, which starts the ranks with mpirun. `B:` sends the
stop signal to the batch shell (and, through `exec`, to the driver itself), not to job steps.
"""

from __future__ import annotations

from hpc_train.spec import JobSpec


def sbatch_options(spec: JobSpec, output: str) -> dict[str, str | bool]:
    """Ordered sbatch options (name without `--` -> value, True for a bare flag)."""
    s = spec.slurm
    options: dict[str, str | bool] = {
        "job-name": spec.run.name,
        "nodes": str(s.nodes),
        "ntasks-per-node": str(s.tasks_per_node),
        "cpus-per-task": str(s.cpus_per_task),
        "time": str(spec.time_minutes),
        "signal": f"B:USR2@{s.signal_seconds}",
        "requeue": True,
        "open-mode": "append",   # a requeued run must not truncate the first run's output
        "output": output,
    }
    if s.gpus_per_node:
        options["gpus-per-node"] = str(s.gpus_per_node)
    for name in ("partition", "account", "qos", "constraint", "mem"):
        if (value := getattr(s, name)) is not None:
            options[name] = value
    for name, value in s.extra.items():
        options[name] = value if value != "" else True
    return options
