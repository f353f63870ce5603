"""`report`'s timeline: each start of the run on the wall clock, with its checkpoints, stops and
requeues (headless: matplotlib's Agg backend, imported only here)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from hpc_train import events as ev
from hpc_train.inspection.efficiency import Restart, Window

_COLOURS = {"COMPLETED": "tab:green", "REQUEUED": "tab:orange", "RUNNING": "tab:blue",
            "PREEMPTED": "tab:orange"}
_FAILED = "tab:red"


def build_timeline(windows: list[Window], restarts: list[Restart], events: list[dict], now: float,
                   title: str):
    """A Figure (returned, not saved, so tests can look at it): one row of run segments with
    the queue waits between them, one row of checkpoint saves, stops and requeues marked."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    def at(t: float) -> datetime:
        return datetime.fromtimestamp(t)

    figure = Figure(figsize=(12, 3.6), layout="constrained")
    ax = figure.subplots()
    ax.set_title(title)
    for k, w in enumerate(windows):
        end = w.end if w.end is not None else now
        colour = _COLOURS.get(w.state, _FAILED)
        ax.barh(1, at(end) - at(w.start), left=at(w.start), height=0.5, color=colour, alpha=0.8,
                label=w.state)
        ax.text(at(w.start + (end - w.start) / 2), 1, f"#{k} {w.state}", ha="center", va="center",
                fontsize=8)
    for r in restarts:
        ax.barh(1, at(r.started) - at(r.stopped), left=at(r.stopped), height=0.5, color="lightgrey",
                hatch="//", label="queue wait")
        if r.training is not None:
            ax.barh(1, at(r.training) - at(r.started), left=at(r.started), height=0.5, color="grey",
                    alpha=0.6, label="start-up")
    marks = [(ev.CHECKPOINT_SAVED, "|", "black", "checkpoint saved"),
             (ev.STOP_REQUESTED, "v", "tab:red", "stop requested"),
             (ev.STOP_SAVED, "s", "tab:red", "stop saved"),
             (ev.REQUEUED, "x", "tab:orange", "requeued")]
    for name, marker, colour, label in marks:
        times = [at(e["time"]) for e in ev.named(events, name)]
        if times:
            ax.plot(times, [0] * len(times), marker, color=colour, markersize=10, label=label,
                    linestyle="none")
    ax.set_yticks([0, 1], ["events", "run segments"])
    ax.set_ylim(-0.6, 1.6)
    ax.set_xlabel("wall clock")
    ax.grid(axis="x", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    figure.autofmt_xdate()
    return figure


def write_timeline(figure, output: Path) -> Path:
    figure.savefig(output, dpi=100)
    return output
