"""Evaluate a run's checkpoint, in one process or over the ranks that mpirun/srun started.

Exactly the trainer's numbers: under Horovod each training rank keeps its own BatchNorm
statistics and validates its own part of the split (data/sampler.ValidationSampler). So the
split is cut into the parts of the *training* world, and each part is evaluated with the
buffers of the rank that owned it, by the shared function (train/evaluation.py) in the
trainer's batches. The evaluating ranks share the parts round robin; each part's sums go in a
row of their own, rows are summed in rank order after one all-reduce: the result does not
depend on how many processes evaluate, and with the training world size it equals the trainer's.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import torch

from hpc_train.errors import UsageError
from hpc_train.evaluate.data import evaluation_data
from hpc_train.evaluate.report import build_report
from hpc_train.launch.identity import RankInfo, rank_from_env
from hpc_train.rundir import write_atomic
from hpc_train.train.data import shutdown_workers, validation_loader
from hpc_train.train.evaluation import evaluate_classifier, totals_length
from hpc_train.train.precision import Precision
from hpc_train.train.saved_run import SavedCheckpoint, choose_step, open_run
from hpc_train.train.trainer import pick_device


@dataclass(frozen=True)
class Request:
    run_dir: str
    step: int | None = None       # None: the latest complete checkpoint
    data: str | None = None       # other shards than the run's data.path
    split: str = "val"
    backend: str | None = None    # collectives between ranks; None: the run's parallel.backend


def parts_of(rank: int, size: int, trained_ranks: int) -> list[int]:
    """The training ranks whose parts this rank evaluates (round robin)."""
    return list(range(rank, trained_ranks, size))


class OneProcess:
    """The collectives of a world of one."""

    def allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def barrier(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


def collectives(identity: RankInfo, device: torch.device, backend: str, environ):
    if identity.size == 1:
        return OneProcess()
    if backend == "fsdp":      # evaluation holds whole models: its sums go over torch.distributed
        backend = "ddp"
    if backend == "ddp" and not (environ.get("MASTER_ADDR") and environ.get("MASTER_PORT")):
        raise UsageError(f"evaluate over {identity.size} ranks with the ddp backend needs "
                         "MASTER_ADDR and MASTER_PORT set (the first node, a free port). Fix: "
                         "export them, or pass --backend horovod")
    from hpc_train.parallel.data_parallel import make_backend

    return make_backend(backend, identity, device)


def evaluate_run(request: Request, environ=os.environ) -> tuple[dict, object] | None:
    """(the report, the file written) on rank 0; None on the other ranks."""
    paths, spec = open_run(request.run_dir)
    step = choose_step(paths, request.step)
    dataset, class_names, source = evaluation_data(spec, request.split, request.data)
    identity = rank_from_env(environ)
    saved = SavedCheckpoint(paths, spec, step)
    torch.set_num_threads(spec.slurm.cpus_per_task)   # as the trainer: same kernels, same sums
    device = pick_device(spec, identity)
    world = collectives(identity, device, request.backend or spec.parallel.backend, environ)
    autocast = Precision(spec.precision.mode, device).autocast
    pin = spec.data.pin_memory and device.type == "cuda"
    num_classes = spec.data.num_classes
    rows = torch.zeros(saved.world_size, totals_length(num_classes), dtype=torch.float64)
    world.barrier()
    started = time.perf_counter()
    for part in parts_of(identity.rank, identity.size, saved.world_size):
        model = saved.model(part).to(device)
        loader = validation_loader(dataset, spec, part, saved.world_size, pin)
        rows[part] = evaluate_classifier(model, loader, device, autocast, num_classes)
        shutdown_workers(loader)
    rows = world.allreduce_sum(rows)
    seconds = time.perf_counter() - started
    world.shutdown()
    if not identity.is_main:
        return None
    totals = rows[0].clone()
    for row in rows[1:]:
        totals += row          # in rank order, as the trainer's all-reduce of two ranks adds
    report = build_report(totals, num_classes, class_names, run_dir=str(paths.root),
                          split=request.split, step=step, data=source, spec_hash=saved.spec_hash,
                          model=spec.model.name, ranks=identity.size,
                          trained_ranks=saved.world_size, seconds=seconds)
    path = paths.evaluation(request.split, step)
    write_atomic(path, (json.dumps(report, indent=1) + "\n").encode())
    return report, path
