"""'Did you mean ...?' for unknown keys: a typo, a key in the wrong section, or a name used by
other tools (timm's `lr`, Slurm's `ntasks_per_node`). Suggestions are only hints; the valid
keys are always listed too.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import get_type_hints

from hpc_train.spec.schema import JobSpec

# Names people bring from other tools -> our dotted key. Matched fuzzily, like our own keys.
ALIASES = {
    "lr": "optim.base_lr", "learning_rate": "optim.base_lr", "wd": "optim.weight_decay",
    "optimizer": "optim", "opt": "optim.name", "sched": "optim.schedule",
    "lr_schedule": "optim.schedule", "warmup": "optim.warmup_epochs",
    "smoothing": "optim.label_smoothing", "clip_grad": "optim.grad_clip",
    "ntasks_per_node": "slurm.tasks_per_node", "ntasks": "slurm.tasks_per_node",
    "gpus": "slurm.gpus_per_node", "gres": "slurm.gpus_per_node", "time_limit": "slurm.time",
    "cpus": "slurm.cpus_per_task", "memory": "slurm.mem", "num_workers": "data.workers",
    "dataset": "data", "arch": "model.name", "amp": "precision.mode", "dtype": "precision.mode",
    "fp16": "precision.mode", "distributed": "parallel", "grad_accum": "parallel.accumulation",
    "accumulate": "parallel.accumulation", "env_vars": "launch.env", "modules": "slurm.setup",
    "logging": "log", "ckpt": "checkpoint", "checkpointing": "checkpoint",
}


def _all_keys() -> dict[str, str]:
    """Every field name -> its dotted key ('batch_size' -> 'data.batch_size'); sections too."""
    keys: dict[str, str] = {}
    sections = get_type_hints(JobSpec)
    for section in dataclasses.fields(JobSpec):
        keys.setdefault(section.name, section.name)
        for leaf in dataclasses.fields(sections[section.name]):
            keys.setdefault(leaf.name, f"{section.name}.{leaf.name}")
    return keys


def suggest_key(unknown: str, prefix: str, valid: list[str]) -> str | None:
    """The dotted key the user most likely meant, or None."""
    word = unknown.lower()
    close = difflib.get_close_matches(word, valid, n=1, cutoff=0.6)
    if close:
        return prefix + close[0]
    everywhere = _all_keys()
    if word in everywhere:
        return everywhere[word]
    alias = difflib.get_close_matches(word, list(ALIASES), n=1, cutoff=0.75)
    if alias:
        return ALIASES[alias[0]]
    far = difflib.get_close_matches(word, list(everywhere), n=1, cutoff=0.8)
    return everywhere[far[0]] if far else None
