"""One rank of `bench train` (`python -m hpc_train.bench.train_rank BENCH_DIR`), started by the
driver's launch plan exactly as a job's ranks are (mpirun or srun, the same environment).

It sets itself up as a job's worker does (its own log, heartbeat, network, stop flag), then runs
every configuration of its launch (BENCH_DIR/plan.json, the launch named by LAUNCH_ENV) in the
launch's order: the real Trainer built from that configuration's spec (configs/<name>/spec.yaml),
or the bare loop; `warmup` steps, then `steps` timed steps, each broken down by the StepClock.
What the rank itself ran (backend, precision, compression, world size, device, Horovod's
variables) is recorded beside the times. After the configurations of a launch of several
ranks, the allreduce ratio (bench/allreduce.py). Results: results/launch-N/rank-K.json,
rewritten after each configuration.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import logging
import os
import resource
import socket
import sys
import time
from pathlib import Path

LAUNCH_ENV = "HPC_TRAIN_BENCH_LAUNCH"
log = logging.getLogger("hpc_train.bench")


def results_file(root: Path, launch: int, rank: int) -> Path:
    return root / "results" / f"launch-{launch}" / f"rank-{rank}.json"


def reset_peak_memory(device) -> str:
    """Start a configuration's peak memory afresh; the source of the figure."""
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return "torch.cuda.max_memory_allocated"
    try:  # Linux: "5" resets the process's peak RSS (VmHWM), so each configuration has its own
        Path("/proc/self/clear_refs").write_text("5")
        return "VmHWM (peak RSS of the rank process, reset per configuration)"
    except OSError:
        return "ru_maxrss (peak RSS of the rank process since it started)"


def peak_memory(device) -> int:
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def quiesce_horovod(keep: bool) -> None:
    """Stop Horovod's background thread unless the next configuration uses Horovod: idle, it
    still cycles (an MPI collective every few ms), which would slow the DDP configurations.
    MPI belongs to mpi4py (imported first), so Horovod can start again later."""
    import horovod.torch as hvd

    if not keep and hvd.is_initialized():
        hvd.shutdown()


def run_trainer(spec, paths, identity, stop, heartbeat, clock, warmup: int, steps: int) -> dict:
    from hpc_train.errors import HpcTrainError
    from hpc_train.launch.horovod import read_knobs
    from hpc_train.train.checkpointing import Checkpointing
    from hpc_train.train.trainer import Trainer

    trainer = Trainer(spec, paths, identity, stop, heartbeat, clock=clock)
    try:
        if warmup + steps >= trainer.steps_per_epoch:
            raise HpcTrainError(f"{paths.root.name}: {trainer.steps_per_epoch} steps per epoch, "
                                f"fewer than --warmup {warmup} + --steps {steps} + 1: an epoch end "
                                "would evaluate and checkpoint among the timed steps; lower them")
        clock.watch(trainer.model)
        checkpoints = Checkpointing(trainer, stop)
        trainer.train_steps(warmup, checkpoints)
        clock.reset()
        trainer.train_steps(steps, checkpoints)
        return {"backend": trainer.backend.name, "precision": trainer.precision.mode,
                "compression": trainer.backend.compression, "accumulation": spec.parallel.accumulation,
                "world_size": identity.size, "device": str(trainer.device),
                "samples_per_step": spec.samples_per_step, "data": spec.data.kind,
                "horovod_env": read_knobs(os.environ) if trainer.backend.name == "horovod" else {}}
    finally:
        trainer.close()


def run_bare(spec, identity, clock, compression: str, warmup: int, steps: int) -> dict:
    from hpc_train.bench.bare_loop import BareLoop, plain_loader
    from hpc_train.data.synthetic import SyntheticImages
    from hpc_train.launch.horovod import read_knobs
    from hpc_train.train.trainer import pick_device

    device = pick_device(spec, identity)
    data = SyntheticImages(spec.data.train_samples, spec.data.num_classes, spec.data.image_size,
                           seed=spec.run.seed)
    loop = BareLoop(spec, identity, device, plain_loader(spec, identity, device, data),
                    compression=compression, clock=clock)
    try:
        loop.steps(warmup)
        clock.reset()
        loop.steps(steps)
        return {"backend": loop.backend, "precision": loop.precision, "compression": loop.compression,
                "accumulation": 1, "world_size": identity.size, "device": str(device),
                "samples_per_step": spec.data.batch_size * identity.size, "data": spec.data.kind,
                "horovod_env": read_knobs(os.environ) if loop.backend == "horovod" else {}}
    finally:
        loop.close()


def run_config(config: dict, root: Path, identity, stop, heartbeat, warmup: int, steps: int) -> dict:
    import torch

    from hpc_train.rundir import RunPaths
    from hpc_train.spec import load_spec
    from hpc_train.train.timing import StepClock, breakdown
    from hpc_train.train.trainer import pick_device

    paths = RunPaths(root / "configs" / config["name"])
    spec = load_spec(paths.spec)
    quiesce_horovod(keep=config["backend"] == "horovod")
    device = pick_device(spec, identity)
    clock = StepClock(device)
    source = reset_peak_memory(device)
    started = time.perf_counter()
    if config["kind"] == "trainer":
        recorded = run_trainer(spec, paths, identity, stop, heartbeat, clock, warmup, steps)
    else:
        recorded = run_bare(spec, identity, clock, config["compression"], warmup, steps)
    result = {"name": config["name"], "recorded": recorded,
              "steps": [breakdown(marks) for marks in clock.seconds()],
              "peak_memory_bytes": peak_memory(device), "peak_memory_source": source,
              "seconds": round(time.perf_counter() - started, 3)}
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def write_results(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hpc_train.bench.train_rank BENCH_DIR", file=sys.stderr)
        return 2
    from hpc_train.job.worker import join_network, redirect_output, setup_logging
    from hpc_train.launch.identity import rank_from_env
    from hpc_train.rundir import RunPaths
    from hpc_train.runtime.heartbeat import Heartbeat
    from hpc_train.runtime.stop import STALL_ENV, StopFlag

    root = Path(args[0])
    identity = rank_from_env(os.environ)
    redirect_output(RunPaths(root).rank_log(identity.rank))
    faulthandler.enable(all_threads=True)
    stop = StopFlag.from_env()
    setup_logging(identity.rank)
    heartbeat = Heartbeat(RunPaths(root).rank_heartbeat(identity.rank), identity.rank,
                          float(os.environ.get(STALL_ENV) or 300)).start()
    launch_id = int(os.environ[LAUNCH_ENV])
    try:
        # MPI first, owned by mpi4py: Horovod then uses it and may stop and start again.
        from mpi4py import MPI  # noqa: F401

        join_network(os.environ, identity.rank)
        plan = json.loads((root / "plan.json").read_text())
        launch = plan["launches"][launch_id]
        configs = {c["name"]: c for c in plan["configs"]}
        out = results_file(root, launch_id, identity.rank)
        results = {"rank": identity.rank, "size": identity.size, "host": socket.gethostname(),
                   "launch": launch_id, "round": launch["round"], "configs": [], "allreduce": None}
        for name in launch["configs"]:
            heartbeat.progress(phase=f"bench {name}")
            results["configs"].append(run_config(configs[name], root, identity, stop, heartbeat,
                                                 plan["warmup"], plan["steps"]))
            log.info("%s: %d steps in %.1f s", name, plan["steps"], results["configs"][-1]["seconds"])
            write_results(out, results)
        if launch.get("allreduce"):
            from hpc_train.bench.allreduce import measure

            heartbeat.progress(phase="bench allreduce")
            import torch

            device = torch.device("cuda", identity.local_rank % torch.cuda.device_count()) \
                if plan["gpu"] and torch.cuda.is_available() else torch.device("cpu")
            quiesce_horovod(keep=True)
            spec = plan["allreduce"]
            results["allreduce"] = measure(spec["model"], device, spec["repetitions"], spec["rounds"])
            write_results(out, results)
    except BaseException:
        log.exception("rank %d failed", identity.rank)
        raise
    finally:
        heartbeat.close()
    _shutdown()
    log.info("rank %d done", identity.rank)
    return 0


def _shutdown() -> None:
    """Leave the collectives together: every rank is done before any tears Gloo down."""
    import horovod.torch as hvd
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    if hvd.is_initialized():
        hvd.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
