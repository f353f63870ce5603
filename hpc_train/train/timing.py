"""How time is measured: one stopwatch and the median of rounds for every benchmark, and where
a training step's time goes (named marks at the step's boundaries, read afterwards).

The stopwatch reads perf_counter(); on a GPU it first waits for the work queued on the device
(a kernel runs after the Python call that queued it returns), so a reading covers the work.

Training uses StepTimes: each mark reads perf_counter() (no wait for a GPU), and the medians of
the last steps go into the rank's heartbeat (for the straggler comparison). `bench train` gives
the trainer a StepClock: on a CPU a mark reads perf_counter(); on a GPU it records a CUDA event on
the current stream and nothing waits for it (the benchmark reads the times after the steps), so
a mark says when the GPU reached that point, not when Python queued the work. No mark
synchronises anything.

The marks of one step, in order (`breakdown` turns them into durations):

    start      before the batch is fetched
    data       the batch is on the device
    grads      DDP only: the last gradient bucket is ready and its reduction started
    backward   backward returned (DDP waits for its bucket reductions inside it)
    reduced    Horovod only: optimizer.synchronize() returned (gradients averaged)
    optimizer  the optimizer step and zero_grad are done
    end        the loop's own work after the step (logging, checkpoint agreement) is done

Exposed communication is the part of the gradient reduction not hidden behind backward: from
the last gradient to the averaged gradients (DDP: grads -> backward; Horovod: backward ->
reduced, since its reductions run in a background thread while backward computes).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Callable, Mapping

# No torch at import: the report (bench/train_report.py) reads PARTS and `breakdown` on hosts
# without it. The clock imports torch when it is used, inside a rank.
PARTS = ("data", "compute", "comm", "optimizer", "other")


def _no_wait() -> None:
    pass


class Stopwatch:
    """Seconds since it was started. Given a CUDA device, it waits for the device's queued
    work before it starts and before each reading: the time is the work's, not its queueing."""

    def __init__(self, device=None):
        self.wait = _no_wait
        if device is not None and device.type == "cuda":
            import torch

            self.wait = lambda: torch.cuda.synchronize(device)
        self.wait()
        self.started = time.perf_counter()

    def seconds(self) -> float:
        self.wait()
        return time.perf_counter() - self.started


def time_it(action: Callable[[], object], device=None) -> float:
    """Seconds one call of `action` takes (on `device`: until its queued work is done)."""
    watch = Stopwatch(device)
    action()
    return watch.seconds()


def repeat(action: Callable[[], object], times: int, device=None,
           before: Callable[[], object] = _no_wait) -> list[float]:
    """Seconds of each of `times` calls of `action`; `before` runs untimed ahead of each (a
    barrier, so that every rank starts the clock together)."""
    seconds = []
    for _ in range(times):
        before()
        seconds.append(time_it(action, device))
    return seconds


def medians(rounds: Mapping[str, list[float]]) -> dict[str, float]:
    """The median of each name's rounds: load that hits one round does not move the figure."""
    return {name: statistics.median(values) for name, values in rounds.items()}


class NullClock:
    """A clock whose every call does nothing."""

    def mark(self, name: str) -> None:
        pass

    def summary(self) -> dict | None:
        return None

    def after(self, function: Callable, name: str) -> Callable:
        return function

    def watch(self, model) -> None:
        pass


NO_CLOCK = NullClock()


class MarkingClock(NullClock):
    """A clock whose marks do something: `after` wraps a function to mark when it returns."""

    def after(self, function: Callable, name: str) -> Callable:
        """`function`, marking `name` when it returns (Horovod's synchronize)."""
        def timed(*args, **kwargs):
            result = function(*args, **kwargs)
            self.mark(name)
            return result
        return timed


STEP_WINDOW = 32         # steps whose medians StepTimes gives: a save or an evaluation moves none


def blocked_seconds(marks: Mapping[str, float]) -> float:
    """How long a step waited for the other ranks' gradients, as far as its marks tell (the
    collectives between steps are the heartbeat's phase sync: StepTimes adds them).

    Horovod: in optimizer.synchronize() (`backward` -> `reduced`; the loss read back after each
    backward has waited for a GPU's kernels, so `backward` is when they finished). DDP reduces
    inside backward, which cannot be split without a hook, so its forward/backward counts as
    blocked (the rank's own time is then its data wait and the loop's work: a lower bound). The
    pipeline marks nothing inside its step: 0."""
    if "reduced" in marks and "backward" in marks:
        return marks["reduced"] - marks["backward"]
    if "backward" in marks and "data" in marks:
        return marks["backward"] - marks["data"]
    return 0.0


class StepTimes(MarkingClock):
    """Training's clock: the marks of each step on perf_counter() (a few microseconds a step,
    nothing waits for a GPU), kept for the last STEP_WINDOW steps; `summary` gives their medians
    (read by the heartbeat's thread). synced: seconds spent so far in the collectives between
    steps (the logged loss, the stop agreement: the heartbeat's phase sync), blocked time too."""

    def __init__(self, synced: Callable[[], float] = lambda: 0.0, window: int = STEP_WINDOW):
        self.synced, self.synced_at_start = synced, 0.0
        self.marks: dict[str, float] = {}
        self.steps: deque[tuple[float, float, float]] = deque(maxlen=window)  # step, data, busy

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        if name == "start":
            synced = self.synced()
            if "start" in self.marks:    # the previous step ends where this one starts
                step = now - self.marks["start"]
                data = self.marks.get("data", self.marks["start"]) - self.marks["start"]
                blocked = blocked_seconds(self.marks) + synced - self.synced_at_start
                self.steps.append((step, data, step - blocked))
            self.marks, self.synced_at_start = {}, synced
        self.marks[name] = now

    def summary(self) -> dict | None:
        steps = tuple(self.steps)        # one C-level copy: the loop may append meanwhile
        if not steps:
            return None
        step, data, busy = (round(statistics.median(column), 6) for column in zip(*steps))
        return {"step": step, "data": data, "busy": busy, "steps": len(steps)}


class StepClock(MarkingClock):
    """Marks of every step since the last `reset`, on the CPU clock or as CUDA events."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.steps: list[dict] = []

    def mark(self, name: str) -> None:
        if name == "start":
            self.steps.append({})
        elif not self.steps:
            return
        if self.cuda:
            import torch

            stamp = torch.cuda.Event(enable_timing=True)
            stamp.record()
        else:
            stamp = time.perf_counter()
        self.steps[-1][name] = stamp

    def watch(self, model) -> None:
        """On a DDP model, mark `grads` as each gradient bucket's reduction starts (the last
        bucket's mark stands): DDP's own allreduce, through a comm hook that only adds the mark."""
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(model, DistributedDataParallel):
            return
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def marked_allreduce(state, bucket):
            self.mark("grads")
            return allreduce_hook(state, bucket)

        model.register_comm_hook(None, marked_allreduce)

    def reset(self) -> None:
        self.steps = []

    def seconds(self) -> list[dict[str, float]]:
        """Each complete step's marks as seconds since its start (waits for the GPU once)."""
        complete = [step for step in self.steps if "start" in step and "end" in step]
        if not self.cuda:
            return [{name: stamp - step["start"] for name, stamp in step.items()}
                    for step in complete]
        import torch

        torch.cuda.synchronize()
        return [{name: step["start"].elapsed_time(stamp) / 1000.0 for name, stamp in step.items()}
                for step in complete]


def breakdown(marks: dict[str, float]) -> dict[str, float]:
    """One step's durations from its marks (seconds since start): step = data + compute + comm +
    optimizer + other. A mark a backend does not make takes its neighbour's time (no `grads`:
    backward; no `reduced`: backward; no `optimizer`: end), so its part is zero."""
    data = marks.get("data", 0.0)
    backward = marks.get("backward", data)
    grads = min(max(marks.get("grads", backward), data), backward)
    reduced = max(marks.get("reduced", backward), backward)
    end = marks["end"]
    optimizer = min(max(marks.get("optimizer", end), reduced), end)
    return {"step": end, "data": data, "compute": grads - data, "comm": reduced - grads,
            "optimizer": optimizer - reduced, "other": end - optimizer}
