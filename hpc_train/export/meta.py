"""The metadata of an exported model: what a user needs to rebuild it and feed it."""

from __future__ import annotations

import dataclasses

from hpc_train import __version__
from hpc_train.data.transforms import CROP_FRACTION, IMAGENET_MEAN, IMAGENET_STD
from hpc_train.models.catalog import model as catalog_entry

FORMAT = "hpc_train.export"
FORMAT_VERSION = 1
META_FILE = "hpc_train_meta.json"   # TorchScript: the metadata as an extra file of the archive


def model_options(name: str, given: dict) -> dict:
    """Every option of the model, the catalog's defaults filled in: the file does not depend on
    today's defaults."""
    entry = catalog_entry(name)
    if entry.own:    # the user's model: its keyword arguments as given, nothing to fill in
        return dict(given)
    chosen = entry.options(**given)
    return {f.name: getattr(chosen, f.name) for f in dataclasses.fields(chosen)}


def export_meta(spec, *, step: int, spec_hash: str, run_dir: str, class_names: list[str] | None,
                fmt: str) -> dict:
    size = spec.data.image_size
    images = spec.data.kind == "hdf5"
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "file_format": fmt,
        "hpc_train_version": __version__,
        "model": spec.model.name, "model_options": model_options(spec.model.name, spec.model.options),
        # What the model computes (classification, causal_lm, own): the image fields below
        # describe a classifier's input only.
        "task": spec.task_kind.value,
        "num_classes": spec.data.num_classes, "class_names": list(class_names or []),
        "parameter_names": "torchvision",
        "input_size": [3, size, size],
        # Validation preprocessing of hdf5 runs: resize the shorter side, centre crop, RGB in
        # 0..1, then (x - mean) / std. Synthetic runs feed their tensors as they are.
        "resize_size": int(size / CROP_FRACTION) if images else size, "crop_size": size,
        "mean": list(IMAGENET_MEAN) if images else [0.0, 0.0, 0.0],
        "std": list(IMAGENET_STD) if images else [1.0, 1.0, 1.0],
        "data_kind": spec.data.kind,
        "run_dir": run_dir, "step": step, "spec_hash": spec_hash,
    }
