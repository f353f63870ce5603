"""Rebuild the model of a file that `export` wrote (either format)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import torch

from hpc_train.errors import UsageError
from hpc_train.export.meta import FORMAT, META_FILE
from hpc_train.models import build_model


def is_torchscript(path: Path) -> bool:
    """TorchScript archives hold the model's code; torch.save'd dicts do not."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any("/code/" in name for name in archive.namelist())
    except zipfile.BadZipFile:
        return False


def load_exported(path, map_location="cpu") -> tuple[torch.nn.Module, dict]:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    if is_torchscript(path):
        extra = {META_FILE: ""}
        model = torch.jit.load(str(path), map_location=map_location, _extra_files=extra)
        return model.eval(), json.loads(extra[META_FILE])
    saved = torch.load(path, map_location=map_location, weights_only=True)
    meta = saved.get("meta", {}) if isinstance(saved, dict) else {}
    if meta.get("format") != FORMAT:
        raise UsageError(f"{path}: not a file that `python -m hpc_train export` wrote")
    model = build_model(meta["model"], meta["num_classes"], meta["model_options"])
    model.load_state_dict(saved["state_dict"])
    return model.eval(), meta
