"""`bench gpu` (also `bench train --gpu-protocol`): what one CUDA machine gives ResNet-50, in
under 8 minutes and without building Horovod.

The protocol (bench/gpu_rank.py does the measuring, one process per GPU): ResNet-50 with
channels_last and cudnn.benchmark, a bare loop over DDP on NCCL, FP16 (autocast + GradScaler)
then BF16, on one batch made on the GPU (synthetic: the compute ceiling); Horovod FP16 as well
when a CUDA build of it is installed; then the HDF5 shard loader on its own (uint8 crops: the
rate the input pipeline can feed one GPU) and ResNet-50 trained from those shards. Images/s per
GPU for each, written as JSON.

The published anchor for this model: 2,470 images/s on one A100 80GB with AMP (NVIDIA
DeepLearningExamples, ResNet-50 v1.5, PyTorch, DALI). On H100/H200 the aim is at least 4,000
images/s synthetic and at least 0.9 of that from shards; other GPUs are reported without a
verdict. Shards: --shards DIR, or ~2,000 ImageNet-sized demo JPEGs (about 500 px) made and
converted first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpc_train.bench.ranks import run_here
from hpc_train.errors import HpcTrainError
from hpc_train.launch.local import free_port
from hpc_train.spec import LaunchSpec
from hpc_train.train.timing import Stopwatch

BUDGET_SECONDS = 8 * 60
ANCHOR = {"images_per_s": 2470, "gpu": "A100 80GB", "precision": "AMP (fp16)",
          "source": "NVIDIA DeepLearningExamples, ResNet-50 v1.5 for PyTorch, with DALI"}
TARGET_GPUS, TARGET_SYNTHETIC, TARGET_SHARDS = ("H100", "H200"), 4000.0, 0.9
DEMO = {"classes": 20, "per_class": 100, "size": 500}     # ~2,000 JPEGs of ~500 px


def default_args(**changes) -> argparse.Namespace:
    """The protocol's settings as `bench gpu` parses them (for `bench train --gpu-protocol`)."""
    values = dict(out=None, shards=None, model="resnet50", image_size=224, batch=256,
                  precisions="fp16,bf16", workers=None, seconds=25.0, warmup=15,
                  device="cuda", no_horovod=False, json=False)
    return argparse.Namespace(**{**values, **changes})


def cpus_per_gpu(gpus: int) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, cores // max(gpus, 1))


def settings_from(args, gpus: int, shards: Path, budget: float) -> dict:
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if not precisions or any(p not in ("fp16", "bf16", "fp32") for p in precisions):
        raise HpcTrainError(f"--precisions {args.precisions!r}: comma-separated fp16, bf16, fp32")
    cpus = cpus_per_gpu(gpus)
    # One core for the training process itself, the rest decode: at least 2, at most 16 workers.
    workers = args.workers if args.workers is not None else min(16, max(2, cpus - 1))
    return {"model": args.model, "image_size": args.image_size, "batch": args.batch,
            "precisions": precisions, "workers": workers, "cpus_per_gpu": cpus,
            "seconds": args.seconds, "warmup": args.warmup, "device": args.device,
            "horovod": not args.no_horovod, "shards": str(shards), "gpus": gpus,
            "budget_seconds": budget}


def verdicts(phases: dict, gpu: str | None, first_precision: str) -> dict:
    """The protocol's targets against the measured rates (images/s per GPU)."""
    synthetic = phases.get(f"synthetic {first_precision} ddp", {}).get("images_per_s_per_gpu")
    shards = phases.get(f"shards {first_precision} ddp", {}).get("images_per_s_per_gpu")
    out = {"anchor": ANCHOR, "vs_anchor": synthetic / ANCHOR["images_per_s"] if synthetic else None,
           "shards_vs_synthetic": shards / synthetic if shards and synthetic else None}
    if not gpu or not any(name in gpu for name in TARGET_GPUS):
        out["verdict"] = f"no target for {gpu or 'this device'} (targets are for {'/'.join(TARGET_GPUS)})"
        return out
    out["synthetic_ok"] = synthetic is not None and synthetic >= TARGET_SYNTHETIC
    out["shards_ok"] = out["shards_vs_synthetic"] is not None and out["shards_vs_synthetic"] >= TARGET_SHARDS
    out["verdict"] = (f"synthetic {synthetic or 0:.0f} images/s per GPU (target >= {TARGET_SYNTHETIC:.0f}): "
                      f"{'yes' if out['synthetic_ok'] else 'NO'}; shards {out['shards_vs_synthetic'] or 0:.2f} "
                      f"of synthetic (target >= {TARGET_SHARDS}): {'yes' if out['shards_ok'] else 'NO'}")
    return out


def merge(ranks: list[dict]) -> dict:
    """Per phase: the mean images/s per GPU over the ranks, and their sum (the machine's)."""
    phases: dict[str, dict] = {}
    for name in ranks[0]["phases"]:
        values = [r["phases"][name] for r in ranks if name in r["phases"]]
        per_gpu = sum(v["images_per_s_per_gpu"] for v in values) / len(values)
        phases[name] = {**values[0], "images_per_s_per_gpu": per_gpu,
                        "images_per_s_all_gpus": per_gpu * len(values)}
    return {"phases": phases, "skipped": ranks[0]["skipped"], "gpu": ranks[0].get("gpu")}


def make_shards(where: Path, timeout: float) -> Path:
    """ImageNet-sized demo JPEGs, converted to shards, with the project's own commands."""
    python = [sys.executable, "-m", "hpc_train", "data"]
    steps = [[*python, "demo", "--out", str(where / "jpeg"), "--classes", str(DEMO["classes"]),
              "--per-class", str(DEMO["per_class"]), "--val-per-class", "1", "--size", str(DEMO["size"])],
             [*python, "shard", "--src", str(where / "jpeg" / "train"), "--out", str(where / "shards")]]
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise HpcTrainError(f"making the protocol's shards failed: {' '.join(argv)}: "
                                f"{done.stderr.strip()[-500:]}")
    return where / "shards"


def run_ranks(settings: dict, gpus: int) -> list[dict]:
    """One process per GPU: this one for a single GPU (or the CPU), else a rank per GPU on this
    host, started and supervised as a job's (bench/ranks.py)."""
    if gpus == 1:
        from hpc_train.bench.gpu_rank import run
        from hpc_train.launch.identity import RankInfo
        from hpc_train.runtime.heartbeat import NoHeartbeat

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        return [run(settings, RankInfo(), NoHeartbeat())]
    # A phase makes no progress for as long as it is timed: the watchdog's bound allows for it.
    stall = LaunchSpec().stall_seconds + settings["seconds"]
    return run_here("bench-gpu", "hpc_train.bench.gpu_rank", settings, gpus,
                    {"slurm": {"gpus_per_node": gpus, "cpus_per_task": settings["cpus_per_gpu"]},
                     "launch": {"stall_seconds": stall}})


def environment() -> dict:
    import torch

    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "host": os.uname().nodename}


def main(args) -> int:
    import torch

    watch = Stopwatch()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise HpcTrainError("bench gpu needs a CUDA GPU and a CUDA build of torch (torch.cuda."
                            "is_available() is False here); run it on a GPU node")
    gpus = torch.cuda.device_count() if args.device == "cuda" else 1
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        shards = Path(args.shards) if args.shards else make_shards(Path(tmp), BUDGET_SECONDS / 2)
        budget = BUDGET_SECONDS - watch.seconds() - 30    # 30 s to start and report
        settings = settings_from(args, gpus, shards, budget)
        merged = merge(run_ranks(settings, gpus))
    report = {"settings": settings, **merged, **environment(), "gpus": gpus,
              "targets": verdicts(merged["phases"], merged["gpu"], settings["precisions"][0]),
              "seconds": round(watch.seconds(), 1)}
    out = Path(args.out) if args.out else Path("runs") / f"bench-gpu-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"bench gpu: {gpus} x {report['gpu'] or args.device}, {settings['model']} batch "
              f"{settings['batch']}/GPU, {settings['image_size']} px, channels_last, torch {report['torch']}")
        for name, phase in report["phases"].items():
            print(f"  {name}: {phase['images_per_s_per_gpu']:.0f} images/s per GPU")
        for name in report["skipped"]:
            print(f"  {name}: skipped (time budget)")
        print(f"  {report['targets']['verdict']}")
        print(f"written to {out} ({report['seconds']:.0f} s)")
    return 0
