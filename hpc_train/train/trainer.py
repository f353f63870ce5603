"""The training loop of one rank: epochs of optimizer steps, logging, evaluation.

Collectives happen at the same steps on every rank (gradient reduction, the loss average at
log steps, evaluation at epoch ends), since every rank runs the same number of steps.

Progress is counted in samples (`Progress`: the epoch and the samples of its order trained);
steps follow from the global batch of this segment (`JobSpec.samples_per_step`), so a run
resumed on another number of ranks goes on with the rest of the interrupted epoch and its LR
(`train/schedule.py`), and its total steps are derived anew. A sample is what the sampler
orders: an image, or a token sequence of data.seq_len tokens for text (tokens are sequences x
seq_len, since seq_len is fixed for the run; the position must index the order exactly).
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import sys
import time

import torch

from hpc_train.checkpoint.sharded import ShardedModelState
from hpc_train.models import build_model
from hpc_train.parallel.data_parallel import make_backend
from hpc_train.parallel.fsdp import full_parameters
from hpc_train.parallel.layout import Parallelism, ParallelLayout
from hpc_train import events
from hpc_train.checkpoint.layout import step_dir_name
from hpc_train.rundir import RunPaths, append_jsonl
from hpc_train.runtime.faults import FaultInjector
from hpc_train.runtime.heartbeat import NoHeartbeat, Phase
from hpc_train.launch.identity import RankInfo
from hpc_train.runtime.stop import StopFlag
from hpc_train.spec import dump_spec_yaml, spec_to_dict
from hpc_train.spec.schema import TOKEN_KINDS, TaskKind
from hpc_train.train.ledger import SampleLedger
from hpc_train.train.state import (CheckpointedState, ModelBuffers, ModelWeights, Progress,
                                   RngStreams, unwrap)
from hpc_train.train.checkpointing import Checkpointing
from hpc_train.train.data import (DeviceInputs, build_loaders, dump_worker_stacks, normalizes_on_device,
                                  shutdown_workers, start_worker_server, worker_pids)
from hpc_train.train.meters import Window
from hpc_train.train.optim import build_optimizer
from hpc_train.train.parts import PartsFactory
from hpc_train.train.precision import Precision
from hpc_train.train.schedule import LrSchedule
from hpc_train.train.step import optimizer_step
from hpc_train.train.task import task_for
from hpc_train.train.trackers.tracker_set import TrackerSet
from hpc_train.train.timing import NO_CLOCK, StepTimes

log = logging.getLogger("hpc_train.trainer")


def pick_device(spec, identity: RankInfo) -> torch.device:
    if spec.uses_gpu and torch.cuda.is_available():
        device = torch.device("cuda", identity.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def parameters_digest(model: torch.nn.Module) -> str:
    """sha256 of every trainable parameter: equal digests mean bit-identical replicas.

    Buffers are left out on purpose: BatchNorm running statistics are per rank under Horovod
    (each rank normalises its own batches), while the weights must agree exactly. Sharded
    parameters are gathered whole (a collective: every rank digests at the same point).
    """
    digest = hashlib.sha256()
    for name, tensor in full_parameters(model):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class DataParallelParts:
    """The `TrainingParts` of a data-parallel job: the whole model on every rank, Horovod or DDP
    averaging gradients, mixed precision with a GradScaler."""

    def __init__(self, spec, paths: RunPaths, identity: RankInfo, device: torch.device):
        self.spec, self.device = spec, device
        self.backend = make_backend(spec.parallel.backend, identity, device)
        torch.manual_seed(spec.run.seed)  # the same initial weights everywhere, before broadcast
        model = build_model(spec.model.name, spec.data.num_classes, spec.model.options)
        model = model.to(device)
        optimizer = build_optimizer(spec.optim, model.parameters(), lr=spec.scaled_lr)
        self.model, self.optimizer = self.backend.prepare(
            model, optimizer, accumulation=spec.parallel.accumulation,
            compression=spec.parallel.compression, powersgd=spec.parallel.powersgd)
        self.precision = Precision(spec.precision.mode, device, spec.precision.loss_scale,
                                   spec.precision.init_scale)
        self.task = task_for(spec, device)

    def states(self) -> CheckpointedState:
        """This job's own checkpointed components (the trainer adds schedule, progress, sampler
        and RNG streams): weights and optimizer replicated, buffers per rank."""
        return CheckpointedState(
            replicated={"model": ModelWeights(self.model), "optimizer": self.optimizer,
                        "precision": self.precision},
            per_rank={"buffers": ModelBuffers(self.model), **self._compression_state()},
            # Reads an fsdp checkpoint's shards into the whole model (saved replicated).
            sharded=ShardedModelState(unwrap(self.model), self.optimizer, writes=False))

    def _compression_state(self) -> dict:
        """PowerSGD's residuals and factors (per rank), where the backend compresses with it."""
        state = self.backend.compression_state
        return {"compression": state} if state is not None else {}

    def train_step(self, micro_batches, clock=NO_CLOCK) -> tuple[float, bool]:
        """One optimizer step: (this rank's loss, whether the step was applied)."""
        return optimizer_step(self.model, self.optimizer, micro_batches, self.task.loss,
                              self.precision, self.backend, self.spec.optim.grad_clip, clock)

    def evaluate(self, val_batches, tick) -> torch.Tensor:
        """This rank's sums over its validation part (train/task.py); for classification
        `evaluate` RUN_DIR runs the same function, so it reproduces them."""
        return self.task.evaluate(self.model, val_batches, self.precision.autocast, tick)


# Each kind of job's parts, imported when a job of that kind starts: pipelining pulls in
# torch.distributed.pipelining and torch._dynamo (a second of CPU per rank start, on every
# horovod and ddp rank if imported here), FSDP DTensor, DeepSpeed deepspeed.
PARTS: dict[Parallelism, str] = {Parallelism.DATA_PARALLEL: "hpc_train.train.trainer:DataParallelParts",
                                 Parallelism.PIPELINE: "hpc_train.train.pipeline_trainer:PipelineParts",
                                 Parallelism.FSDP: "hpc_train.train.fsdp_parts:FsdpParts",
                                 Parallelism.DEEPSPEED: "hpc_train.train.deepspeed_parts:DeepSpeedParts"}


def parts_for(layout: ParallelLayout) -> PartsFactory:
    """The parts a layout's ranks are given: the only place a kind of job is chosen."""
    module, name = PARTS[layout.parallelism].split(":")
    return getattr(importlib.import_module(module), name)


def throughput(spec, steps: int, elapsed: float) -> dict[str, float]:
    """Samples per second, named by what a sample is: an image, or a token sequence (and tokens;
    a causal_lm dataset of the user's says its sequences' length itself, so sequences only)."""
    samples = spec.samples_per_step * steps / elapsed
    if spec.data.kind in TOKEN_KINDS:
        return {"samples_per_s": samples, "tokens_per_s": samples * spec.data.seq_len}
    if spec.task_kind is TaskKind.CAUSAL_LM:
        return {"samples_per_s": samples}
    return {"images_per_s": samples}


class Trainer:
    """The training loop of every job; the parts of its layout (`parts_for`, a `TrainingParts`)
    provide the model, its step, evaluation and their checkpoint components. data_root: a
    node-local copy of the shards to read instead of data.path. written: the run's spec when
    `spec` is its fitting to this start's nodes (spec/global_batch.fit_to_nodes): checkpoints
    record it and are checked against it, so a start on other nodes of the range is no change."""

    def __init__(self, spec, paths: RunPaths, identity: RankInfo, stop: StopFlag | None = None,
                 heartbeat=None, data_root=None, clock=None, written=None):
        self.spec, self.paths, self.identity = spec, paths, identity
        start_worker_server(spec)      # first: before the backend starts MPI and its threads
        self.heartbeat = heartbeat or NoHeartbeat()
        # Marks each step's parts: training's gives the heartbeat its medians (stragglers),
        # `bench train`'s breaks the steps down.
        self.clock = clock or StepTimes(lambda: self.heartbeat.synced_seconds)
        self.heartbeat.step_times = self.clock.summary
        self.faults = FaultInjector(identity.rank)
        self.device = pick_device(spec, identity)
        # Built once from spec + identity; every per-rank answer (stage, replica, data part) is its.
        self.place = spec.layout.of_rank(identity.rank)
        torch.set_num_threads(spec.slurm.cpus_per_task)
        self.parts = parts_for(spec.layout)(spec, paths, identity, self.device)
        self.backend, self.model = self.parts.backend, self.parts.model
        self.optimizer, self.precision = self.parts.optimizer, self.parts.precision
        # Per-rank streams for dropout and other model randomness; augmentation does not use
        # them: it is drawn per sample from (seed, epoch, index) (data/transforms.sample_rng).
        torch.manual_seed(spec.run.seed + identity.rank)
        pin = spec.data.pin_memory and self.device.type == "cuda"
        uint8 = normalizes_on_device(spec, self.device)
        self.inputs = DeviceInputs(self.device, normalize=uint8)
        self.train_loader, self.val_loader = build_loaders(spec, *self.place.data_part, pin, uint8,
                                                           root=data_root)
        self.heartbeat.after_dump = self._dump_worker_stacks
        self.sampler = self.train_loader.sampler
        self.epoch_samples = self.sampler.num_samples
        self.schedule = LrSchedule(
            peak_lr=spec.scaled_lr, epoch_samples=self.epoch_samples,
            warmup_epochs=spec.optim.warmup_epochs, total_epochs=spec.optim.epochs,
            schedule=spec.optim.schedule, milestones=tuple(spec.optim.step_milestones),
            gamma=spec.optim.step_gamma)
        self.progress = Progress(spec.samples_per_step, identity.size, self._position_of_step)
        self.ledger = SampleLedger(identity.rank, first=self.place.stage == 0)
        self.checkpoints = Checkpointing(self._checkpointed(), self.progress, written or spec,
                                         paths, identity, self.backend, self.heartbeat, stop)
        self.trackers: TrackerSet | None = None

    def _dump_worker_stacks(self) -> None:
        pids = worker_pids(self.train_loader, self.val_loader)
        if pids:
            print(f"hpc_train watchdog: data workers {', '.join(map(str, pids))} of rank "
                  f"{self.identity.rank} write their stacks below", file=sys.stderr, flush=True)
            dump_worker_stacks(pids)

    def _checkpointed(self) -> CheckpointedState:
        """The parts' components plus the loop's own: what a checkpoint saves, by name and file."""
        states = self.parts.states()
        states.replicated.update(progress=self.progress, sampler=self.sampler)
        states.per_rank = {"rng": RngStreams(self.spec.run.seed, self.identity.rank, self.progress),
                           **states.per_rank}
        return states

    @property
    def step(self) -> int:
        return self.progress.step

    @property
    def steps_per_epoch(self) -> int:
        """Steps of a whole epoch at this segment's global batch."""
        return self.sampler.steps_per_epoch

    @property
    def total_steps(self) -> int:
        """Steps done plus those left at this segment's global batch, to the end of the last
        epoch (or optim.max_steps, a cap on steps for tests)."""
        progress, epochs = self.progress, self.spec.optim.epochs
        left = 0 if progress.epoch >= epochs else (
            self.sampler.steps_left(progress.consumed)
            + (epochs - progress.epoch - 1) * self.steps_per_epoch)
        total = progress.step + left
        return min(total, self.spec.optim.max_steps or total)

    def _position_of_step(self, step: int) -> tuple[int, int, int]:
        """(epoch, consumed, samples) after `step` steps of this global batch: the position of a
        checkpoint from before samples were counted, which resumes at its own world size."""
        epoch, in_epoch = divmod(step, self.steps_per_epoch)
        return epoch, in_epoch * self.spec.samples_per_step, step * self.spec.samples_per_step

    def train_steps(self, count: int) -> None:
        """`count` more optimizer steps (fewer at total_steps), across epoch ends: fit()'s loop
        without its start and end (`bench train` calls it alone)."""
        until = min(self.step + count, self.total_steps)
        while self.step < until:
            self.train_epoch(until)

    def fit(self) -> None:
        """Train to total_steps, resuming from the latest checkpoint; raises StopForRequeue."""
        self.heartbeat.progress(phase=Phase.RESUMING)
        self.checkpoints.resume()
        self._open_trackers()
        if self.identity.is_main:
            # Every segment: a resume on other ranks derives other steps. The field keeps its
            # name `global_batch`: run directories are a file format.
            progress = self.progress
            events.try_record(self.paths, events.training_started(
                total_steps=self.total_steps, steps_per_epoch=self.steps_per_epoch,
                world_size=self.identity.size, global_batch=self.spec.samples_per_step,
                peak_lr=self.spec.scaled_lr, device=str(self.device), step=progress.step,
                epoch=progress.epoch, consumed=progress.consumed, samples=progress.samples,
                epoch_samples=self.epoch_samples))
        self.train_steps(self.total_steps - self.step)
        self.checkpoints.save("final")
        self.checkpoints.finish_writes()
        if self.trackers is not None:
            self.trackers.final_checkpoint(self.paths.checkpoints / step_dir_name(self.step))
        events.try_record(self.paths, events.rank_finished(
            self.identity.rank, self.step, parameters_digest(self.model), stage=self.place.stage,
            replica=self.place.replica))
        self.backend.shutdown()

    def _open_trackers(self) -> None:
        """Rank 0's experiment trackers, continuing the run's tracker runs (train/trackers)."""
        if self.identity.is_main and self.spec.log.chosen_trackers:
            self.trackers = TrackerSet.open(self.spec, self.paths, self.step + 1 if self.step else 0,
                                            spec_to_dict(self.spec), dump_spec_yaml(self.spec))

    def _write_metrics(self, record: dict) -> None:
        append_jsonl(self.paths.metrics, record)
        if self.trackers is not None:
            self.trackers.write(record)

    def close(self) -> None:
        """Stop the data workers now, on every way out of a rank (see `shutdown_workers`)."""
        for loader in (self.train_loader, self.val_loader):
            shutdown_workers(loader)
        if self.trackers is not None:
            self.trackers.close()

    def _micro_batches(self, batches):
        accumulation = self.spec.parallel.accumulation
        group = []
        for images, labels in batches:
            group.append(self.inputs(images, labels))
            if len(group) == accumulation:
                yield group
                group = []

    def train_epoch(self, until: int) -> None:
        """The rest of the current epoch from its position, up to step `until`: the sampler
        skips what was trained. At the epoch's end the position moves to the next epoch before
        the checkpoint, which then says where the next step starts."""
        progress = self.progress
        epoch = progress.epoch
        self.sampler.set_epoch(epoch, progress.consumed)
        steps_left = self.sampler.steps_left(progress.consumed)
        self.ledger.start(self.sampler)
        self.model.train()
        window = Window()
        steps = self._micro_batches(self.train_loader)
        for left in range(steps_left, 0, -1):
            if self.step >= until:
                return
            # The step this rank works on: a rank stuck between steps stays behind the others,
            # which wait for it inside the next one (the watchdog names it that way).
            self.heartbeat.progress(step=self.step + 1, phase=Phase.DATA)
            self.clock.mark("start")
            fetch_start = time.perf_counter()
            micro_batches = next(steps)
            data_seconds = time.perf_counter() - fetch_start
            self.clock.mark("data")
            self.heartbeat.progress(phase=Phase.TRAIN)
            reached = progress.position(self.epoch_samples) + progress.samples_per_step
            lr = self.schedule.apply(self.optimizer, reached)
            loss, applied = self.parts.train_step(micro_batches, self.clock)
            progress.advance()
            self.ledger.record(lr, reached, progress.samples_per_step)
            self.faults.at_step(self.step)
            window.add(loss, data_seconds, applied)
            if left == 1:
                progress.next_epoch()
            if self.step % self.spec.log.every_steps == 0 or self.step == self.total_steps:
                self._log(epoch, lr, window)
                window = Window()
            if left == 1 and self.val_loader is not None:
                self.evaluate(epoch)
            self.checkpoints.after_step(left == 1)
            self.clock.mark("end")
        if steps_left == 0:     # resumed at another global batch: the rest fills no step of it
            progress.next_epoch()

    def _log(self, epoch: int, lr: float, window: Window) -> None:
        # One small collective per logged step: the mean loss over the ranks that compute one.
        self.heartbeat.progress(phase=Phase.SYNC)
        # Then an own step's metric sums since the last log (none for ours: train/task.py).
        task = self.parts.task
        summed = self.backend.allreduce_sum(torch.cat([
            torch.tensor([window.loss_sum, float(window.loss_steps)]), task.take_metrics().float()]))
        elapsed = window.elapsed()
        if not self.identity.is_main:
            return
        rates = throughput(self.spec, window.steps, elapsed)
        record = {
            "time": time.time(), "step": self.step, "epoch": epoch, "samples": self.progress.samples,
            "loss": summed[0].item() / summed[1].item(), "lr": lr, **rates,
            "step_time": elapsed / window.steps, "data_time": window.data_seconds / window.steps,
            "loss_scale": self.precision.loss_scale, "skipped_steps": window.skipped,
            **task.metric_record(summed[2:]),
        }
        self._write_metrics(record)
        log.info("step %d/%d epoch %d loss %.4f lr %.4g %s", self.step, self.total_steps, epoch,
                 record["loss"], lr, " ".join(f"{v:.0f} {k.removesuffix('_per_s')}/s"
                                              for k, v in rates.items()))

    def evaluate(self, epoch: int) -> None:
        """Sum the ranks' sums of the parts' evaluation (loss sum, correct, count, ...: the
        task's); rank 0 writes the val line."""
        totals = self.parts.evaluate(self.inputs.batches(self.val_loader),
                                     lambda: self.heartbeat.progress(phase=Phase.EVALUATE))
        self.heartbeat.progress(phase=Phase.SYNC)
        totals = self.backend.allreduce_sum(totals)
        if self.identity.is_main and totals[2] > 0:
            figures = self.parts.task.val_record(totals)
            self._write_metrics({"time": time.time(), "step": self.step, "epoch": epoch,
                                 "split": "val", **figures})
            if self.parts.task.kind is TaskKind.CAUSAL_LM:
                figures = {("next-token accuracy" if k == "accuracy" else k): v for k, v in figures.items()}
            log.info("eval epoch %d %s", epoch, " ".join(f"{k} {v:.4g}" for k, v in figures.items()))
