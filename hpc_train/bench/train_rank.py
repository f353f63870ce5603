"""One rank of `bench train` (`python -m hpc_train.bench.train_rank BENCH_DIR`), started by the
driver's launch plan exactly as a job's ranks are (mpirun or srun, the same environment).

It sets itself up as a job's worker does (its own log, heartbeat, network, stop flag), then runs
every configuration of its launch (BENCH_DIR/plan.json, the launch named by LAUNCH_ENV) in the
launch's order: the real Trainer built from that configuration's spec (configs/<name>/spec.yaml),
or the bare loop; `warmup` steps, then `steps` timed steps, each broken down by the StepClock.
A trainer and its bare baseline run as a pair, their timed steps interleaved in chunks. A
trainer's last warm-up step takes the split of the state the rank holds (bench/state_memory.py),
and its timed steps count their collectives (bench/wire.py).
What the rank itself ran (backend, precision, compression, world size, device, Horovod's
variables) is recorded beside the times. After the configurations of a launch of several
ranks, the allreduce ratio (bench/allreduce.py). Results: results/launch-N/rank-K.json,
rewritten after each configuration.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import resource
import socket
import sys
from pathlib import Path

from hpc_train.rundir import write_atomic
from hpc_train.train.timing import StepClock, Stopwatch, breakdown

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
    hvd = horovod()
    if hvd is not None and not keep and hvd.is_initialized():
        hvd.shutdown()


def horovod():
    """horovod.torch, or None where it is not installed (a DDP-only site)."""
    try:
        import horovod.torch as hvd
    except ImportError:
        return None
    return hvd


def _recorded(run, backend: str, precision: str, compression: str, accumulation: int,
              samples_per_step: int) -> dict:
    """What a configuration ran on this rank, recorded beside its times."""
    from hpc_train.launch.horovod import read_knobs

    return {"backend": backend, "precision": precision, "compression": compression,
            "accumulation": accumulation, "world_size": run.identity.size, "device": str(run.device),
            "samples_per_step": samples_per_step, "data": run.spec.data.kind,
            "horovod_env": read_knobs(os.environ) if backend == "horovod" else {}}


class TrainerRun:
    """A configuration of the real Trainer, stepped on request (`steps(n)`). Its parts' steps
    count their collectives (bench/wire.py); `state_step` takes the memory split of its state
    (bench/state_memory.py) in one step."""

    def __init__(self, spec, paths, identity, stop, heartbeat, clock, planned: int, backend: str):
        from hpc_train.bench.wire import CollectiveCounter
        from hpc_train.errors import HpcTrainError
        from hpc_train.train.trainer import Trainer

        self.spec, self.identity, self.clock, self.bench_backend = spec, identity, clock, backend
        self.trainer = Trainer(spec, paths, identity, stop, heartbeat, clock=clock)
        self.device = self.trainer.device
        if planned >= self.trainer.steps_per_epoch:
            self.close()
            raise HpcTrainError(f"{paths.root.name}: {self.trainer.steps_per_epoch} steps per epoch, "
                                f"not more than the {planned} steps to run: an epoch end would evaluate "
                                "and checkpoint among the timed steps; lower --warmup and --steps")
        if self.spec.parallel.compression == "none":   # else DDP has its compression's hook
            clock.watch(self.trainer.model)
        self.counter, parts = CollectiveCounter(), self.trainer.parts
        parts.train_step = self.counter.counting(parts.train_step)
        self.state: dict | None = None

    def steps(self, count: int) -> None:
        self.trainer.train_steps(count)

    def state_step(self) -> None:
        """One step, taking the split of the state this rank holds at its optimizer step."""
        from hpc_train.bench.state_memory import at_optimizer_step, state_of

        with at_optimizer_step(lambda: state_of(self.bench_backend, self.trainer.parts)) as taken:
            self.steps(1)
        self.state = taken[0].as_dict() if taken else None

    def reset(self) -> None:
        """Start the timed steps: their marks and collectives only."""
        self.clock.reset()
        self.counter.reset()

    def wire(self) -> dict:
        """Bytes per step of the timed steps' collectives: measured, and Horovod's computed."""
        import torch

        from hpc_train.bench import wire

        ranks, counter = self.identity.size, self.counter
        ops = {f"measured {op}": entry
               for op, entry in wire.per_step(counter.calls, counter.steps, ranks, "measured").items()}
        if self.bench_backend == "horovod":
            params = [p for p in self.trainer.parts.model.parameters() if p.requires_grad]
            gradient_bytes = sum(p.numel() * p.element_size() for p in params)
            fp32 = all(p.dtype == torch.float32 for p in params)
            computed = wire.horovod_gradients(gradient_bytes, fp32, self.spec.parallel.compression)
            ops.update({f"computed {op}": entry
                        for op, entry in wire.per_step(computed, 1, ranks, "computed").items()})
        return wire.summary(ops)

    def recorded(self) -> dict:
        # What the parts ran where they say (a data-parallel backend), else what the spec set.
        backend, spec = self.trainer.backend, self.spec
        return {**_recorded(self, getattr(backend, "name", spec.parallel.backend),
                            getattr(self.trainer.precision, "mode", spec.precision.mode),
                            getattr(backend, "compression", spec.parallel.compression),
                            spec.parallel.accumulation, spec.samples_per_step),
                "bench_backend": self.bench_backend}

    def measured(self) -> dict:
        return {"state_bytes": self.state, "wire": self.wire()}

    def close(self) -> None:
        self.trainer.close()


class BareRun:
    """A configuration of the bare loop (bench/bare_loop.py) on the spec's synthetic images, or
    on its own training data where no images stand in for it (tokens: bench/train_plan.py)."""

    def __init__(self, spec, identity, clock, compression: str):
        from hpc_train.bench.bare_loop import BareLoop, plain_loader
        from hpc_train.data.synthetic import SyntheticImages
        from hpc_train.train.data import train_dataset
        from hpc_train.train.trainer import pick_device

        self.spec, self.identity, self.clock = spec, identity, clock
        self.device = pick_device(spec, identity)
        if spec.data.kind == "synthetic":
            data = SyntheticImages(spec.data.train_samples, spec.data.num_classes, spec.data.image_size,
                                   seed=spec.run.seed)
        else:
            data = train_dataset(spec)
        self.loop = BareLoop(spec, identity, self.device, plain_loader(spec, identity, self.device, data),
                             compression=compression, clock=clock)

    def steps(self, count: int) -> None:
        self.loop.steps(count)

    def state_step(self) -> None:
        self.steps(1)

    def reset(self) -> None:
        self.clock.reset()

    def measured(self) -> dict:
        return {"state_bytes": None, "wire": None}

    def recorded(self) -> dict:
        loop = self.loop
        return _recorded(self, loop.backend, loop.precision, loop.compression, 1,
                         self.spec.data.batch_size * self.identity.size)

    def close(self) -> None:
        self.loop.close()


class Bench:
    """What every configuration of a launch shares: the bench directory, this rank, its stop
    flag and heartbeat, the step counts."""

    def __init__(self, root: Path, identity, stop, heartbeat, plan: dict):
        self.root, self.identity, self.stop, self.heartbeat = root, identity, stop, heartbeat
        self.configs = {c["name"]: c for c in plan["configs"]}
        self.warmup, self.steps, self.chunk = plan["warmup"], plan["steps"], plan["chunk"]
        self.device = _device_of(plan["gpu"], identity)

    def build(self, name: str):
        from hpc_train.rundir import RunPaths
        from hpc_train.spec import load_spec
        from hpc_train.train.trainer import pick_device

        from hpc_train.usercode import add_to_path

        config = self.configs[name]
        paths = RunPaths(self.root / "configs" / name)
        spec = load_spec(paths.spec)
        add_to_path(spec.run.code)      # a user's model and data: importable as on a job's rank
        quiesce_horovod(keep=config["backend"] == "horovod")
        clock = StepClock(pick_device(spec, self.identity))
        if config["kind"] == "trainer":
            return TrainerRun(spec, paths, self.identity, self.stop, self.heartbeat, clock,
                              self.warmup + self.steps, config["backend"])
        return BareRun(spec, self.identity, clock, config["compression"])

    def warm(self, name: str) -> tuple:
        """Build and warm up a configuration, the last warm-up step taking the split of its
        state; (the run, its peak memory, the peak's source)."""
        source = reset_peak_memory(self.device)
        run = self.build(name)
        run.steps(self.warmup - 1)
        run.state_step()
        return run, peak_memory(run.device), source

    def result(self, name: str, run, memory: int, source: str, watch) -> dict:
        return {"name": name, "recorded": run.recorded(),
                "steps": [breakdown(marks) for marks in run.clock.seconds()],
                "peak_memory_bytes": memory, "peak_memory_source": source, **run.measured(),
                "seconds": round(watch.seconds(), 3)}

    def solo(self, name: str) -> list[dict]:
        watch = Stopwatch()
        run, memory, source = self.warm(name)
        try:
            run.reset()
            run.steps(self.steps)
            return [self.result(name, run, memory, source, watch)]
        finally:
            run.close()
            _release(run.device)

    def pair(self, trainer_name: str, bare_name: str) -> list[dict]:
        """The trainer and its bare baseline, their timed steps interleaved in chunks (order
        swapped every chunk). Each one's peak memory is taken while it runs alone: the bare loop
        first (then rebuilt), so neither's figure holds the other's model."""
        watch = Stopwatch()
        bare, bare_memory, source = self.warm(bare_name)
        bare.close()
        del bare
        _release(self.device)
        trainer, trainer_memory, _ = self.warm(trainer_name)
        bare = self.build(bare_name)
        try:
            bare.steps(self.warmup)
            trainer.reset()
            bare.reset()
            done, swap = 0, False
            while done < self.steps:
                count = min(self.chunk, self.steps - done)
                for run in (bare, trainer) if swap else (trainer, bare):
                    run.steps(count)
                done, swap = done + count, not swap
            return [self.result(trainer_name, trainer, trainer_memory, source, watch),
                    self.result(bare_name, bare, bare_memory, source, watch)]
        finally:
            trainer.close()
            bare.close()
            _release(trainer.device)


def _device_of(gpu: bool, identity):
    import torch

    return torch.device("cuda", identity.local_rank % torch.cuda.device_count()) \
        if gpu and torch.cuda.is_available() else torch.device("cpu")


def _release(device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def write_results(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(results).encode())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hpc_train.bench.train_rank BENCH_DIR", file=sys.stderr)
        return 2
    from hpc_train.job.worker import join_network, start_heartbeat, start_rank
    from hpc_train.launch.identity import rank_from_env
    from hpc_train.rundir import RunPaths
    from hpc_train.runtime.heartbeat import Phase

    root = Path(args[0])
    identity = rank_from_env(os.environ)
    stop = start_rank(RunPaths(root), identity.rank)
    heartbeat = start_heartbeat(RunPaths(root), identity.rank)
    launch_id = int(os.environ[LAUNCH_ENV])
    try:
        # MPI first, owned by mpi4py: Horovod then uses it and may stop and start again.
        from mpi4py import MPI  # noqa: F401

        join_network(os.environ, identity.rank)
        plan = json.loads((root / "plan.json").read_text())
        launch = plan["launches"][launch_id]
        bench = Bench(root, identity, stop, heartbeat, plan)
        out = results_file(root, launch_id, identity.rank)
        results = {"rank": identity.rank, "size": identity.size, "host": socket.gethostname(),
                   "launch": launch_id, "round": launch["round"], "configs": [], "allreduce": None}
        for unit in launch["units"]:
            heartbeat.progress(phase=Phase.BENCH)
            done = bench.pair(*unit) if len(unit) == 2 else bench.solo(*unit)
            results["configs"] += done
            log.info("%s: %d steps in %.1f s", " + ".join(unit), plan["steps"], done[-1]["seconds"])
            write_results(out, results)
        if launch.get("allreduce"):
            from hpc_train.bench.allreduce import measure

            heartbeat.progress(phase=Phase.BENCH)
            device = _device_of(plan["gpu"], identity)
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
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    quiesce_horovod(keep=False)


if __name__ == "__main__":
    raise SystemExit(main())
