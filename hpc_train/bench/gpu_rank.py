"""One GPU's part of `bench gpu` (bench/gpu.py): in-process on a one-GPU machine, or one rank
per GPU started as a job's (`python -m hpc_train.bench.gpu_rank RUN_DIR`, bench/ranks.py).

Phases, each in its own time budget (settings["seconds"]), all with channels_last and
cudnn.benchmark: ResNet-50 on one batch made on the GPU (the compute ceiling) in each precision
over DDP (NCCL); the same under Horovod when its CUDA build is present; the shard loader alone
(uint8 crops, no model: the rate the input pipeline can feed); ResNet-50 trained from the
shards (uint8 to the GPU, normalised there) in the first precision. Ranks run the same number of
steps (rank 0's count, broadcast), which DDP's collectives need.
"""

from __future__ import annotations

import gc

import torch

from hpc_train.bench.bare_loop import BareLoop, RepeatedBatch
from hpc_train.bench.ranks import serve
from hpc_train.launch.identity import RankInfo
from hpc_train.train.timing import Stopwatch, time_it

CALIBRATION_STEPS = 5


def agreed(count: int, device: torch.device) -> int:
    """Rank 0's step count, on every rank (DDP needs the same steps everywhere)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return count
    value = torch.tensor([count], device=device)
    dist.broadcast(value, 0)
    return int(value.item())


def timed_training(loop: BareLoop, batch: int, warmup: int, seconds: float, device) -> dict:
    """Warm up (cudnn picks its kernels), calibrate, then time as many steps as fit."""
    loop.steps(warmup)
    per_step = time_it(lambda: loop.steps(CALIBRATION_STEPS), device) / CALIBRATION_STEPS
    steps = agreed(max(CALIBRATION_STEPS, int(seconds / max(per_step, 1e-6))), device)
    elapsed = time_it(lambda: loop.steps(steps), device)
    return {"images_per_s_per_gpu": batch * steps / elapsed, "step_ms": 1e3 * elapsed / steps,
            "steps": steps, "batch_per_gpu": batch}


def protocol_spec(settings: dict, precision: str, backend: str):
    from hpc_train.spec import spec_from_dict

    return spec_from_dict({
        "run": {"name": "bench-gpu"}, "model": {"name": settings["model"]},
        "slurm": {"gpus_per_node": 1 if settings["device"] == "cuda" else 0,
                  "cpus_per_task": settings["cpus_per_gpu"]},
        "data": {"kind": "synthetic", "batch_size": settings["batch"], "image_size": settings["image_size"],
                 "num_classes": 1000, "workers": settings["workers"], "pin_memory": True},
        "precision": {"mode": precision}, "parallel": {"backend": backend}})


def shard_loader(settings: dict, identity: RankInfo, device: torch.device):
    """The input pipeline of a GPU job: HDF5 shards, the block sampler, batched reads, crops as
    uint8 (4x fewer bytes to copy), pinned."""
    from torch.utils.data import DataLoader

    from hpc_train.data.sampler import ResumableBlockSampler
    from hpc_train.data.shard_dataset import ShardedImages
    from hpc_train.data.transforms import TrainTransform

    data = ShardedImages(settings["shards"], "train", TrainTransform(settings["image_size"], normalize=False))
    sampler = ResumableBlockSampler(len(data), identity.rank, identity.size, settings["batch"])
    workers = settings["workers"]
    return DataLoader(data, batch_size=settings["batch"], sampler=sampler, drop_last=True,
                      num_workers=workers, pin_memory=device.type == "cuda",
                      persistent_workers=workers > 0, prefetch_factor=4 if workers else None)


def loader_rate(loader, seconds: float) -> dict:
    """Images/s the loader delivers with nothing consuming them: the ceiling of training from it."""
    batches = iter(loader)
    for _ in range(2):       # workers started, first batches out
        next(batches)
    images, watch = 0, Stopwatch()
    while watch.seconds() < seconds:
        try:
            batch, _ = next(batches)
        except StopIteration:
            loader.sampler.set_epoch(loader.sampler.epoch + 1)
            batches = iter(loader)
            continue
        images += len(batch)
    return {"images_per_s_per_gpu": images / watch.seconds(), "workers": loader.num_workers}


def horovod_cuda() -> bool:
    try:
        import horovod.torch as hvd

        return bool(hvd.nccl_built())
    except Exception:  # noqa: BLE001 - not installed, or built without NCCL: not run
        return False


def run(settings: dict, identity: RankInfo, heartbeat) -> dict:
    from hpc_train.data.transforms import normalize_batch
    from hpc_train.parallel.data_parallel import init_torch_distributed

    cuda = settings["device"] == "cuda"
    device = torch.device("cuda", identity.local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    init_torch_distributed(identity.rank, identity.size, device)
    budget = Stopwatch()
    seconds, warmup, batch = settings["seconds"], settings["warmup"], settings["batch"]
    result = {"rank": identity.rank, "device": str(device), "phases": {}, "skipped": []}
    if cuda:
        result["gpu"] = torch.cuda.get_device_name(device)

    def phase(name: str, work) -> None:
        if budget.seconds() + seconds > settings["budget_seconds"]:
            result["skipped"].append(name)     # the protocol must end within its budget
            return
        heartbeat.progress(phase=f"bench {name}")
        result["phases"][name] = work()
        gc.collect()                           # the phase's model and DDP buckets go now
        if cuda:
            torch.cuda.empty_cache()
            result["phases"][name]["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)

    def synthetic(precision: str, backend: str):
        spec = protocol_spec(settings, precision, backend)
        loop = BareLoop(spec, identity, device, RepeatedBatch(batch, 1000, settings["image_size"], device),
                        channels_last=True)
        return timed_training(loop, batch, warmup, seconds, device)

    for precision in settings["precisions"]:
        phase(f"synthetic {precision} ddp", lambda p=precision: synthetic(p, "ddp"))
    if settings["horovod"] and horovod_cuda():
        phase(f"synthetic {settings['precisions'][0]} horovod",
              lambda: synthetic(settings["precisions"][0], "horovod"))
    loader = shard_loader(settings, identity, device)
    phase("shards loader only", lambda: loader_rate(loader, seconds))

    def from_shards():
        spec = protocol_spec(settings, settings["precisions"][0], "ddp")
        loop = BareLoop(spec, identity, device, loader, channels_last=True, normalize=normalize_batch)
        try:
            return timed_training(loop, batch, warmup, seconds, device)
        finally:
            loop.close()

    phase(f"shards {settings['precisions'][0]} ddp", from_shards)
    return result


if __name__ == "__main__":
    serve(run)
