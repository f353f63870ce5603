"""`bench train`'s report from the ranks' results (pure), and its forms: a terminal table,
Markdown, a PNG.

Per configuration: the median step over the timed steps of every round (each rank's median; the
slowest rank sets the pace), images/s = samples per step / that step, the time of one ImageNet
epoch at that rate, scaling efficiency against the same configuration on one rank, the median
breakdown of a step (mean over ranks), and the peak memory (largest rank) split into the
training state that rank holds (parameters, gradients, optimizer state with any fp32 master
weights: bench/state_memory.py) and the rest (peak minus those), the bytes on the wire per step
(payload and ring-model bytes per rank, measured or computed: bench/wire.py), and the
throughput against DDP's of the same precision, accumulation, data and ranks in the same run.
Then the two ratios: the trainer's step against the bare loop's (same backend, precision,
ranks; synthetic data, no compression or accumulation), and each allreduce's bandwidth against
raw MPI's.
"""

from __future__ import annotations

import statistics

from hpc_train.inspection import text
from hpc_train.train.timing import PARTS

IMAGENET_TRAIN_IMAGES = 1_281_167
OVERHEAD_TARGET = 0.03          # the trainer's step at most 3 % over the bare loop's
ALLREDUCE_TARGET = 0.9          # Horovod's and DDP's gradient allreduce at least 0.9 of MPI's
ALLREDUCE_CHECKED = ("horovod gradients", "ddp buckets")
PART_LABELS = {"data": "data", "compute": "fwd+bwd", "comm": "exposed comm", "optimizer": "optimizer",
               "other": "other"}
SAME_EXCEPT_RANKS = ("kind", "backend", "precision", "compression", "accumulation", "data")
SAME_EXCEPT_BACKEND = ("kind", "precision", "accumulation", "data", "ranks")
STATE_PARTS = ("parameters", "gradients", "optimizer", "master")


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def config_row(config: dict, runs: list[dict]) -> dict:
    """One configuration's row from its results on every rank of every round (`runs`)."""
    per_rank: dict[int, list[dict]] = {}
    for run in runs:
        per_rank.setdefault(run["rank"], []).extend(run["steps"])
    steps = {rank: _median([s["step"] for s in found]) for rank, found in per_rank.items() if found}
    step = max(steps.values(), default=None)
    parts = {part: statistics.fmean(_median([s[part] for s in found]) for found in per_rank.values() if found)
             for part in PARTS} if steps else {part: None for part in PARTS}
    rounds = {run["round"]: _median([s["step"] for s in run["steps"]])
              for run in runs if run["rank"] == 0 and run["steps"]}
    recorded = [run["recorded"] for run in runs]
    first = recorded[0] if recorded else {}
    samples = first.get("samples_per_step")
    rate = samples / step if samples and step else None
    return {**config, "recorded": first,
            "ranks_agree": all(r == first for r in recorded),
            "step_s": step, "images_per_s": rate,
            "epoch_hours": IMAGENET_TRAIN_IMAGES / rate / 3600 if rate else None,
            "parts_s": parts, "round_step_s": [rounds[r] for r in sorted(rounds)],
            "timed_steps": sum(len(run["steps"]) for run in runs if run["rank"] == 0),
            "peak_memory_bytes": max((run["peak_memory_bytes"] for run in runs), default=None),
            "peak_memory_source": runs[0]["peak_memory_source"] if runs else None,
            "memory_split": memory_split(runs),
            "wire": next((run.get("wire") for run in runs if run["rank"] == 0 and run.get("wire")), None)}


def memory_split(runs: list[dict]) -> dict | None:
    """The state split of the rank and round with the largest peak, and the rest of its peak."""
    measured = [run for run in runs if run.get("state_bytes")]
    if not measured:
        return None
    top = max(measured, key=lambda run: run["peak_memory_bytes"])
    state = top["state_bytes"]
    return {**{part: state[part] for part in STATE_PARTS}, "state": state["total"],
            "rest": top["peak_memory_bytes"] - state["total"], "peak": top["peak_memory_bytes"],
            "rank": top["rank"]}


def add_against_ddp(rows: list[dict]) -> None:
    """vs_ddp = samples/s / DDP's of the same kind, precision, accumulation, data and ranks;
    state_vs_ddp = parameter + gradient + optimizer (+ master) bytes / DDP's."""
    ddp = {tuple(r[k] for k in SAME_EXCEPT_BACKEND): r for r in rows
           if r["backend"] == "ddp" and r["compression"] == "none"}
    for row in rows:
        base = ddp.get(tuple(row[k] for k in SAME_EXCEPT_BACKEND))
        rate = base and base["images_per_s"] and row["images_per_s"]
        row["vs_ddp"] = row["images_per_s"] / base["images_per_s"] if rate else None
        split, base_split = row["memory_split"], base and base["memory_split"]
        row["state_vs_ddp"] = split["state"] / base_split["state"] if split and base_split else None


def add_scaling(rows: list[dict]) -> None:
    """efficiency = images/s on N ranks / (N x images/s of the same configuration on 1 rank)."""
    single = {tuple(r[k] for k in SAME_EXCEPT_RANKS): r for r in rows if r["ranks"] == 1}
    for row in rows:
        base = single.get(tuple(row[k] for k in SAME_EXCEPT_RANKS))
        ok = base and base["images_per_s"] and row["images_per_s"]
        row["scaling_efficiency"] = row["images_per_s"] / (row["ranks"] * base["images_per_s"]) if ok else None


def overheads(rows: list[dict]) -> list[dict]:
    # A bare loop reads synthetic images, or the spec's own data where they cannot stand in for it
    # (bench/train_plan.py): its trainer twin is the one on the same data.
    bare = {(r["backend"], r["precision"], r["ranks"], r["data"]): r for r in rows if r["kind"] == "bare"}
    out = []
    for row in rows:
        if (row["kind"], row["compression"], row["accumulation"]) != ("trainer", "none", 1):
            continue
        base = bare.get((row["backend"], row["precision"], row["ranks"], row["data"]))
        if base is None or not base["step_s"] or not row["step_s"]:
            continue
        # Each round's trainer median against the bare loop's of the same round (they ran
        # interleaved), then the median over rounds: load that differs between rounds cancels.
        per_round = [t / b - 1 for t, b in zip(row["round_step_s"], base["round_step_s"]) if t and b]
        overhead = statistics.median(per_round) if per_round else row["step_s"] / base["step_s"] - 1
        out.append({"backend": row["backend"], "precision": row["precision"], "ranks": row["ranks"],
                    "trainer_step_s": row["step_s"], "bare_step_s": base["step_s"],
                    "overhead": overhead, "overhead_per_round": per_round,
                    "overhead_pooled": row["step_s"] / base["step_s"] - 1,
                    "within_target": overhead <= OVERHEAD_TARGET,
                    "trainer_parts_s": row["parts_s"], "bare_parts_s": base["parts_s"]})
    return out


def allreduce_rows(measured: dict | None) -> list[dict]:
    """Bandwidth of each method and its ratio to mpi4py's, from rank 0's medians."""
    if not measured:
        return []
    seconds = measured["seconds"]
    reference = measured["bytes"] / seconds["mpi4py"]
    rows = []
    for method, value in seconds.items():
        bandwidth = measured["bytes"] / value
        rows.append({"method": method, "seconds": value, "algbw_gb_s": bandwidth / 1e9,
                     "vs_mpi": bandwidth / reference,
                     "target": ALLREDUCE_TARGET if method in ALLREDUCE_CHECKED else None,
                     "within_target": bandwidth / reference >= ALLREDUCE_TARGET
                     if method in ALLREDUCE_CHECKED else None})
    return rows


def build(plan: dict, results: list[dict]) -> dict:
    """The report: `results` are the ranks' result files of every launch."""
    runs: dict[str, list[dict]] = {}
    allreduce = None
    for result in results:
        for run in result["configs"]:
            runs.setdefault(run["name"], []).append({**run, "rank": result["rank"],
                                                     "round": result["round"], "host": result["host"]})
        if result.get("allreduce") and result["rank"] == 0:
            allreduce = result["allreduce"]
    rows = [config_row(config, runs.get(config["name"], [])) for config in plan["configs"]]
    add_scaling(rows)
    add_against_ddp(rows)
    return {"settings": plan["settings"], "rows": rows, "overhead": overheads(rows),
            "allreduce": {"measured": allreduce, "rows": allreduce_rows(allreduce)},
            "missing": [r["name"] for r in rows if r["step_s"] is None]}


# ---------------------------------------------------------------- forms


def _num(value, fmt: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, fmt)


COLUMNS = ("configuration", "ranks", "data", "images/s", "ImageNet epoch h", "scaling", "vs ddp",
           "step ms", "data ms", "fwd+bwd ms", "comm ms", "optimizer ms", "other ms", "peak MB",
           "params MB", "grads MB", "optim MB", "master MB", "rest MB", "state vs ddp",
           "payload MB/step", "wire MB/step", "wire")


def columns(report: dict) -> tuple[str, ...]:
    """The table's columns: samples are images, or sequences for text (no ImageNet epoch)."""
    if report["settings"].get("sample", "image") == "image":
        return COLUMNS
    return tuple("sequences/s" if c == "images/s" else c for c in COLUMNS if c != "ImageNet epoch h")


def _mb(value) -> str:
    return _num(value, ".3f", 2 ** -20)


def _state_cells(r: dict) -> list[str]:
    split, wire = r.get("memory_split"), r.get("wire")
    state = [_mb(split[part]) if split else "-" for part in (*STATE_PARTS, "rest")]
    traffic = [_mb(wire["payload_bytes"]), _mb(wire["wire_bytes"]), "+".join(wire["sources"]) or "-"] \
        if wire else ["-", "-", "-"]
    return [*state, _num(r.get("state_vs_ddp"), ".2f"), *traffic]


def table_rows(report: dict) -> list[list[str]]:
    lines = []
    for r in report["rows"]:
        name = f"{r['kind']} {r['backend']} {r['precision']}"
        if r["compression"] != "none":
            name += f" +{r['compression']} compression"
        if r["accumulation"] != 1:
            name += f" accum {r['accumulation']}"
        p = r["parts_s"]
        epoch = [_num(r["epoch_hours"], ".1f")] if report["settings"].get("sample", "image") == "image" else []
        lines.append([name, str(r["ranks"]), r["data"], _num(r["images_per_s"], ".0f"), *epoch,
                      _num(r["scaling_efficiency"], ".2f"), _num(r.get("vs_ddp"), ".2f"),
                      _num(r["step_s"], ".1f", 1e3), *(_num(p[k], ".1f", 1e3) for k in PARTS),
                      _num(r["peak_memory_bytes"], ".0f", 2 ** -20), *_state_cells(r)])
    return lines


def overhead_lines(report: dict) -> list[str]:
    return [f"trainer vs bare loop, {o['backend']} {o['precision']} on {o['ranks']} rank(s): "
            f"{o['trainer_step_s'] * 1e3:.1f} vs {o['bare_step_s'] * 1e3:.1f} ms per step, overhead "
            f"{o['overhead']:+.1%} (median of rounds {', '.join(f'{r:+.1%}' for r in o['overhead_per_round'])}; "
            f"target <= {OVERHEAD_TARGET:.0%}: {'yes' if o['within_target'] else 'NO'})"
            for o in report["overhead"]]


def allreduce_lines(report: dict) -> list[str]:
    measured = report["allreduce"]["measured"]
    if not measured:
        return []
    head = (f"allreduce of {measured['model']}'s gradients ({measured['parameters'] / 1e6:.1f}M float32, "
            f"{measured['bytes'] / 2 ** 20:.0f} MiB), {measured['device']}, torch.distributed "
            f"{measured['torch_backend']}, median of {measured['repetitions']} x {measured['rounds']}:")
    lines = [head]
    for row in report["allreduce"]["rows"]:
        verdict = "" if row["target"] is None else \
            f" (target >= {row['target']}: {'yes' if row['within_target'] else 'NO'})"
        lines.append(f"  {row['method']}: {row['seconds'] * 1e3:.1f} ms, {row['algbw_gb_s']:.2f} GB/s, "
                     f"{row['vs_mpi']:.2f} of mpi4py{verdict}")
    return lines


def header(report: dict) -> str:
    s = report["settings"]
    if s.get("sample") == "sequence":      # a user's dataset sets its own length: not the spec's
        shape = f"{s['seq_len']} tokens" if s.get("seq_len") else "its own sequences"
    else:
        shape = f"{s['image_size']} px"
    return (f"bench train: {s['spec']} ({s['model']}, batch {s['batch_size']} per rank, "
            f"{shape}), {s['launcher']}, {s['hosts']} host(s); {s['warmup']} warm-up + "
            f"{s['steps']} timed steps x {s['rounds']} round(s)")


def markdown(report: dict) -> str:
    names = columns(report)
    rule = ["---"] * len(names)
    table = ["| " + " | ".join(cells) + " |" for cells in (list(names), rule, *table_rows(report))]
    parts = [header(report), "", *table, "", *(f"- {line}" for line in overhead_lines(report)), ""]
    if report["allreduce"]["measured"]:
        parts += ["```", *allreduce_lines(report), "```", ""]
    if report["missing"]:
        parts.append(f"missing (no timed steps): {', '.join(report['missing'])}")
    return "\n".join(parts)


def print_table(report: dict) -> None:
    console = text.print_table(columns(report), table_rows(report), title=header(report))
    for line in overhead_lines(report) + allreduce_lines(report):
        console.print(line, highlight=False)


def save_png(report: dict, path) -> None:
    """Images/s per configuration, and its step split into data, fwd+bwd, comm, optimizer, other."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    rows = [r for r in report["rows"] if r["step_s"]]
    labels = [f"{line[0]} n{line[1]} {line[2]}" for line in table_rows({**report, "rows": rows})]
    figure = Figure(figsize=(14, 0.35 * len(rows) + 2), layout="constrained")
    rate, split = figure.subplots(1, 2, sharey=True)
    positions = list(range(len(rows)))
    rate.barh(positions, [r["images_per_s"] for r in rows], color="tab:blue")
    rate.set_yticks(positions, labels, fontsize=7)
    rate.invert_yaxis()
    rate.set_xlabel("images/s")
    left = [0.0] * len(rows)
    for part in PARTS:
        widths = [(r["parts_s"][part] or 0.0) * 1e3 for r in rows]
        split.barh(positions, widths, left=left, label=PART_LABELS[part])
        left = [a + b for a, b in zip(left, widths)]
    split.set_xlabel("ms per step (median)")
    split.legend(fontsize=7)
    figure.suptitle(header(report), fontsize=9)
    figure.savefig(path, dpi=110)
