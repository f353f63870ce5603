"""The trainer's side of checkpoints: resume at start, save when due, stop when asked.

All decisions are made at the same step on every rank: step-count rules need no talk, and the
rules that depend on a clock or a signal (every_minutes, deadline, USR2/TERM) are agreed with one
small all-reduce every AGREE_EVERY steps.
"""

from __future__ import annotations

import logging
import time

import torch

from hpc_train.checkpoint.manager import CheckpointManager
from hpc_train.rundir import read_jsonl, record_event
from hpc_train.runtime.stop import StopFlag, agreed_reason, one_hot, should_agree
from hpc_train.spec import spec_hash
from hpc_train.train import state

log = logging.getLogger("hpc_train.checkpointing")


class StopForRequeue(Exception):
    """Raised after the stop checkpoint is saved; the worker exits with STOP_EXIT."""


class Checkpointing:
    def __init__(self, trainer, stop: StopFlag | None = None):
        self.trainer = trainer
        ckpt = trainer.spec.checkpoint
        self.config = ckpt
        self.manager = CheckpointManager(trainer.paths.checkpoints, trainer.identity.rank,
                                         trainer.identity.size, trainer.backend.barrier,
                                         keep_last=ckpt.keep_last, keep_every=ckpt.keep_every)
        self.stop = stop or StopFlag.from_env()
        self.hash = spec_hash(trainer.spec)
        self.last_saved_step: int | None = None
        self.last_save_time = time.monotonic()

    def _spec_change_allowed(self, saved_hash: str) -> bool:
        return any(e["event"] == "spec_change_allowed" and e.get("from_hash") == saved_hash
                   and e.get("to_hash") == self.hash for e in read_jsonl(self.trainer.paths.events))

    def resume(self) -> bool:
        """Load the latest complete checkpoint, if any. Every rank reads the same one."""
        if self.manager.latest() is None:
            return False
        replicated, per_rank, meta = self.manager.load()
        changed = state.check_spec(replicated["spec"], self.trainer.spec_dict,
                                   allowed=meta.get("spec_hash") == self.hash
                                   or self._spec_change_allowed(meta.get("spec_hash")))
        self.trainer.restore_state(replicated, per_rank,
                                   lambda name: self.manager.load_file(meta["step"], name))
        self.last_saved_step = self.trainer.step
        if self.trainer.identity.is_main:
            record_event(self.trainer.paths, "resumed", step=self.trainer.step,
                         from_checkpoint=meta["step"], spec_changed=changed,
                         saved_world_size=meta.get("world_size"))
        log.info("resumed from step %d", self.trainer.step)
        return True

    def save(self, reason: str) -> None:
        step = self.trainer.step
        if step == self.last_saved_step:
            return
        started = time.perf_counter()
        replicated, per_rank, files = self.trainer.capture_state()
        path = self.manager.save(step, replicated, per_rank, {"spec_hash": self.hash, "reason": reason},
                                 files)
        self.last_saved_step, self.last_save_time = step, time.monotonic()
        if self.trainer.identity.is_main:
            record_event(self.trainer.paths, "checkpoint_saved", step=step, reason=reason,
                         path=str(path), seconds=round(time.perf_counter() - started, 3))

    def _agree(self) -> tuple[str | None, bool]:
        """(stop reason, time-based save due), the same on every rank."""
        minutes = self.config.every_minutes
        due = minutes is not None and time.monotonic() - self.last_save_time >= 60 * minutes
        local = one_hot(self.stop.local_code()) + [1.0 if due and self.trainer.identity.is_main else 0.0]
        summed = self.trainer.backend.allreduce_sum(torch.tensor(local)).tolist()
        return agreed_reason(summed[:-1]), summed[-1] > 0

    def after_step(self, epoch_end: bool) -> None:
        """Save if due; on an agreed stop, save and raise StopForRequeue."""
        step = self.trainer.step
        stop_reason, time_due = self._agree() if should_agree(step) else (None, False)
        every = self.config.every_steps
        if stop_reason is None and (time_due or epoch_end or (every and step % every == 0)):
            self.save("epoch" if epoch_end else "periodic")
        if stop_reason is not None:
            self.save(f"stop: {stop_reason}")
            if self.trainer.identity.is_main:
                record_event(self.trainer.paths, "stop_saved", step=step, reason=stop_reason)
            raise StopForRequeue(stop_reason)
