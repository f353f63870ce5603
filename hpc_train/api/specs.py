"""A spec as the API and the CLI take it (a YAML file, a dict or a JobSpec), checked for submission.

One way in for `validate`, `submit`, `render` and `hpc_train.submit`: the same strict load,
the same --set overrides, the same capacity check before the queue (spec/capacity.py) and the
same warnings, so a spec the command line refuses is refused from a notebook in the same words.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Union

from hpc_train.argtypes import print_warnings
from hpc_train.spec import JobSpec, SpecInvalid, build_spec, spec_to_dict, validate_spec_file
from hpc_train.spec.capacity import check_capacity
from hpc_train.spec.code_refs import check_code
from hpc_train.spec.paths import resolve_paths
from hpc_train.spec.problems import Problem, show

# What `spec` may be: a path to a YAML spec, its parsed mapping, or a JobSpec.
SpecSource = Union[str, os.PathLike, Mapping, JobSpec]


def read_spec(spec: SpecSource, overrides: Iterable[str] = ()) -> tuple[JobSpec, list[Problem]]:
    """(spec, warnings) with KEY=VALUE overrides applied; SpecInvalid listing every problem.
    A JobSpec is checked again like a file (it may have been built by hand)."""
    overrides = list(overrides)
    if isinstance(spec, (str, os.PathLike)):
        return validate_spec_file(spec, overrides)
    data = spec_to_dict(spec) if isinstance(spec, JobSpec) else spec
    if not isinstance(data, Mapping):
        raise SpecInvalid([Problem("spec", show(spec), "a spec is a YAML file's path, a dict of "
                                   "sections or a JobSpec", "pass one of those")])
    built, errors, warnings = build_spec(dict(data), overrides)
    if built is None:
        raise SpecInvalid(errors)
    return built, warnings


def checked_spec(spec: SpecSource, overrides: Iterable[str] = (), ask_slurm: bool = True,
                 notes: bool = True) -> JobSpec:
    """The spec with overrides applied, checked against what it will run on (the training
    split's manifest; the partition's nodes when `ask_slurm` and sinfo answers). Warnings (and,
    with `notes`, what could not be checked) go to stderr; SpecInvalid (exit 2) on problems."""
    loaded, warnings = read_spec(spec, overrides)
    print_warnings(warnings)
    check_code(loaded)
    said = check_capacity(loaded, ask_slurm=ask_slurm)
    for note in said if notes else ():
        print(f"note: {note}", file=sys.stderr)
    return loaded


def submission_spec(spec: SpecSource, overrides: Iterable[str] = (), ask_slurm: bool = True) -> JobSpec:
    """The checked spec with absolute paths, as a job gets it; warns when the shards are not
    visible from here."""
    # A submission that cannot ask Slurm says so itself, in one line: no notes here.
    resolved = resolve_paths(checked_spec(spec, overrides, ask_slurm, notes=False))
    data = resolved.data
    if data.kind in ("hdf5", "tokens") and not (Path(data.path) / "train" / "manifest.json").is_file():
        # A warning, not an error: compute nodes may mount paths this login node does not see.
        command = "data shard" if data.kind == "hdf5" else "data tokenize"
        print(f"warning: data.path: no {data.path}/train/manifest.json visible from here; "
              "the job fails at start unless the compute nodes see it. Fix: convert the data with "
              f"`python -m hpc_train {command} --out` that directory", file=sys.stderr)
    return resolved
