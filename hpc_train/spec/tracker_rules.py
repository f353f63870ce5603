"""The rules of log.trackers: a chosen tracker whose package is missing here, settings unused.

A missing package is a warning, not an error: `validate` and `submit` run on the login node,
whose Python may lack wandb or mlflow while the compute nodes' (slurm.setup, a module load, a
site profile) have it. Where the ranks lack it too, rank 0 says so in its log and trains on
without that tracker. The check only looks for the package (importlib.util.find_spec): nothing
is imported on the login node.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import fields

from hpc_train.runtime.tracker_state import TRACKER_PACKAGE, Tracker
from hpc_train.spec.problems import Problem
from hpc_train.spec.schema import JobSpec


def importable(package: str) -> bool:
    """Whether `package` would import in this Python, without importing it."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def tracker_package_here(spec: JobSpec, found=importable) -> Iterator[Problem]:
    for tracker in spec.log.chosen_trackers:
        package = TRACKER_PACKAGE[tracker]
        if tracker is not Tracker.TENSORBOARD and not found(package):
            yield Problem("log.trackers", f"{tracker.value!r}",
                          f"the {package} package does not import on this machine; rank 0 "
                          f"logs no {tracker.value} where the compute nodes lack it too",
                          f"install it where the ranks run (pip install '.[{tracker.value}]', "
                          "env/setup.sh), or remove it from log.trackers")


def tracker_settings_unused(spec: JobSpec) -> Iterator[Problem]:
    """log.wandb or log.mlflow settings with that tracker not chosen: ignored, so said."""
    for tracker in (Tracker.WANDB, Tracker.MLFLOW):
        settings = getattr(spec.log, tracker.value)
        defaults = type(settings)()
        changed = [f.name for f in fields(settings)
                   if getattr(settings, f.name) != getattr(defaults, f.name)]
        if changed and tracker not in spec.log.chosen_trackers:
            yield Problem(f"log.{tracker.value}", f"{', '.join(changed)} without {tracker.value} "
                          "in log.trackers", "these settings only tune that tracker; they are "
                          "ignored", f"add {tracker.value} to log.trackers, or remove the "
                          f"log.{tracker.value} keys")


TRACKER_WARNING_RULES = (tracker_package_here, tracker_settings_unused)
