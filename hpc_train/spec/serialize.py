"""The resolved spec as plain data, YAML (saved as spec.yaml in the run directory) and a hash.

The hash is recorded in checkpoints: resuming with a different resolved spec is visible. It
covers every field, defaults included, so adding a field to the schema changes every hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from hpc_train.spec.node_range import spelled
from hpc_train.spec.schema import JobSpec
from hpc_train.spec.yaml_io import dump_yaml

_HEADER = ("# Resolved job spec (file + --set overrides + defaults), written by hpc_train.\n"
           "# Loading this file gives the same spec and the same spec hash.\n")


def spec_to_dict(spec: JobSpec) -> dict:
    """Sections -> fields -> values, in schema order; lists and dicts are copies."""
    return dataclasses.asdict(spec)


def spec_hash(spec: JobSpec) -> str:
    """sha256 (hex) of the canonical JSON of the resolved spec: sorted keys, no spaces."""
    canonical = json.dumps(spec_to_dict(spec), sort_keys=True, separators=(",", ":"),
                           ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def dump_spec_yaml(spec: JobSpec) -> str:
    """The resolved spec as YAML text; load_spec on it gives an equal spec."""
    return _HEADER + f"# spec hash: {spec_hash(spec)}\n" + dump_yaml(spec_to_dict(spec))


def describe_spec(spec: JobSpec) -> str:
    """A short human summary: what `validate` prints on success."""
    slurm, gpus = spec.slurm, f"{spec.slurm.gpus_per_node} GPU(s)/node" if spec.uses_gpu else "CPU"
    pipe = spec.parallel.pipeline
    nodes, world = spelled(spec), spec.world_size
    if slurm.fewest_nodes < slurm.nodes:   # a range: the ranks of its fewest to its most nodes
        world = f"{slurm.fewest_nodes * slurm.tasks_per_node}-{world}"
    if spec.uses_pipeline:
        batch = (f"samples/step: {spec.samples_per_step} = {spec.data.batch_size} per replica x "
                 f"{spec.replicas} replica(s) x {spec.parallel.accumulation} accumulation",
                 f"pipeline:     {pipe.stages} stages x {spec.replicas} replica(s), "
                 f"{pipe.microbatches} micro-batches, {pipe.schedule}, balance {pipe.balance}"
                 + (", remat" if pipe.remat else ""))
    else:
        batch = (f"samples/step: {spec.samples_per_step} = {spec.data.batch_size} per rank x "
                 f"{spec.world_size} rank(s) x {spec.parallel.accumulation} accumulation",)
    return "\n".join([
        f"run:          {spec.run.name}",
        f"world size:   {world} = {nodes} node(s) x {slurm.tasks_per_node} task(s) ({gpus})",
        *batch,
        f"scaled LR:    {spec.scaled_lr:g} (base {spec.optim.base_lr:g} per 256 samples)",
        f"precision:    {spec.precision.mode}",
        f"backend:      {spec.parallel.backend}",
        f"time limit:   {slurm.time} ({slurm.time_minutes} min)",
        f"spec hash:    {spec_hash(spec)[:16]}",
    ])
