"""`python -m hpc_train bench ...` (light imports only)."""

from __future__ import annotations

import argparse
import importlib

from hpc_train.argtypes import add_command, positive_float, positive_int


def _bench(args: argparse.Namespace) -> int:
    """Run the chosen benchmark: hpc_train.bench.<its name> (torch and all) is imported only
    now, so building the parser stays light."""
    return importlib.import_module(f"hpc_train.bench.{args.bench_command}").main(args)


def _add_data(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "data", help="input pipeline images/s: ours (shards) vs. the torchvision recipe vs. our ceiling",
        description="Measure, in one run and in alternating rounds, the images/s through the same "
                    "DataLoader settings of: the torchvision recipe on a folder of JPEG files "
                    "(Pillow, float32; the baseline), our decode + transform on the same files, on "
                    "our HDF5 shards (batched, item by item, with each slower JPEG decoder), on raw "
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
    p.add_argument("--sharded", action="store_true",
                   help="an fsdp GPT on --ranks local ranks: every rank writing its own part "
                        "(write_sharded) vs. rank 0 writing the whole model + optimizer state")
    p.add_argument("--ranks", type=positive_int, default=4, metavar="N", help="--sharded: ranks (4)")
    p.add_argument("--spec", default="jobs/transformer_zero_cpu.yaml", metavar="FILE",
                   help="--sharded: the GPT spec (jobs/transformer_zero_cpu.yaml)")
    p.add_argument("--gpt", choices=("spec", "large"), default="spec",
                   help="--sharded: the spec's GPT, or a larger one (8 layers of 512: ~25 M parameters)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inspect", help="status and logs on a synthetic run (8 ranks, 10,000 metric lines)",
        description="Write a synthetic finished run directory in a temporary directory, then time "
                    "`status` and `logs` in-process and as subprocesses (median of --rounds).")
    p.add_argument("--ranks", type=positive_int, default=8, metavar="N", help="ranks (8)")
    p.add_argument("--metric-lines", type=positive_int, default=10_000, metavar="N", help="(10000)")
    p.add_argument("--rounds", type=positive_int, default=5, metavar="N", help="rounds each (5)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


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


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="images/s of the spec's model: DDP vs Horovod vs FSDP vs ZeRO vs FP16, trainer "
                      "vs bare loop, allreduce vs raw MPI, memory and bytes per step",
        description="Run the spec's model under each configuration of a matrix (default: ddp and "
                    "horovod, or any of fsdp, zero1, zero2, zero3; fp32 and fp16; fp16 "
                    "compression for horovod and ddp; 1 rank and the whole allocation; synthetic "
                    "and the spec's own data), through the driver's launcher and the real "
                    "Trainer, in alternating rounds, warm-up steps excluded; beside "
                    "them a bare PyTorch loop (the trainer's overhead) and the gradient allreduce "
                    "of Horovod and DDP against mpi4py (same bytes). Reports images/s, the "
                    "ImageNet epoch time, scaling efficiency, a per-step breakdown, peak memory "
                    "split into the state a rank holds and the rest, bytes on the wire per step "
                    "(table, --json, report.md and report.png in the bench directory).")
    p.add_argument("spec", nargs="?", metavar="SPEC", help="job spec (default jobs/smoke.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a spec key (repeatable)")
    p.add_argument("--backends", metavar="LIST",
                   help="from ddp,horovod,fsdp,zero1,zero2,zero3 (zeroN: DeepSpeed ZeRO stage N; "
                        "default ddp,horovod)")
    p.add_argument("--precisions", metavar="LIST", help="from fp32,fp16,bf16 (default fp32,fp16)")
    p.add_argument("--compressions", metavar="LIST",
                   help="none,fp16,bf16,powersgd (default none,fp16; each under the backends that "
                   "have it: horovod fp16, ddp all)")
    p.add_argument("--ranks", metavar="LIST", help="1 and/or the spec's world size (default both)")
    p.add_argument("--accumulation", metavar="LIST", help="backward passes per step (default 1)")
    p.add_argument("--data", metavar="LIST", help="synthetic,real (default both; real = the spec's data)")
    p.add_argument("--no-bare", action="store_true", help="leave out the bare-loop baseline")
    p.add_argument("--warmup", type=positive_int, default=5, metavar="N",
                   help="untimed steps per configuration and round (5)")
    p.add_argument("--steps", type=positive_int, default=20, metavar="N",
                   help="timed steps per configuration and round (20)")
    p.add_argument("--rounds", type=positive_int, default=2, metavar="N",
                   help="rounds; launches and configurations alternate their order (2)")
    p.add_argument("--allreduce-model", default="resnet50", metavar="NAME",
                   help="the model whose gradients the allreduce ratio reduces (resnet50: 25.6M)")
    p.add_argument("--allreduce-repetitions", type=positive_int, default=5, metavar="N",
                   help="timed allreduces per method and round (5)")
    p.add_argument("--allreduce-rounds", type=positive_int, default=4, metavar="N",
                   help="rounds over the methods, order reversed every other round (4)")
    p.add_argument("--no-allreduce", action="store_true", help="leave out the allreduce ratio")
    p.add_argument("--submit", action="store_true",
                   help="send the benchmark as one Slurm job shaped by the spec; print where its "
                        "report will be")
    p.add_argument("--time", default="30", metavar="LIMIT", help="--submit: the job's time limit (30 min)")
    p.add_argument("--in-run", metavar="BENCH_DIR",
                   help="run a prepared bench directory (what the --submit job runs)")
    p.add_argument("--gpu-protocol", action="store_true", help="run `bench gpu` instead")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _add_gpu(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "gpu", help="the GPU protocol: ResNet-50 FP16/BF16 images/s per GPU, synthetic and from "
                    "HDF5 shards, in under 8 minutes",
        description="On a CUDA machine: ResNet-50 with channels_last in a bare loop over DDP "
                    "(NCCL), FP16 then BF16, on one batch made on the GPU; Horovod FP16 too when "
                    "a CUDA build is installed; the HDF5 shard loader alone; ResNet-50 from the "
                    "shards. Images/s per GPU as JSON, against 2,470 images/s (A100 80GB, AMP, "
                    "NVIDIA's DeepLearningExamples) and, on H100/H200, the targets 4,000 "
                    "synthetic and 0.9 of that from shards. One process per GPU (mpirun when "
                    "there are several).")
    p.add_argument("--out", metavar="FILE", help="the JSON file (default runs/bench-gpu-<stamp>.json)")
    p.add_argument("--shards", metavar="DIR", help="a shard root with train/ (default: make "
                   "~2,000 demo JPEGs of ~500 px and convert them first)")
    p.add_argument("--model", default="resnet50", help="(resnet50)")
    p.add_argument("--image-size", type=positive_int, default=224, metavar="PX", help="(224)")
    p.add_argument("--batch", type=positive_int, default=256, metavar="N", help="per GPU (256)")
    p.add_argument("--precisions", default="fp16,bf16", metavar="LIST",
                   help="the first also trains from the shards (fp16,bf16)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="loader workers per GPU (default: cores per GPU - 1, 2 to 16)")
    p.add_argument("--seconds", type=positive_float, default=25.0, metavar="S",
                   help="timed seconds per phase (25)")
    p.add_argument("--warmup", type=positive_int, default=15, metavar="N",
                   help="untimed steps per phase (15; cudnn.benchmark picks kernels here)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: the same code path on the CPU, for tests")
    p.add_argument("--no-horovod", action="store_true", help="skip Horovod even if built with CUDA")
    p.add_argument("--json", action="store_true", help="print the JSON")


def _add_scale(sub: argparse._SubParsersAction) -> None:
    from hpc_train.bench.scale_args import MEASURES, parse_counts, parse_measures

    p = sub.add_parser(
        "scale", help="launch, stop, doctor, staging and watchdog times at 2, 4, 8 nodes x 1 rank",
        description="On the Slurm the environment points at (SLURM_CONF), for each node count, one "
                    "rank per node, the spec's tiny model: submit to first step under mpirun and "
                    "srun; USR2 and `scontrol requeue` to training again; `doctor --nodes` wall "
                    "time; data.copy_to staging; the watchdog's time to name a frozen rank; the "
                    "driver's CPU seconds per second of watching. Table, or --json; every job it "
                    "submitted is cancelled at the end, by Ctrl-C too.")
    p.add_argument("--nodes", type=parse_counts, default=[2, 4, 8], metavar="N,N,...",
                   help="node counts, one after another (2,4,8)")
    p.add_argument("--measure", type=parse_measures, default=MEASURES, metavar="LIST",
                   help=f"from {','.join(MEASURES)} (default all)")
    p.add_argument("--spec", default="jobs/smoke.yaml", metavar="FILE", help="(jobs/smoke.yaml)")
    p.add_argument("--timeout", type=positive_float, default=300.0, metavar="S",
                   help="the bound of every wait, a queue wait included (300)")
    p.add_argument("--out", metavar="DIR", help="runs, doctor output and scale.json, on a file "
                   "system the nodes see (default runs/bench-scale-<time>)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def register(commands: argparse._SubParsersAction) -> None:
    bench = add_command(commands, "bench", _bench, help="benchmarks: ours vs. a baseline, measured in one run")
    sub = bench.add_subparsers(dest="bench_command", metavar="BENCH_COMMAND", required=True)
    _add_data(sub)
    _add_checkpoint(sub)
    _add_inspect(sub)
    _add_pipeline(sub)
    _add_train(sub)
    _add_gpu(sub)
    _add_scale(sub)
