"""What a change of world size does to the global batch, and keeping it (pure).

A run's position is counted in samples (train/state.Progress), so a resume on other ranks goes
on exactly; what changes is the samples per step (`JobSpec.samples_per_step`: per-replica batch
x replicas x accumulation) and with it the peak LR (the linear rule, `schema.scale_lr`).
`parallel.keep_global_batch` keeps the last checkpoint's samples per step by changing
`parallel.accumulation`, which works where the new replicas x data.batch_size divides it.
A job with a node range (spec/node_range.py) trains each start at its node count the same way
(`fit_to_nodes`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpc_train.parallel.layout import Parallelism
from hpc_train.spec.problems import Problem, SpecInvalid
from hpc_train.spec.schema import JobSpec

KEY = "parallel.keep_global_batch"


@dataclass(frozen=True)
class GlobalBatch:
    """The ranks and samples per step a checkpoint was made with."""

    world_size: int
    samples_per_step: int


def kept_accumulation(spec: JobSpec, last: GlobalBatch) -> int:
    """The parallel.accumulation that gives `spec` the samples per step of `last`; raises
    SpecInvalid (one line: key, value, rule, fix) where none does."""
    per_pass = spec.data.batch_size * spec.replicas
    accumulation, rest = divmod(last.samples_per_step, per_pass)
    pipeline = spec.parallelism is Parallelism.PIPELINE
    if rest == 0 and accumulation >= 1 and (accumulation == 1 or not pipeline):
        return accumulation
    rule = (f"it keeps the last checkpoint's {last.samples_per_step} samples per step, which "
            f"must be a whole multiple of data.batch_size {spec.data.batch_size} x "
            f"{spec.replicas} replica(s) = {per_pass}")
    if pipeline:
        rule += " with parallel.accumulation 1 (the pipeline does not accumulate)"
    fix = (f"resume on ranks whose replicas x data.batch_size divide {last.samples_per_step}, "
           f"or set {KEY}=false (then {per_pass * spec.parallel.accumulation} samples per step, "
           "the peak LR scaled by the linear rule)")
    raise SpecInvalid([Problem(KEY, f"true with {spec.world_size} rank(s)", rule, fix)])


def fit_to_nodes(spec: JobSpec, nodes: int) -> JobSpec:
    """The spec the ranks train with on `nodes` nodes of its range: slurm.nodes `nodes` (the
    range's fewest kept), and under parallel.keep_global_batch the accumulation that keeps the
    written spec's samples per step. Raises SpecInvalid outside the range, or where no
    accumulation keeps them (the submit-time rules of node_range.py refuse such a range)."""
    s = spec.slurm
    if nodes == s.nodes:
        return spec
    if not s.fewest_nodes <= nodes <= s.nodes:
        raise SpecInvalid([Problem("slurm.nodes", f"{s.fewest_nodes}-{s.nodes}",
                                   f"a start on {nodes} node(s) is outside the range",
                                   f"start the ranks on {s.fewest_nodes} to {s.nodes} nodes")])
    fitted = replace(spec, slurm=replace(s, nodes=nodes))
    if not spec.parallel.keep_global_batch:
        return fitted
    accumulation = kept_accumulation(fitted, GlobalBatch(spec.world_size, spec.samples_per_step))
    return replace(fitted, parallel=replace(fitted.parallel, accumulation=accumulation))


def refits(written: JobSpec, spec: JobSpec) -> bool:
    """Whether `spec` is `written` fitted to another node count of its range: a change the range
    permits without consent (`resume --set slurm.nodes=N`, N within it)."""
    try:
        return spec == fit_to_nodes(written, spec.slurm.nodes)
    except SpecInvalid:             # outside the range, or no accumulation keeps the batch
        return False


def keeping(spec: JobSpec, last: GlobalBatch) -> list[str]:
    """The --set overrides that keep `last`'s global batch under `spec` ([] when it has it)."""
    if not spec.parallel.keep_global_batch or spec.samples_per_step == last.samples_per_step:
        return []
    return [f"parallel.accumulation={kept_accumulation(spec, last)}"]


def describe_change(last: GlobalBatch, spec: JobSpec) -> str | None:
    """One line on what the resume does to the global batch; None when nothing changes."""
    now = spec.samples_per_step
    if last.world_size == spec.world_size and last.samples_per_step == now:
        return None
    head = f"world size {last.world_size} -> {spec.world_size}: samples per step "
    if now == last.samples_per_step:
        return (head + f"{now} kept (accumulation {spec.parallel.accumulation}), "
                f"peak LR {spec.scaled_lr:.4g} unchanged")
    return (head + f"{last.samples_per_step} -> {now} (data.batch_size {spec.data.batch_size} x "
            f"{spec.replicas} replica(s) x accumulation {spec.parallel.accumulation}), peak LR "
            f"x{now / last.samples_per_step:.3g} by the linear rule (now {spec.scaled_lr:.4g}); "
            f"{KEY}: true keeps the samples per step where they divide")
