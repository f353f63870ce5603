"""Horovod's knobs (`parallel.horovod` in the spec) as the environment of every rank (pure).

Horovod reads its tuning from HOROVOD_* variables when `hvd.init()` starts its background
thread, so the driver passes them to the ranks like any other launch variable (`-x` for mpirun,
srun's environment). The timeline and the autotune log are files of the run directory, one per
run of the job: a requeued run writes its own instead of truncating the first one's.
"""

from __future__ import annotations

from pathlib import Path

from hpc_train.rundir import RunPaths

FUSION, CYCLE = "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME"
HIERARCHICAL = "HOROVOD_HIERARCHICAL_ALLREDUCE"
TIMELINE, AUTOTUNE, AUTOTUNE_LOG = "HOROVOD_TIMELINE", "HOROVOD_AUTOTUNE", "HOROVOD_AUTOTUNE_LOG"
# Every variable a knob can set: the spec key owns it, so launch.env may not set it as well.
KNOB_VARS = (FUSION, CYCLE, HIERARCHICAL, TIMELINE, AUTOTUNE, AUTOTUNE_LOG)
MIB = 1024 * 1024


def horovod_env(knobs, paths: RunPaths, restart: int = 0) -> dict[str, str]:
    """The HOROVOD_* variables for the knobs that are set (`knobs`: a spec's HorovodSpec).

    Horovod keeps the fusion threshold in whole MiB (it divides the bytes by 2**20), hence an
    integer number of MiB in the spec. Knobs left at None are not exported: Horovod's default
    applies, or the value launch.env gives the variable.
    """
    env: dict[str, str] = {}
    if knobs.fusion_threshold_mb is not None:
        env[FUSION] = str(knobs.fusion_threshold_mb * MIB)
    if knobs.cycle_time_ms is not None:
        env[CYCLE] = f"{knobs.cycle_time_ms:g}"
    if knobs.hierarchical_allreduce:
        env[HIERARCHICAL] = "1"
    if knobs.timeline:
        env[TIMELINE] = str(paths.horovod_timeline(restart))
    if knobs.autotune:
        env[AUTOTUNE] = "1"
        env[AUTOTUNE_LOG] = str(paths.horovod_autotune_log(restart))
    return env


# One core per rank: Horovod's background thread wakes every cycle (1 ms by default since
# Horovod 0.21) and Open MPI's progress engine busy-polls while it waits; both take the core the
# rank computes on. Yielding is what matters: on 2 ranks with one core each (bench train,
# jobs/smoke.yaml) Horovod ran at 0.68x DDP's images/s untuned and 0.95-1.10x with yielding and
# a 2 ms cycle. The cycle sets how long a step's gradients wait to go out: with yielding, its
# gradient allreduce came to 0.84 of mpi4py's at 10 ms, 0.92 at 5, 0.99-1.07 at 2 and 1.15 at 1,
# images/s 0.95-1.10x DDP's over these runs (one session, docs/benchmarks.md). 2 ms keeps most
# of the gain with half the wake-ups of Horovod's default.
# The price, measured 2026-12-07 (Open MPI 4.1.4, 2 ranks, hvd.init() then 10 s asleep): an idle
# pair spends a whole core polling at a 2 or 5 ms cycle (10.0 and 9.6 core-seconds), 0.1 of one at
# 10 ms and 0.04 at 20 ms. It costs nothing under load (yielding gives the core away: a smoke run
# beside three busy loops used the same CPU at 2 and 20 ms, and as DDP), but it is what `top`
# shows of a rank that waits on its data or a save on an otherwise idle node.
FEW_CORE_CYCLE_MS = 2
OPENMPI_YIELD = "OMPI_MCA_mpi_yield_when_idle"


def few_core_env(knobs, cpus_per_task: int, mpi: str) -> dict[str, str]:
    """What the driver sets for Horovod on one core per rank (`knobs.few_core_tuning`): a
    longer cycle unless the spec sets one, and Open MPI's yielding while idle. Nothing on more
    cores per rank, where the background thread has a core of its own."""
    if not knobs.few_core_tuning or cpus_per_task > 1:
        return {}
    env = {} if knobs.cycle_time_ms is not None else {CYCLE: str(FEW_CORE_CYCLE_MS)}
    if mpi == "openmpi":
        env[OPENMPI_YIELD] = "1"
    return env


def knob_vars(knobs) -> list[str]:
    """The variables these knobs set (the same names whatever the run directory)."""
    return sorted(horovod_env(knobs, RunPaths(Path(".")), 0))


def read_knobs(environ) -> dict[str, str]:
    """The knob variables a rank sees, as it records them (benchmarks, tests)."""
    return {name: environ[name] for name in (*KNOB_VARS, OPENMPI_YIELD) if name in environ}
