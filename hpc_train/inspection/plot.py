"""`plot`: loss, accuracy, LR and throughput against step, requeue points marked (headless)."""

from __future__ import annotations

from pathlib import Path

from hpc_train import events as ev
from hpc_train.inspection.summary import THROUGHPUT_FIELDS
from hpc_train.rundir import RunPaths, read_jsonl


def build_figure(metrics: list[dict], events: list[dict], title: str):
    """A Figure with four panels; returned (not saved) so tests can look at its axes."""
    import matplotlib

    matplotlib.use("Agg")             # no display on a login node
    from matplotlib.figure import Figure

    train = [m for m in metrics if m.get("split") is None and "step" in m]
    val = [m for m in metrics if m.get("split") == "val"]
    flow = next(((f, u) for f, u in THROUGHPUT_FIELDS if any(f in m for m in train)), None)
    figure = Figure(figsize=(10, 7), layout="constrained")
    figure.suptitle(title)
    axes = figure.subplots(2, 2, sharex=True).ravel()
    panels = [("loss", [("train", train, "loss"), ("val", val, "loss")]),
              ("accuracy (val)", [("val", val, "accuracy")]),
              ("learning rate", [("lr", train, "lr")]),
              (flow[1] if flow else "throughput", [("rank 0 view", train, flow[0])] if flow else [])]
    for ax, (label, series) in zip(axes, panels):
        for name, rows, key in series:
            points = [(m["step"], m[key]) for m in rows if isinstance(m.get(key), (int, float))]
            if points:
                ax.plot(*zip(*points), marker="." if name == "val" else None, label=name)
        for step in ev.resumed_steps(events):   # a later run resumed (requeue or resume)
            ax.axvline(step, color="grey", linestyle="--", linewidth=0.8)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend()
    for ax in axes[2:]:
        ax.set_xlabel("step  (dashed: resumed after a requeue)")
    return figure


def plot_run(paths: RunPaths, output: Path):
    figure = build_figure(read_jsonl(paths.metrics), ev.read(paths), paths.root.name)
    figure.savefig(output, dpi=100)
    return figure
