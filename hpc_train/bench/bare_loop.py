"""The baseline of `bench train`: a bare PyTorch loop of the spec's model, batch, precision and
backend, with none of the trainer's work around the step (no logging, checkpoint agreement,
heartbeats, LR schedule or fault hooks, no loss read back to the host every step).

It is the loop of the Horovod and PyTorch examples: a DataLoader over the same synthetic images
(or, for token models, the spec's own data; same workers and batch), the job's task's loss,
autocast, GradScaler, and the backend's gradient averaging (DDP, or
Horovod's DistributedOptimizer with an explicit synchronize, Horovod's AMP recipe). The same
StepClock marks as the trainer's give it the same breakdown. The GPU protocol (`bench gpu`)
runs it too, with channels_last and from HDF5 shards.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.data import DataLoader, DistributedSampler

from hpc_train.launch.identity import RankInfo
from hpc_train.parallel.data_parallel import init_torch_distributed
from hpc_train.train.data import shutdown_workers
from hpc_train.train.optim import build_optimizer
from hpc_train.train.sharded_model import build_job_model
from hpc_train.train.task import task_for
from hpc_train.train.timing import NO_CLOCK

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def plain_loader(spec, identity: RankInfo, device: torch.device, dataset) -> DataLoader:
    """A plain PyTorch DataLoader over `dataset` with the spec's batch, workers, pinning and
    start method, each rank reading its own part (DistributedSampler)."""
    workers = spec.data.workers
    return DataLoader(
        dataset, batch_size=spec.data.batch_size, drop_last=True, num_workers=workers,
        sampler=DistributedSampler(dataset, identity.size, identity.rank, shuffle=False),
        pin_memory=spec.data.pin_memory and device.type == "cuda",
        persistent_workers=workers > 0, multiprocessing_context=spec.data.start_method if workers else None)


class RepeatedBatch:
    """One random batch made on the device, yielded forever: synthetic data that costs nothing
    (the GPU protocol's compute ceiling, as NVIDIA's synthetic benchmarks have it)."""

    def __init__(self, batch: int, classes: int, size: int, device: torch.device):
        generator = torch.Generator(device=device).manual_seed(0)
        self.images = torch.randn(batch, 3, size, size, device=device, generator=generator)
        self.labels = torch.randint(classes, (batch,), device=device, generator=generator)

    def __iter__(self):
        while True:
            yield self.images, self.labels


class BareLoop:
    def __init__(self, spec, identity: RankInfo, device: torch.device, batches, *,
                 compression: str = "none", channels_last: bool = False, normalize=None,
                 clock=NO_CLOCK):
        """`batches`: an iterable of (images, labels), iterated again at its end (a DataLoader,
        or a RepeatedBatch); `normalize`: applied to each batch on the device (uint8 batches
        from a shard loader), or None."""
        self.device, self.clock, self.normalize = device, clock, normalize
        self.precision, self.backend = spec.precision.mode, spec.parallel.backend
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        torch.set_num_threads(spec.slurm.cpus_per_task)   # as the Trainer does
        torch.manual_seed(spec.run.seed)
        model = build_job_model(spec)       # as the trainer builds it: ours, or the user's
        model = model.to(device, memory_format=self.memory_format)
        optimizer = build_optimizer(spec.optim, model.parameters(), lr=spec.scaled_lr)
        if self.backend == "horovod":
            import horovod.torch as hvd

            hvd.init()
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            optimizer = hvd.DistributedOptimizer(
                optimizer, named_parameters=model.named_parameters(), op=hvd.Average,
                compression=hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none)
        else:
            from torch.nn.parallel import DistributedDataParallel

            init_torch_distributed(identity.rank, identity.size, device)
            model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        self.model, self.optimizer = model, optimizer
        self.compression = compression if self.backend == "horovod" else "none"
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.precision == "fp16")
        # The job's task's loss, as the trainer's: cross-entropy on classes for an image model,
        # on next tokens for a causal LM, or the user's own step (train/task.py).
        self.task = task_for(spec, device)
        self.grad_clip = spec.optim.grad_clip     # the same update as the trainer's
        self.loader, self.batches = batches, None
        clock.watch(model)

    def _next(self):
        if self.batches is not None:
            batch = next(self.batches, None)
            if batch is not None:
                return batch
        self.batches = iter(self.loader)   # the first step, or a new epoch
        return next(self.batches)

    def steps(self, count: int) -> None:
        """`count` optimizer steps; with a StepClock, each marked as the trainer's are. Each call
        starts a new pass over the loader, as each of the trainer's `train_steps` calls does (its
        persistent workers restart from the sampler's position), so that `bench train`'s
        interleaved chunks cost both loops alike."""
        clock, device = self.clock, self.device
        self.batches = None
        self.model.train()
        for _ in range(count):
            clock.mark("start")
            images, labels = self._next()
            images = images.to(device, non_blocking=True)
            if self.normalize is not None:
                images = self.normalize(images)
            images = images.contiguous(memory_format=self.memory_format)
            labels = labels.to(device, non_blocking=True)
            clock.mark("data")
            with torch.autocast(device.type, dtype=DTYPES.get(self.precision, torch.float32),
                                enabled=self.precision in DTYPES):
                loss = self.task.loss(self.model, images, labels)
            self.scaler.scale(loss).backward()
            clock.mark("backward")
            skip = contextlib.nullcontext()
            if self.backend == "horovod":
                self.optimizer.synchronize()
                clock.mark("reduced")
                skip = self.optimizer.skip_synchronize()
            if self.grad_clip:
                self.scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
            with skip:
                self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad()  # set_to_none by default; Horovod's wrapper takes no arguments
            clock.mark("optimizer")
            clock.mark("end")

    def close(self) -> None:
        """Stop the loader's workers now (as Trainer.close does)."""
        shutdown_workers(self.loader)
        self.batches = None
