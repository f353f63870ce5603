"""Which data `evaluate` reads, checked before any model is loaded: a clear line, exit 2."""

from __future__ import annotations

import re
from pathlib import Path

from hpc_train.data.manifest import train_class_names
from hpc_train.errors import UsageError

_SPLIT = re.compile(r"[A-Za-z0-9_-]+")    # it becomes part of a file name


def check_split(split: str) -> str:
    if not _SPLIT.fullmatch(split):
        raise UsageError(f"--split {split!r}: a split is a name of letters, digits, _ and - "
                         "(a folder of the shards, e.g. val or train)")
    return split


def _shard_root(spec, split: str, data: str | None) -> Path | None:
    if spec.data.kind != "hdf5":
        if data is not None:
            raise UsageError(f"--data {data}: the run trains on {spec.data.kind} data; --data "
                             "takes HDF5 shards and goes with runs on hdf5 data")
        return None
    root = Path(data if data is not None else spec.data.path)
    if (root / split / "manifest.json").is_file():
        return root
    if data is not None:
        raise UsageError(f"--data {data}: no {root / split / 'manifest.json'}. Fix: give the "
                         f"directory that `data shard --out` wrote (it holds {split}/ with its "
                         "manifest)")
    splits = sorted(p.parent.name for p in root.glob("*/manifest.json"))
    raise UsageError(f"--split {split}: the run's data.path {root} has no {split}/manifest.json "
                     f"(its splits: {', '.join(splits) or 'none visible from here'}). Fix: "
                     f"--split one of those, or --data a shard directory that has {split}/")


def check_task(spec) -> None:
    """`evaluate` reports a classifier's figures (top-1, top-5, per class); a run of another
    task has its validation figures in metrics.jsonl, written by the trainer."""
    from hpc_train.spec.schema import TaskKind

    kind = spec.task_kind
    if kind is not TaskKind.CLASSIFICATION:
        what = spec.task.name if kind is TaskKind.OWN else kind.value
        raise UsageError(f"evaluate reports classification runs; this run's task is {what}. Its "
                         "validation loss (and its step's metrics) are the split: val lines of "
                         "metrics.jsonl, or `python -m hpc_train status RUN_DIR`")


def evaluation_data(spec, split: str, data: str | None):
    """(dataset, class names or None, where the samples come from) for `evaluate`."""
    from hpc_train.train.data import evaluation_dataset

    check_task(spec)
    check_split(split)
    root = _shard_root(spec, split, data)
    if root is None:    # synthetic
        if split not in ("train", "val") or (split == "val" and not spec.data.val_samples):
            raise UsageError(f"--split {split}: the run's synthetic data has no such split "
                             "(train, or val when data.val_samples > 0)")
        return evaluation_dataset(spec, split), None, f"synthetic {split}"
    dataset = evaluation_dataset(spec, split, root)
    names = dataset.class_names
    trained = train_class_names(spec.data.path) if data is not None else None
    if len(names) != spec.data.num_classes or (trained is not None and names != trained):
        raise UsageError(f"{root / split}: its {len(names)} classes are not the "
                         f"{spec.data.num_classes} the run was trained on (names and order must "
                         "match: convert with `data shard --classes <train manifest>`)")
    if len(dataset) == 0:
        raise UsageError(f"{root / split} holds no samples")
    return dataset, names, str(root / split)
