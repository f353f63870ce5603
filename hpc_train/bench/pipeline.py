"""`bench pipeline`: GPipe's bubble, measured against (K-1)/(M+K-1), and memory with/without remat.

The login-node side (no torch import): start K ranks of `hpc_train.bench.pipeline_rank` on this
host as a job's are started (bench/ranks.py), one rank per stage, read the ranks' JSON files, and report per (remat, M): step time, the
measured bubble (mean over stages) next to the formula, and each stage's peak activation memory.
Measure and formula come from the same run; whether they agree for M >= 4 is stated, not assumed.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

from hpc_train.bench.ranks import run_here
from hpc_train.errors import HpcTrainError
from hpc_train.inspection.text import print_table

DEFAULT_M = (1, 2, 4, 8)
TOLERANCE, FROM_M = 0.10, 4      # the criterion: |measured - formula| <= 0.10 for M >= 4


def settings_from(args) -> dict:
    if args.microbatches is None:  # 1F1B (torch's Schedule1F1B) needs M >= K
        micro = [m for m in DEFAULT_M if args.schedule == "gpipe" or m >= args.stages]
    else:
        try:
            micro = sorted({int(m) for m in args.microbatches.split(",")})
        except ValueError:
            micro = []
    if not micro or micro[0] < 1:
        raise HpcTrainError(f"--microbatches {args.microbatches}: comma-separated counts >= 1")
    if args.schedule == "1f1b" and micro[0] < args.stages:
        raise HpcTrainError(f"--schedule 1f1b needs at least {args.stages} micro-batches (one per stage); "
                            f"got M = {micro[0]}")
    if bad := [m for m in micro if args.batch % m]:
        raise HpcTrainError(f"--batch {args.batch} does not split into {bad} equal micro-batches")
    if args.dim % args.heads:
        raise HpcTrainError(f"--dim {args.dim} is not divisible by --heads {args.heads}")
    if args.layers + 2 < args.stages:
        raise HpcTrainError(f"{args.layers} layers + embedding + head cannot fill {args.stages} stages")
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.stages)
    return {"stages": args.stages, "microbatches": micro, "layers": args.layers, "dim": args.dim,
            "heads": args.heads, "seq_len": args.seq_len, "batch": args.batch, "steps": args.steps,
            "warmup": args.warmup, "schedule": args.schedule, "balance": args.balance,
            "device": args.device, "threads": threads}


def merge(ranks: list[dict], settings: dict) -> dict:
    """The report from the ranks' results (pure): one row per (remat, M), stages inside."""
    by_key: dict[tuple[bool, int], list[dict]] = {}
    for result in sorted(ranks, key=lambda r: r["rank"]):
        for row in result["rows"]:
            by_key.setdefault((row["remat"], row["microbatches"]), []).append(row)
    rows = []
    for (remat, micro), stages in sorted(by_key.items()):
        stages = sorted(stages, key=lambda r: r["stage"])
        bubble = statistics.fmean(s["bubble"] for s in stages)
        formula = stages[0]["formula"]
        rows.append({
            "remat": remat, "microbatches": micro, "micro_batch": settings["batch"] // micro,
            "step_s": max(s["step_s"] for s in stages), "schedule_s": max(s["schedule_s"] for s in stages),
            "bubble": bubble, "formula": formula, "difference": bubble - formula,
            "stages": [{k: v for k, v in s.items() if k not in ("remat", "microbatches", "formula")}
                       for s in stages]})
    checked = [r for r in rows if r["microbatches"] >= FROM_M]
    worst = max((abs(r["difference"]) for r in checked), default=None)
    first = ranks[0]
    return {"settings": {**settings, "command": "python -m hpc_train " + " ".join(sys.argv[1:]),
                         "device": first["device"], "threads": first["threads"], "torch": first["torch"],
                         "blocks_per_stage": rows[0]["stages"][0]["blocks"] if rows else None,
                         "cpu_count": os.cpu_count(), "load_average": list(os.getloadavg())},
            "rows": rows,
            "check": {"criterion": f"|bubble - (K-1)/(M+K-1)| <= {TOLERANCE} for M >= {FROM_M}",
                      "max_abs_difference": worst,
                      "within": None if worst is None else worst <= TOLERANCE}}


def _mb(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:.1f}"


def render(report: dict, tty: bool) -> None:
    """A rich table on a terminal, Markdown otherwise."""
    s, check = report["settings"], report["check"]
    header = (f"{s['schedule']}, K={s['stages']} stages (blocks {s['blocks_per_stage']}), GPT {s['layers']} "
              f"layers, dim {s['dim']}, seq {s['seq_len']}, batch {s['batch']} per step, {s['device']}, "
              f"{s['threads']} thread(s)/rank, median of {s['steps']} steps")
    cuda = s["device"].startswith("cuda")
    columns = ["remat", "M", "step ms", "schedule ms", "bubble", "formula", "diff",
               "peak activations MB/stage", *(["cuda max alloc MB/stage"] if cuda else [])]
    lines = []
    for r in report["rows"]:
        line = ["on" if r["remat"] else "off", str(r["microbatches"]), f"{r['step_s'] * 1000:.0f}",
                f"{r['schedule_s'] * 1000:.0f}", f"{r['bubble']:.3f}", f"{r['formula']:.3f}",
                f"{r['difference']:+.3f}", " / ".join(_mb(st["peak_saved_bytes"]) for st in r["stages"])]
        if cuda:
            line.append(" / ".join(_mb(st["cuda_max_allocated_bytes"]) for st in r["stages"]))
        lines.append(line)
    verdict = ("no rows with M >= 4" if check["within"] is None else
               f"check {check['criterion']}: {'yes' if check['within'] else 'NO'} "
               f"(largest |diff| {check['max_abs_difference']:.3f})")
    if not tty:  # a Markdown table, as docs/benchmarks.md records it
        rule = ["---"] * len(columns)
        print("\n".join([header, "", *("| " + " | ".join(cells) + " |" for cells in (columns, rule, *lines)),
                         "", verdict]))
        return
    print_table(columns, lines, title=header).print(verdict)


def main(args) -> int:
    settings = settings_from(args)
    # The ranks' progress goes to stderr.
    report = merge(run_here("bench-pipeline", "hpc_train.bench.pipeline_rank", settings, settings["stages"]),
                   settings)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        render(report, sys.stdout.isatty())
    return 0
