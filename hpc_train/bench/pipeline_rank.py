"""One rank of `bench pipeline`: `python -m hpc_train.bench.pipeline_rank RUN_DIR`.

Started as a job's ranks are (bench/ranks.py), one rank per stage. For every configuration (remat off/on x M micro-batches)
it builds the pipeline afresh from the same seed, runs warm-up steps, then times steps:

    barrier | t0 | forward_backward | barrier | t1 | finish_step | t2

t1 - t0 is the schedule (the part the GPipe bubble is about: the barrier makes it end when the
last stage of the pipeline is done, on every rank); t2 - t0 is the whole step, optimizer
included. The stage's BusyClock (the engine's; on a GPU one that waits for the kernels, see
`stage_clock`) gives the seconds this stage spent inside its forward and backward chunks;
bubble = 1 - busy / schedule, per step, and the median over steps counts. Peak activation memory
is the SavedTensorMeter's over the steps after the first (the steady state).
The global batch is the same for every M (micro-batch = batch / M), as in the GPipe paper.
Each rank writes RUN_DIR/rank-N.json.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from hpc_train.bench.ranks import serve
from hpc_train.models.gpt import gpt, lm_loss
from hpc_train.parallel.data_parallel import init_torch_distributed
from hpc_train.parallel.pipeline.balance import bubble_fraction
from hpc_train.parallel.pipeline.engine import BusyClock, PipelineConfig, PipelineEngine
from hpc_train.parallel.layout import ParallelLayout
from hpc_train.parallel.pipeline.memory import SavedTensorMeter
from hpc_train.parallel.pipeline.scaler import AgreedLossScaler
from hpc_train.launch.identity import RankInfo
from hpc_train.train.timing import Stopwatch, medians

VOCAB = 256
CHUNKS = ("forward_one_chunk", "backward_one_chunk")


def _synchronizing(method, device: torch.device, before: bool):
    def run(*args, **kwargs):
        if before:
            torch.cuda.synchronize(device)
        out = method(*args, **kwargs)
        if not before:
            torch.cuda.synchronize(device)
        return out
    return run


def stage_clock(engine: PipelineEngine, device: torch.device):
    """The busy clock to read: the engine's on a CPU. On a GPU a chunk's kernels finish after its
    Python call returns, and may first wait for a receive queued on the stream: so a clock whose
    chunks end in a synchronize, with a synchronize before each chunk outside it."""
    if device.type != "cuda":
        return engine.clock
    for name in CHUNKS:
        setattr(engine.stage, name, _synchronizing(getattr(engine.stage, name), device, before=False))
    clock = BusyClock(engine.stage)
    for name in CHUNKS:
        setattr(engine.stage, name, _synchronizing(getattr(engine.stage, name), device, before=True))
    return clock


def run_config(s: dict, layout: ParallelLayout, rank: int, device: torch.device, micro: int,
               remat: bool, batch: torch.Tensor) -> tuple[dict, PipelineEngine]:
    torch.manual_seed(0)
    model = gpt(VOCAB, layers=s["layers"], dim=s["dim"], heads=s["heads"], seq_len=s["seq_len"])
    config = PipelineConfig(layout.stages, micro, s["schedule"], s["balance"], remat)
    inputs, targets = batch[:, :-1], batch[:, 1:]
    engine = PipelineEngine(model, layout, rank, device, config, lm_loss, AgreedLossScaler(),
                            example=inputs[:len(inputs) // micro])     # one micro-batch: balance "time"
    optimizer = torch.optim.SGD(engine.parameters(), lr=1e-4)
    clock = stage_clock(engine, device)
    # The first step is metered apart: torch's pipelining infers shapes on it, which on the first
    # stage keeps one extra micro-batch's activations alive; the timed steps are the steady state.
    first, meter = SavedTensorMeter(engine.module), SavedTensorMeter(engine.module)
    timed: dict[str, list[float]] = {"step_s": [], "schedule_s": [], "busy_s": [], "bubble": []}
    for step in range(s["warmup"] + s["steps"]):
        if step == s["warmup"] and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        optimizer.zero_grad(set_to_none=True)
        engine.barrier()
        busy0 = clock.seconds
        watch = Stopwatch(device)
        with first if step == 0 else meter:
            engine.forward_backward(inputs, targets)
        watch.wait()          # this stage's kernels are done before it enters the barrier
        engine.barrier()
        schedule = watch.seconds()
        engine.finish_step(optimizer)
        total = watch.seconds()
        if step >= s["warmup"]:
            busy = clock.seconds - busy0
            for name, value in zip(timed, (total, schedule, busy, 1.0 - busy / schedule)):
                timed[name].append(value)
    row = {"stage": engine.stage_index, "microbatches": micro, "remat": remat, "blocks": engine.sizes,
           **medians(timed), "bubble_min": min(timed["bubble"]), "bubble_max": max(timed["bubble"]),
           "formula": bubble_fraction(layout.stages, micro), "peak_saved_bytes": meter.peak,
           "first_step_peak_saved_bytes": first.peak,
           "cuda_max_allocated_bytes": (torch.cuda.max_memory_allocated(device)
                                        if device.type == "cuda" else None)}
    return row, engine


def measure(s: dict, me: RankInfo, heartbeat) -> dict:
    """Every (remat, M) configuration on this rank's stage; the rank's result."""
    kind = s["device"] if s["device"] != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda":
        device = torch.device("cuda", me.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(s["threads"])
    layout = ParallelLayout(me.size, s["stages"])
    init_torch_distributed(me.rank, me.size, device)
    gen = torch.Generator().manual_seed(1)
    batch = torch.randint(VOCAB, (s["batch"], s["seq_len"] + 1), generator=gen)
    rows, engine = [], None
    for remat in (False, True):
        for micro in s["microbatches"]:
            if engine is not None:
                dist.barrier()
            heartbeat.progress(phase=f"bench remat {'on' if remat else 'off'} M={micro}")
            row, engine = run_config(s, layout, me.rank, device, micro, remat, batch)
            rows.append(row)
            if me.rank == 0:
                print(f"remat {'on ' if remat else 'off'} M={micro}: step {row['step_s'] * 1000:.1f} ms, "
                      f"stage 0 bubble {row['bubble']:.3f} (formula {row['formula']:.3f})",
                      file=sys.stderr, flush=True)
    engine.shutdown()
    return {"rank": me.rank, "size": me.size, "device": str(device),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "rows": rows}


if __name__ == "__main__":
    serve(measure)
