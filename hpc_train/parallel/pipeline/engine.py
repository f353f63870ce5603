"""One rank's pipeline: its stage, the schedule, and the optimizer step of a K x D job.

Step = schedule.step (micro-batches through the stages, forward and backward, GPipe or 1F1B)
-> average the stage's gradients over its replica set -> unscale, and agree on the global
gradient norm and on overflow in one all-reduce -> clip -> optimizer step (or skip everywhere).
Stages are never wrapped in DDP: default DDP asserts under GPipe, and static_graph gives
silently wrong gradients; the explicit all-reduce after the schedule is both simpler and right.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from hpc_train.parallel.data_parallel import TorchCollectives
from hpc_train.parallel.pipeline.balance import balance_blocks, cut_problem, stage_bounds
from hpc_train.parallel.pipeline.groups import replica_average
from hpc_train.parallel.layout import ParallelLayout
from hpc_train.parallel.pipeline.scaler import AgreedLossScaler
from hpc_train.parallel.pipeline.stage import StageModule, parameter_costs, slice_blocks, time_blocks

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


@dataclass(frozen=True)
class PipelineConfig:
    stages: int
    microbatches: int
    schedule: str = "gpipe"
    balance: str | tuple[int, ...] = "auto"
    remat: bool = False
    backend: str = "ddp"           # replica averaging: "horovod" or "ddp" (torch.distributed)


def choose_sizes(full: nn.Sequential, config: PipelineConfig, example: torch.Tensor | None) -> list[int]:
    """Blocks per stage: given, by parameter count ("auto"), or by timing on rank 0 ("time").

    Timings differ between ranks, so rank 0 decides and broadcasts: every rank must cut alike.
    A cut that cannot be made (a user's model has fewer blocks than stages, a balance list of
    another sum) is a ValueError in one line, the same on every rank.
    """
    problem = cut_problem(len(full), config.stages, config.balance)
    if problem:
        raise ValueError(problem)
    if not isinstance(config.balance, str):
        return list(config.balance)
    if config.balance == "auto":
        return balance_blocks(parameter_costs(full), config.stages)
    sizes = torch.zeros(config.stages, dtype=torch.int64)
    if dist.get_rank() == 0:
        sizes = torch.tensor(balance_blocks(time_blocks(full, example), config.stages))
    dist.broadcast(sizes, src=0)
    return sizes.tolist()


class BusyClock:
    """Seconds this stage spends computing (forward + backward chunks): 1 - busy/step = bubble.

    Python-side time: right on CPUs. On a GPU kernels finish after the call returns; the
    benchmark wraps the chunks in synchronizes for that (bench/pipeline_rank.stage_clock),
    which training must not pay.
    """

    def __init__(self, stage: PipelineStage):
        self.seconds = 0.0
        for name in ("forward_one_chunk", "backward_one_chunk"):
            setattr(stage, name, self._timed(getattr(stage, name)))

    def _timed(self, method):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return run


class PipelineEngine:
    def __init__(self, full: nn.Sequential, layout: ParallelLayout, rank: int, device: torch.device,
                 config: PipelineConfig, loss_fn, scaler: AgreedLossScaler, precision: str = "fp32",
                 example: torch.Tensor | None = None):
        self.layout, self.rank, self.device, self.config = layout, rank, device, config
        self.stage_index, self.replica = layout.stage_of(rank), layout.replica_of(rank)
        self.collectives = TorchCollectives(device)
        pipe_groups = [dist.new_group(ranks) for ranks in layout.all_pipelines()]
        self.average = replica_average(config.backend, layout, self.stage_index)
        self.sizes = choose_sizes(full, config, example)
        self.bounds = stage_bounds(self.sizes)[self.stage_index]
        self.module = StageModule(slice_blocks(full, self.bounds), self.bounds[0], config.remat,
                                  precision, device.type).to(device)
        self.stage = PipelineStage(self.module, self.stage_index, layout.stages, device,
                                   group=pipe_groups[self.replica])
        self.clock = BusyClock(self.stage)
        self.scaler = scaler
        self._loss_fn = loss_fn
        schedule_class = SCHEDULES[config.schedule]
        self.schedule = schedule_class(self.stage, config.microbatches, loss_fn=self._scaled_loss)

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.layout.stages - 1

    def parameters(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def _scaled_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self._loss_fn(output, target) * self.scaler.scale

    def _run(self, inputs, targets, evaluate: bool) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """(per-micro-batch losses, merged outputs) on the last stage; ([], None) elsewhere."""
        losses: list[torch.Tensor] = []
        run = self.schedule.eval if evaluate else self.schedule.step
        args = (inputs.to(self.device),) if self.is_first else ()
        kwargs = {"target": targets.to(self.device), "losses": losses} if self.is_last else {}
        return losses, run(*args, **kwargs)

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        """Run the schedule; the mean unscaled loss on the last stage, None elsewhere."""
        self.module.train()
        losses, _ = self._run(inputs, targets, evaluate=False)
        if not self.is_last:
            return None
        return torch.stack(losses).float().mean().item() / self.scaler.scale

    def reduce_gradients(self) -> tuple[float, bool]:
        """Average over replicas, unscale; (global gradient norm, overflow anywhere)."""
        params = self.parameters()
        self.average([p.grad for p in params if p.grad is not None])
        local = self.scaler.unscale_and_measure(params)
        total = self.collectives.allreduce_sum(local)
        # Replicas hold identical gradients after averaging: the world sum counts each D times.
        squares, overflow = total[0].item() / self.layout.replicas, total[1].item() > 0
        return (float("inf") if overflow else squares ** 0.5), overflow

    def step(self, inputs, targets, optimizer: torch.optim.Optimizer,
             grad_clip: float | None = None) -> tuple[float | None, bool]:
        """One optimizer step over the whole per-replica batch; (loss or None, applied)."""
        optimizer.zero_grad()
        loss = self.forward_backward(inputs, targets)
        return loss, self.finish_step(optimizer, grad_clip)

    def finish_step(self, optimizer: torch.optim.Optimizer, grad_clip: float | None = None) -> bool:
        """Reduce, agree, clip, step (or skip on every rank); True if the step was applied."""
        norm, overflow = self.reduce_gradients()
        if not overflow:
            if grad_clip is not None and norm > grad_clip:
                factor = grad_clip / (norm + 1e-6)
                for p in self.parameters():
                    if p.grad is not None:
                        p.grad.mul_(factor)
            optimizer.step()
        self.scaler.update(overflow)
        return not overflow

    @torch.no_grad()
    def evaluate(self, inputs, targets) -> torch.Tensor | None:
        """Forward only; on the last stage (loss sum, correct tokens, tokens) as float64."""
        self.module.eval()
        losses, logits = self._run(inputs, targets, evaluate=True)
        if not self.is_last:
            return None
        tokens = targets.numel()
        correct = (logits.argmax(-1).cpu() == targets).sum().item()
        loss_sum = torch.stack(losses).float().mean().item() / self.scaler.scale * tokens
        return torch.tensor([loss_sum, correct, tokens], dtype=torch.float64)

    # The data-parallel backend's interface, so checkpoints and logging work unchanged.
    def allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.collectives.allreduce_sum(tensor)

    def barrier(self) -> None:
        self.collectives.barrier()

    def shutdown(self) -> None:
        shutdown = getattr(self.average, "shutdown", None)
        if shutdown:
            shutdown()
        self.collectives.shutdown()
