"""Started by mpirun: a K x D pipeline vs. one process on the same model and batch.

argv: BACKEND STEPS OUT_DIR CONFIG...
CONFIG = NAME:STAGES:MICROBATCHES:SCHEDULE:REMAT:PRECISION[:BALANCE[:CLIP]] (BALANCE auto|time,
CLIP a max gradient norm, 0 = none; both sides clip, the pipeline with its global norm)
Configs run one after another in one launch (new process groups each), so the ranks pay the
start-up once; results go to OUT_DIR/NAME/rank-N.json.
Every rank also computes the single-process reference itself (the model is tiny, fp32), then
compares its stage's loss, gradients and, after STEPS optimizer steps, parameters. One JSON file
per rank. PRECISION "overflow" is fp16 with an inf planted in the last stage's gradient at the
first step: every rank must skip that step and halve its loss scale.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import torch

from hpc_train.models.gpt import gpt, lm_loss
from hpc_train.parallel.data_parallel import init_torch_distributed
from hpc_train.parallel.pipeline.engine import PipelineConfig, PipelineEngine
from hpc_train.parallel.layout import ParallelLayout
from hpc_train.parallel.pipeline.memory import SavedTensorMeter
from hpc_train.parallel.pipeline.scaler import AgreedLossScaler
from hpc_train.launch.identity import rank_from_env

BATCH_PER_REPLICA, SEQ, VOCAB = 8, 16, 64


def main() -> None:
    backend, steps, out_dir, *configs = sys.argv[1:]
    torch.set_num_threads(1)
    me = rank_from_env(os.environ)
    init_torch_distributed(me.rank, me.size, torch.device("cpu"))
    for config in configs:
        name, stages, micro, schedule, remat, precision, *rest = config.split(":")
        balance, clip = (rest + ["auto", "0"][len(rest):])[:2]
        result = compare(me, int(stages), int(micro), schedule, backend, remat == "remat",
                         int(steps), precision, balance, float(clip) or None)
        Path(out_dir, name).mkdir(parents=True, exist_ok=True)
        Path(out_dir, name, f"rank-{me.rank}.json").write_text(json.dumps(result))
    torch.distributed.destroy_process_group()


def compare(me, stages: int, micro: int, schedule: str, backend: str, remat: bool, steps: int,
            precision: str, balance: str = "auto", clip: float | None = None) -> dict:
    layout = ParallelLayout(me.size, stages)
    device = torch.device("cpu")
    torch.manual_seed(0)
    model = gpt(VOCAB, layers=6, dim=32, heads=4, seq_len=SEQ)
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(VOCAB, (BATCH_PER_REPLICA * layout.replicas, SEQ + 1), generator=gen)
               for _ in range(steps)]

    # Single process, whole batch.
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    ref_losses, ref_grads = [], None
    for i, batch in enumerate(batches):
        ref_opt.zero_grad()
        loss = lm_loss(reference(batch[:, :-1]), batch[:, 1:])
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(reference.parameters(), clip)
        if i == 0:
            ref_grads = {n: p.grad.clone() for n, p in reference.named_parameters()}
        ref_losses.append(loss.item())
        ref_opt.step()

    config = PipelineConfig(stages, micro, schedule, balance, remat, backend)
    overflow_test = precision == "overflow"
    mode = "fp16" if overflow_test else precision
    scaler = AgreedLossScaler(mode, init_scale=1024.0)
    example = batches[0][:BATCH_PER_REPLICA // micro, :-1]        # one micro-batch, for "time"
    engine = PipelineEngine(model, layout, me.rank, device, config, lm_loss, scaler, mode, example)
    optimizer = torch.optim.AdamW(engine.parameters(), lr=1e-3)
    names = engine.module.block_state_dict
    result = {"rank": me.rank, "stage": engine.stage_index, "replica": engine.replica,
              "sizes": engine.sizes, "grad_diff": 0.0, "param_diff": 0.0, "loss_diff": 0.0}
    ref_params = dict(reference.named_parameters())
    meter = SavedTensorMeter(engine.module)
    start_state = {n: t.clone() for n, t in names().items()}
    result["applied"], result["scales"] = [], []
    for i, batch in enumerate(batches):
        part = batch[engine.replica * BATCH_PER_REPLICA:(engine.replica + 1) * BATCH_PER_REPLICA]
        optimizer.zero_grad()
        with meter:
            loss = engine.forward_backward(part[:, :-1], part[:, 1:])
        if overflow_test:
            if i == 0 and engine.is_last:
                next(iter(engine.parameters())).grad.view(-1)[0] = float("inf")
            result["applied"].append(engine.finish_step(optimizer))
            result["scales"].append(scaler.scale)
            if i == 0:
                result["unchanged_after_skip"] = all(torch.equal(start_state[n], t)
                                                     for n, t in names().items())
            continue
        engine.finish_step(optimizer, clip)       # reduce, agree, clip, step
        if i == 0:   # the gradients the step used (clipped when asked)
            grads = {n: p.grad for n, p in engine.module.named_parameters()}
            result["grad_diff"] = max((grads[f"blocks.{n}"] - ref_grads[n]).abs().max().item()
                                      for n in names())
            result["params_checked"] = len(grads)
        if loss is not None:
            # The replica's loss is the mean over its part; average over replicas for the batch.
            summed = engine.collectives.allreduce_sum(torch.tensor([loss]))
        else:
            summed = engine.collectives.allreduce_sum(torch.tensor([0.0]))
        mean_loss = summed.item() / layout.replicas
        result["loss_diff"] = max(result["loss_diff"], abs(mean_loss - ref_losses[i]))
    # Evaluation (forward only) after training: the last stage's loss and accuracy on the
    # replica's part of a new batch, against the trained single-process model.
    batch = torch.randint(VOCAB, (BATCH_PER_REPLICA * layout.replicas, SEQ + 1), generator=gen)
    part = batch[engine.replica * BATCH_PER_REPLICA:(engine.replica + 1) * BATCH_PER_REPLICA]
    totals = engine.evaluate(part[:, :-1], part[:, 1:])
    if totals is not None:
        with torch.no_grad():
            logits = reference(part[:, :-1])
        loss_sum, correct, tokens = totals.tolist()
        result["eval_loss_diff"] = abs(loss_sum / tokens - lm_loss(logits, part[:, 1:]).item())
        result["eval_correct_diff"] = abs(correct - (logits.argmax(-1) == part[:, 1:]).sum().item())
    state = names()
    result["param_diff"] = max((state[n] - ref_params[n].detach()).abs().max().item()
                               for n in state if n in ref_params)
    result["peak_saved_bytes"] = meter.peak
    return result


if __name__ == "__main__":
    main()
