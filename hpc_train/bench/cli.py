"""`python -m hpc_train bench ...` (light imports only)."""

from __future__ import annotations

import argparse
import importlib

from hpc_train.argtypes import positive_float, positive_int


def _runs(module: str):
    """The handler of one benchmark: imports hpc_train.bench.<module> (torch and all) only when
    that benchmark runs, so building the parser stays light."""
    def handler(args: argparse.Namespace) -> int:
        return importlib.import_module(f"hpc_train.bench.{module}").main(args)

    return handler


def _add_data(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "data", help="input pipeline images/s: ours (shards) vs. the torchvision recipe vs. our ceiling",
        description="Measure, in one run and in alternating rounds, the images/s through the same "
                    "DataLoader settings of: the torchvision recipe on a folder of JPEG files "
                    "(Pillow, float32; the baseline), our decode + transform on the same files, on "
                    "our HDF5 shards (batched, item by item, with the Pillow decoder), on raw "
                    "shards (--raw-shards) and on JPEG bytes in memory (our ceiling). Also images/s "
                    "per worker core and the cores one GPU at 3,000 images/s needs. Page cache: warm.")
    p.add_argument("--src", required=True, metavar="DIR",
                   help="the split's JPEG folder, SRC/<class>/<image> (the converter's --src)")
    p.add_argument("--shards", required=True, metavar="DIR", help="shard root (DIR/<split>/...)")
    p.add_argument("--raw-shards", metavar="DIR", help="a raw-encoded conversion of the same split")
    p.add_argument("--split", default="train",
                   help="split (default train: RandomResizedCrop; other: resize + centre crop)")
    p.add_argument("--image-size", type=positive_int, default=224, metavar="PX")
    p.add_argument("--batch", type=positive_int, default=64, metavar="N", help="batch size (64)")
    p.add_argument("--workers", type=int, default=2, metavar="N",
                   help="DataLoader workers per configuration (default 2; 0 = main process)")
    p.add_argument("--start-method", choices=("fork", "forkserver", "spawn"), default=None,
                   help="worker start method (default fork)")
    p.add_argument("--block-size", type=positive_int, default=256, metavar="N",
                   help="sampler block size for the shards (default 256)")
    p.add_argument("--rounds", type=positive_int, default=3, metavar="N",
                   help="alternating rounds per configuration; the median counts (default 3)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=positive_float, default=8.0, metavar="S",
                        help="measured seconds per configuration, all rounds (default 8)")
    budget.add_argument("--images", type=positive_int, default=None, metavar="N",
                        help="images per configuration, all rounds (instead of --seconds)")
    p.add_argument("--no-draft", action="store_true",
                   help="ours: decode JPEGs at full size (default: DCT-scaled when the crop allows)")
    p.add_argument("--output", choices=("uint8", "float32"), default="uint8",
                   help="what our workers return: uint8 CHW (the GPU default: normalised on the "
                        "device) or normalised float32 (the baseline is always float32)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(handler=_runs("data"))


def _add_checkpoint(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "checkpoint", help="checkpoint save time: ours (atomic) vs. a bare torch.save",
        description="Save the same training state with the checkpoint manager (temporary "
                    "directory, fsync, rename, marker) and with one torch.save, in alternating "
                    "rounds; report the medians and their ratio.")
    p.add_argument("--model", default="resnet50", help="model whose state is saved (resnet50)")
    p.add_argument("--rounds", type=positive_int, default=5, metavar="N", help="rounds each (5)")
    p.add_argument("--dir", metavar="DIR", help="where to write (default: the system temp dir); "
                   "use the file system your checkpoints live on")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=_runs("checkpoint"))


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect", help="status and logs on a synthetic run (8 ranks, 10,000 metric lines)",
        description="Write a synthetic finished run directory in a temporary directory, then time "
                    "`status` and `logs` in-process and as subprocesses (median of --rounds).")
    p.add_argument("--ranks", type=positive_int, default=8, metavar="N", help="ranks (8)")
    p.add_argument("--metric-lines", type=positive_int, default=10_000, metavar="N", help="(10000)")
    p.add_argument("--rounds", type=positive_int, default=5, metavar="N", help="rounds each (5)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=_runs("inspect"))


def _add_pipeline(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pipeline", help="pipeline bubble vs. (K-1)/(M+K-1), step time, stage memory with/without remat",
        description="Start K ranks on this host with mpirun, one per pipeline stage of a GPT model; "
                    "for each micro-batch count M (the global batch fixed) and remat off/on, time "
                    "steps and report the measured bubble (1 - busy/schedule time, mean over stages) "
                    "next to GPipe's (K-1)/(M+K-1), and each stage's peak activation memory.")
    p.add_argument("--stages", type=positive_int, default=2, metavar="K", help="pipeline stages = ranks (2)")
    p.add_argument("--microbatches", metavar="M,M,...",
                   help="micro-batch counts (default 1,2,4,8; with 1f1b those >= K)")
    p.add_argument("--layers", type=positive_int, default=8, metavar="N", help="transformer layers (8)")
    p.add_argument("--dim", type=positive_int, default=256, metavar="N", help="model width (256)")
    p.add_argument("--heads", type=positive_int, default=4, metavar="N", help="attention heads (4)")
    p.add_argument("--seq-len", type=positive_int, default=128, metavar="N", help="tokens per sequence (128)")
    p.add_argument("--batch", type=positive_int, default=16, metavar="N",
                   help="sequences per step, the same for every M (16)")
    p.add_argument("--steps", type=positive_int, default=5, metavar="N", help="timed steps; the median counts (5)")
    p.add_argument("--warmup", type=positive_int, default=2, metavar="N", help="untimed steps first (2)")
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe", help="(gpipe)")
    p.add_argument("--balance", choices=("auto", "time"), default="auto",
                   help="stage cut by parameter count (auto) or by timing blocks (time)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="(auto: cuda if any)")
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="torch threads per rank on CPU (default: cores / stages)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=_runs("pipeline"))


def register(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser("bench", help="benchmarks: ours vs. a baseline, measured in one run")
    sub = bench.add_subparsers(dest="bench_command", metavar="BENCH_COMMAND", required=True)
    _add_data(sub)
    _add_checkpoint(sub)
    _add_inspect(sub)
    _add_pipeline(sub)
