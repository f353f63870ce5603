"""Relative paths in a spec mean "from where you submitted": make them absolute at submit time.

A batch job may start in another directory (and a requeued one certainly may), so the resolved
spec saved in the run directory carries absolute paths only.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from hpc_train.spec.schema import JobSpec

# (section, field) of every path-valued field; and run.code, a list of paths.
PATH_FIELDS = (("run", "root"), ("data", "path"), ("slurm", "site_profile"))


def resolve_paths(spec: JobSpec, base: str | Path | None = None) -> JobSpec:
    base = Path(base or os.getcwd())
    code = [str((base / Path(folder).expanduser()).resolve()) for folder in spec.run.code]
    spec = dataclasses.replace(spec, run=dataclasses.replace(spec.run, code=code))
    for section_name, field in PATH_FIELDS:
        section = getattr(spec, section_name)
        value = getattr(section, field)
        if value is None or Path(value).is_absolute():
            continue
        absolute = str((base / Path(value).expanduser()).resolve())
        spec = dataclasses.replace(spec, **{section_name: dataclasses.replace(section, **{field: absolute})})
    return spec
