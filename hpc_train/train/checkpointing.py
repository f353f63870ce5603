"""The trainer's side of checkpoints: resume at start, save when due, stop when asked.

All decisions are made at the same step on every rank: step-count rules need no talk, and the
rules that depend on a clock or a signal (every_minutes, deadline, USR2/TERM) are agreed with one
small all-reduce every AGREE_EVERY steps.

checkpoint.write: async (the default): at the step boundary the state is captured and copied to
host memory (`HostSnapshot`; pinned for GPU tensors), the temporary directory is made (one
barrier), and training goes on while a background thread serialises and renames
(`BackgroundWriter`, one write at a time). A stop for requeue and the end of training wait for
the write (at most launch.stall_seconds) and meet at a barrier, so no rank exits before rank 0
has written the marker. sync: the whole save blocks, as before. A sharded part (fsdp's model and
optimizer, torch.distributed.checkpoint) is written by every rank in the training thread right
after the temporary directory is made, in both modes: DCP's save is a collective, and no
collective may run in the background thread.
"""

from __future__ import annotations

import logging
import time
from functools import partial

import torch

from hpc_train import events, run_state
from hpc_train.checkpoint.manager import CheckpointManager
from hpc_train.checkpoint.snapshot import HostSnapshot
from hpc_train.checkpoint.writer import BackgroundWriter, guard_forks
from hpc_train.errors import CheckpointError, CheckpointMismatch
from hpc_train.launch.identity import RankInfo
from hpc_train.rundir import RunPaths
from hpc_train.runtime.faults import FaultInjector
from hpc_train.runtime.heartbeat import Phase
from hpc_train.runtime.stop import StopFlag, agreed_reason, one_hot, should_agree
from hpc_train.spec import spec_hash, spec_to_dict
from hpc_train.train import state
from hpc_train.train.parts import Collectives

log = logging.getLogger("hpc_train.checkpointing")


class StopForRequeue(Exception):
    """Raised after the stop checkpoint is saved; the worker exits with STOP_EXIT."""


class Checkpointing:
    """Saves and restores `states` at the step of `progress`: which components go to which file
    is the mapping's, not this class's. The spec gives the checkpoint section, the bound on
    every wait and what a checkpoint is checked against at resume; the collectives agree."""

    def __init__(self, states: state.CheckpointedState, progress: state.Progress, spec,
                 paths: RunPaths, identity: RankInfo, collectives: Collectives, heartbeat,
                 stop: StopFlag | None = None):
        self.states, self.progress, self.paths, self.identity = states, progress, paths, identity
        self.collectives, self.heartbeat = collectives, heartbeat
        self.config = ckpt = spec.checkpoint
        self.manager = CheckpointManager(paths.checkpoints, identity.rank, identity.size,
                                         collectives.barrier, keep_last=ckpt.keep_last,
                                         keep_every=ckpt.keep_every)
        self.stop = stop or StopFlag.from_env()
        self.spec_dict, self.hash = spec_to_dict(spec), spec_hash(spec)
        self.faults = FaultInjector(identity.rank)
        self.last_saved_step: int | None = None
        self.last_save_time = time.monotonic()
        self.asynchronous = ckpt.write == "async"
        # Every wait for a write is bounded by the watchdog's limit: past it, the driver would
        # take the rank for stalled anyway.
        self.writer = BackgroundWriter(timeout=spec.launch.stall_limit)
        self.snapshot = HostSnapshot()
        if self.asynchronous:
            guard_forks(self.writer)

    def resume(self) -> bool:
        """Load the newest complete checkpoint that loads on every rank, if any.

        A checkpoint that is complete but does not load (damaged on disk since, refused by
        weights_only) is skipped, with an event saying why, and the one before it is tried: all
        ranks skip together (one agreed flag), so all resume from the same step. A changed spec
        is not skipped over (every checkpoint has the same spec): it stops the resume.
        """
        skipped: list[int] = []
        for step in reversed(self.manager.complete_steps()):
            error = self._agreed(self._try_restore(step))
            if error is None:
                self._resumed(step, skipped)
                return True
            skipped.append(step)
            log.warning("checkpoint step %d does not load, trying an older one: %s", step, error)
            if self.identity.is_main:
                aside = self.manager.set_aside(step)
                events.try_record(self.paths, events.checkpoint_skipped(step, error, str(aside)))
        if skipped:
            raise CheckpointError(f"none of the complete checkpoints under {self.manager.root} "
                                  f"loads (steps {', '.join(map(str, skipped))}; reasons in this "
                                  "rank's log and the checkpoint_skipped events); move them "
                                  "aside to start afresh")
        return False

    def _try_restore(self, step: int) -> str | None:
        """Load and restore `step` on this rank: None, or why it failed."""
        try:
            replicated, per_rank, meta = self.manager.load(step)
            saved = meta.get("spec_hash")     # a change `resume --allow-spec-change` consented to
            allowed = saved == self.hash or run_state.read(self.paths).allows(saved, self.hash)
            self._changed = state.check_spec(replicated["spec"], self.spec_dict, allowed=allowed)
            self._saved_world_size = meta.get("world_size")
            if "samples" not in replicated["progress"] and self._saved_world_size != self.identity.size:
                raise CheckpointMismatch(
                    f"checkpoint step {step} counts steps, not samples (made before progress was "
                    f"counted in samples): it resumes only on its own {self._saved_world_size} "
                    f"ranks, not {self.identity.size}. Fix: resume with the world size it was saved with")
            self.states.load(replicated, per_rank, lambda name: self.manager.load_file(step, name),
                             self.manager.sharded_part(step), meta.get("sharded"))
        except CheckpointMismatch:
            raise
        except CheckpointError as exc:
            return str(exc)
        except (KeyError, RuntimeError, ValueError) as exc:  # a state that does not fit the model
            return f"{type(exc).__name__}: {exc}"
        return None

    def _agreed(self, error: str | None) -> str | None:
        """This rank's error, or another rank's failure: every rank moves on together."""
        failed = self.collectives.allreduce_sum(torch.tensor([1.0 if error else 0.0]))
        if error is None and failed.item() > 0:
            return "it does not load on another rank (see that rank's log)"
        return error

    def _resumed(self, step: int, skipped: list[int]) -> None:
        progress = self.progress
        self.last_saved_step = progress.step
        if self.identity.is_main:
            events.try_record(self.paths, events.resumed(
                progress.step, step, self._changed, self._saved_world_size, skipped,
                epoch=progress.epoch, consumed=progress.consumed, samples=progress.samples,
                saved_samples_per_step=progress.loaded.get("samples_per_step"),
                samples_per_step=progress.samples_per_step))
        log.info("resumed from step %d (epoch %d, sample %d of its order)%s", progress.step,
                 progress.epoch, progress.consumed,
                 f" (skipped unloadable checkpoints {skipped})" if skipped else "")

    def save(self, reason: str) -> None:
        """Save this step; returns once training may change the state again (async: after
        the host copy, while the write goes on in the background)."""
        step = self.progress.step
        if step == self.last_saved_step:
            return
        started = time.perf_counter()
        self.heartbeat.progress(phase=Phase.CHECKPOINT)
        self.writer.wait()                  # at most one write in flight; raises a failed one
        replicated, per_rank, files = self.states.capture()
        replicated["spec"] = self.spec_dict      # checked against the job's at resume
        per_rank["rank"] = self.identity.rank
        meta = {"spec_hash": self.hash, "reason": reason}
        position = self.progress.state_dict()
        midway = partial(self.faults.in_sharded_save, step)    # a test fault's hook (kill_in_save)
        sharded = partial(self.states.save_sharded, midway=midway) if self.states.writes_sharded else None
        if sharded:
            meta["sharded"] = self.states.writes_sharded     # which library's shards, at resume
        if self.asynchronous:
            replicated, per_rank, files = self.snapshot.take((replicated, per_rank, files))
            self.manager.prepare(step)
            if sharded:      # here, in the training thread: the shards' save is a collective
                self.manager.write_sharded(step, sharded)
            blocked = time.perf_counter() - started
            self.writer.submit(lambda: self._write(step, reason, replicated, per_rank, files,
                                                   meta, started, blocked, position))
        else:
            path = self.manager.save(step, replicated, per_rank, meta, files, sharded=sharded)
            self._saved(step, reason, path, started, time.perf_counter() - started, position)
        self.last_saved_step, self.last_save_time = step, time.monotonic()
        self.heartbeat.progress(phase=Phase.SAVED)

    def _write(self, step, reason, replicated, per_rank, files, meta, started, blocked,
               position) -> None:
        """The background part: no collective here (those belong to the training thread)."""
        rank0 = self.identity.rank == 0

        def peers_done() -> None:
            self.faults.during_write(step)
            if rank0:
                self.manager.wait_for_rank_files(step, self.writer.timeout)

        path = self.manager.write(step, replicated, per_rank, meta, files, peers_done=peers_done)
        if rank0:
            self._saved(step, reason, path, started, blocked, position)

    def _saved(self, step: int, reason: str, path, started: float, blocked: float,
               position: dict) -> None:
        """Rank 0 records the save, and its position in the run state (what `resume` tells a
        change of world size by, and keeps the global batch of)."""
        if self.identity.is_main:
            events.try_record(self.paths, events.checkpoint_saved(
                step, reason, str(path), round(time.perf_counter() - started, 3),
                blocked_seconds=round(blocked, 3), mode="async" if self.asynchronous else "sync",
                samples=position["samples"]))
            try:
                run_state.update(self.paths, lambda state: state.with_last_save(position))
            except OSError as exc:      # the checkpoint is complete; only the record is missing
                log.warning("could not record the save in the run state: %s", exc)

    def finish_writes(self) -> None:
        """Wait for the pending write (bounded), then meet: when this returns on any rank, the
        last checkpoint is complete (rank 0 wrote its marker before reaching the barrier)."""
        if self.asynchronous:
            self.heartbeat.progress(phase=Phase.CHECKPOINT)
            self.writer.wait()
            self.collectives.barrier()

    def _agree(self) -> tuple[str | None, bool]:
        """(stop reason, time-based save due), the same on every rank."""
        minutes = self.config.every_minutes
        due = minutes is not None and time.monotonic() - self.last_save_time >= 60 * minutes
        self.heartbeat.progress(phase=Phase.SYNC)
        local = one_hot(self.stop.local_code()) + [1.0 if due and self.identity.is_main else 0.0]
        summed = self.collectives.allreduce_sum(torch.tensor(local)).tolist()
        return agreed_reason(summed[:-1]), summed[-1] > 0

    def after_step(self, epoch_end: bool) -> None:
        """Save if due; on an agreed stop, save and raise StopForRequeue."""
        step = self.progress.step
        self.writer.raise_if_failed()       # a background write that failed fails the rank now
        stop_reason, time_due = self._agree() if should_agree(step) else (None, False)
        every = self.config.every_steps
        if stop_reason is None and (time_due or epoch_end or (every and step % every == 0)):
            self.save("epoch" if epoch_end else "periodic")
        if stop_reason is not None:
            self.save(f"stop: {stop_reason}")
            self.finish_writes()
            self.heartbeat.progress(phase=Phase.STOPPING)   # ending it now loses nothing
            if self.identity.is_main:
                events.try_record(self.paths, events.stop_saved(step, stop_reason))
            raise StopForRequeue(stop_reason)
