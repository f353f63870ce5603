"""`slurm.nodes` as a range, Slurm's own MIN-MAX: its spelling and its rules (pure).

A job with a range starts on what Slurm gives within it and, when a node dies, goes on with the
nodes left (job/driver.py), down to the fewest; each start trains the written spec fitted to its
node count (spec/global_batch.fit_to_nodes). `slurm.nodes: 1-2` is read as slurm.nodes 2 and
slurm.min_nodes 1 before the schema is walked, so the resolved spec, its dump and its hash hold
the two numbers; it is a spelling, not a deprecated key, so it warns of nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from hpc_train.parallel.layout import Parallelism, ParallelLayout
from hpc_train.spec.global_batch import KEY as KEEP_KEY, fit_to_nodes
from hpc_train.spec.problems import Problem, SpecInvalid, value_problem
from hpc_train.spec.schema import JobSpec

KEY = "slurm.nodes"
_RANGE = re.compile(r"\s*(\d+)\s*-\s*(\d+)\s*")


def split_node_range(data: dict) -> tuple[dict, list[Problem]]:
    """(data with a range `slurm.nodes: MIN-MAX` read as nodes MAX and min_nodes MIN, problems);
    `data` itself is not changed. A wrong range is left out of the data, so that it is reported
    once, here. Any other value is the schema's to check."""
    section = data.get("slurm")
    if not isinstance(section, dict) or not isinstance(section.get("nodes"), str) \
            or "-" not in section["nodes"]:
        return data, []
    text, rest = section["nodes"], {k: v for k, v in section.items() if k != "nodes"}
    match = _RANGE.fullmatch(text)
    fewest, most = (int(match[1]), int(match[2])) if match else (0, 0)
    if not 1 <= fewest <= most:
        example = f"{most}-{fewest}" if 1 <= most < fewest else "1-2"
        return {**data, "slurm": rest}, [value_problem(
            KEY, text, "a node range is Slurm's MIN-MAX: two whole numbers, 1 <= MIN <= MAX",
            f"write e.g. {KEY}: {example}, or one number of nodes")]
    return {**data, "slurm": {**rest, "nodes": most, "min_nodes": fewest}}, []


def spelled(spec: JobSpec) -> str:
    """slurm.nodes as the user writes it: "2", or "1-2" for a range."""
    s = spec.slurm
    return f"{s.fewest_nodes}-{s.nodes}" if s.fewest_nodes != s.nodes else str(s.nodes)


def fewest_within(spec: JobSpec) -> Iterator[Problem]:
    s = spec.slurm
    if s.fewest_nodes > s.nodes:
        yield Problem(KEY, f"{s.nodes} with slurm.min_nodes {s.min_nodes}",
                      "the fewest nodes of a range cannot exceed its most",
                      f"set {KEY}: {s.min_nodes} or more, or write the range as {KEY}: MIN-MAX")


def _counts(spec: JobSpec) -> range:
    """The node counts of the range other than the written one (whose own rules check it)."""
    return range(spec.slurm.fewest_nodes, spec.slurm.nodes)


def pipelines_at_every_count(spec: JobSpec) -> Iterator[Problem]:
    """Every start of the range must form whole pipelines (the written count: whole_pipelines)."""
    s, stages = spec.slurm, spec.parallel.pipeline.stages
    bad = [n for n in _counts(spec) if ParallelLayout.problem(n * s.tasks_per_node, stages)]
    if bad:
        yield Problem(KEY, f"{spelled(spec)} with parallel.pipeline.stages {stages} and "
                      f"slurm.tasks_per_node {s.tasks_per_node}",
                      f"on {bad[0]} node(s) the {bad[0] * s.tasks_per_node} ranks cannot form "
                      f"pipelines of {stages} stages: every node count of the range must give a "
                      "multiple of the stage count",
                      f"set slurm.tasks_per_node to a multiple of {stages}, or {KEY}: {s.nodes} "
                      "(no range)")


def global_batch_at_every_count(spec: JobSpec) -> Iterator[Problem]:
    """parallel.keep_global_batch must find its accumulation at every node count of the range."""
    if not spec.parallel.keep_global_batch:
        return
    s = spec.slurm
    for nodes in _counts(spec):
        if ParallelLayout.problem(nodes * s.tasks_per_node, spec.parallel.pipeline.stages):
            continue                # pipelines_at_every_count reports it
        try:
            fit_to_nodes(spec, nodes)
        except SpecInvalid:
            per_pass = spec.data.batch_size * nodes * s.tasks_per_node // spec.parallel.pipeline.stages
            yield Problem(KEY, f"{spelled(spec)} with {KEEP_KEY} true",
                          f"on {nodes} node(s) no parallel.accumulation keeps the "
                          f"{spec.samples_per_step} samples per step of {s.nodes} nodes: "
                          f"data.batch_size x replicas = {per_pass} samples per pass"
                          + (" and the pipeline does not accumulate" if spec.parallelism is
                             Parallelism.PIPELINE else " does not divide them"),
                          f"use a range whose node counts all divide the samples per step, or "
                          f"{KEY}: {s.nodes} (no range), or {KEEP_KEY}: false")
            return


NODE_RANGE_ERROR_RULES = (fewest_within, pipelines_at_every_count, global_batch_at_every_count)
