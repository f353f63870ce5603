"""The evaluation document (eval-<split>-<step>.json) and its text form: pure functions."""

from __future__ import annotations

import time

from hpc_train.train.evaluation import totals_summary


def per_class(pairs: list[tuple[int, int]], class_names: list[str] | None) -> list[dict]:
    """[(correct, samples)] per class index -> one entry per class; accuracy None for none."""
    names = class_names or [str(i) for i in range(len(pairs))]
    return [{"index": i, "class": names[i], "samples": n, "accuracy": c / n if n else None}
            for i, (c, n) in enumerate(pairs)]


def build_report(totals, num_classes: int, class_names: list[str] | None, *, run_dir: str,
                 split: str, step: int, data: str, spec_hash: str, model: str, ranks: int,
                 trained_ranks: int, seconds: float) -> dict:
    figures = totals_summary(totals, num_classes)
    return {
        "run_dir": run_dir, "split": split, "step": step, "data": data, "model": model,
        "spec_hash": spec_hash, "samples": figures["samples"], "loss": figures["loss"],
        "accuracy": figures["accuracy"], "top5_accuracy": figures["top5_accuracy"],
        "images_per_s": figures["samples"] / seconds if seconds > 0 else None,
        "seconds": seconds, "ranks": ranks, "trained_ranks": trained_ranks, "time": time.time(),
        "per_class": per_class(figures["per_class"], class_names),
    }


def render_text(report: dict, path) -> str:
    """A few lines for people; the weakest classes, since a thousand would not help."""
    lines = [f"{report['run_dir']} step {report['step']}, {report['split']} "
             f"({report['samples']} samples of {report['data']}, {report['ranks']} rank(s))",
             f"  top-1 accuracy {report['accuracy']:.4f}   top-5 accuracy "
             f"{report['top5_accuracy']:.4f}   loss {report['loss']:.4f}",
             f"  {report['images_per_s']:.1f} images/s ({report['seconds']:.1f} s)"]
    rated = sorted((c for c in report["per_class"] if c["samples"]), key=lambda c: c["accuracy"])
    if rated:
        weakest = ", ".join(f"{c['class']} {c['accuracy']:.2f}" for c in rated[:5])
        lines.append(f"  weakest classes: {weakest}")
    lines.append(f"  per-class accuracy and all figures: {path}")
    return "\n".join(lines)
