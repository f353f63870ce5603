"""Write a run's checkpoint as a standalone model file, whole or not at all.

state_dict: `{"state_dict": {torchvision name: tensor}, "meta": {...}}`, nothing but tensors,
strings, numbers and lists, so `torch.load(path, weights_only=True)` reads it without hpc_train.
torchscript: the scripted model with the metadata as an extra file (`torch.jit.load`).
The weights are the checkpoint's replicated ones with rank 0's BatchNorm statistics, as a resumed
run would start from.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from hpc_train.data.manifest import train_class_names
from hpc_train.errors import UsageError
from hpc_train.export.meta import META_FILE, export_meta
from hpc_train.rundir import write_atomic
from hpc_train.train.saved_run import SavedCheckpoint, choose_step, open_run

FORMATS = ("state_dict", "torchscript")


@dataclass(frozen=True)
class Exported:
    path: Path
    step: int
    meta: dict


def _check_output(output: str | os.PathLike) -> Path:
    path = Path(output)
    if path.is_dir() or not path.parent.is_dir():
        raise UsageError(f"-o {output}: give a file in an existing directory (e.g. -o model.pt)")
    return path


def _torchscript_bytes(model: torch.nn.Module, meta: dict) -> bytes:
    try:
        scripted = torch.jit.script(model)
    except Exception as exc:  # noqa: BLE001 - TorchScript raises many kinds; all mean "does not script"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"--format torchscript: model {meta['model']} does not script ({first}). "
                         "Fix: use --format state_dict") from None
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer, _extra_files={META_FILE: json.dumps(meta)})
    return buffer.getvalue()


def export_run(run_dir: str, output: str | os.PathLike, step: int | None = None,
               fmt: str = "state_dict") -> Exported:
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt}: one of {', '.join(FORMATS)}")
    path = _check_output(output)
    paths, spec = open_run(run_dir)
    step = choose_step(paths, step)
    saved = SavedCheckpoint(paths, spec, step)
    model = saved.model()
    # Shards not visible from here: the file says so with an empty list of class names.
    names = train_class_names(spec.data.path) if spec.data.kind == "hdf5" else None
    meta = export_meta(spec, step=step, spec_hash=saved.spec_hash, run_dir=str(paths.root),
                       class_names=names, fmt=fmt)
    if fmt == "torchscript":
        data = _torchscript_bytes(model, meta)
    else:
        buffer = io.BytesIO()
        state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
        torch.save({"state_dict": state, "meta": meta}, buffer)
        data = buffer.getvalue()
    write_atomic(path, data)
    return Exported(path, step, meta)
