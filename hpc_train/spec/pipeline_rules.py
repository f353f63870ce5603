"""Cross-field rules of the gpt model, token data and pipeline parallelism (item 6 of the
pipeline issue): each names the rule, the values and the fix, at submit time.

A wrong combination here would otherwise hang the job (ranks that do not form whole pipelines,
micro-batches that do not split the batch) or fail only after the queue wait.
"""

from __future__ import annotations

from collections.abc import Iterator

from hpc_train.models.catalog import GptOptions
from hpc_train.parallel.layout import Parallelism, ParallelLayout
from hpc_train.spec.problems import Problem
from hpc_train.spec.schema import BYTE_VOCAB, TOKEN_KINDS, JobSpec


def gpt_options(spec: JobSpec) -> GptOptions:
    """The gpt options the builder will use: those given, the catalog's defaults for the rest."""
    return GptOptions(**spec.model.options)


def gpt_blocks(spec: JobSpec) -> int:
    """Blocks of the gpt block list [embedding, layer x N, head]: N + 2; 0 for other models."""
    return gpt_options(spec).layers + 2 if spec.model.name == "gpt" else 0


def model_matches_data(spec: JobSpec) -> Iterator[Problem]:
    gpt, tokens = spec.model.name == "gpt", spec.data.kind in TOKEN_KINDS
    if gpt and not tokens:
        yield Problem("data.kind", f"{spec.data.kind!r} with model.name 'gpt'",
                      "the gpt model trains on token sequences, not images",
                      "set data.kind: text (a generated corpus) or data.kind: tokens "
                      "(shards from `python -m hpc_train data tokenize`)")
    if tokens and not gpt:
        yield Problem("model.name", f"{spec.model.name!r} with data.kind {spec.data.kind!r}",
                      "token data needs a language model", "set model.name: gpt")


def byte_vocabulary(spec: JobSpec) -> Iterator[Problem]:
    if spec.data.kind in TOKEN_KINDS and spec.data.vocab_size != BYTE_VOCAB:
        yield Problem("data.vocab_size", f"{spec.data.vocab_size} with data.kind "
                      f"{spec.data.kind!r}", f"byte tokens take {BYTE_VOCAB} values, the "
                      "vocabulary of the gpt model", f"set data.vocab_size: {BYTE_VOCAB}")


def heads_divide_width(spec: JobSpec) -> Iterator[Problem]:
    if spec.model.name != "gpt":
        return
    options = gpt_options(spec)
    if options.dim % options.heads:
        fits = max(h for h in range(1, options.heads) if options.dim % h == 0)
        yield Problem("model.options.heads", f"{options.heads} with model.options.dim {options.dim}",
                      "each attention head takes dim / heads channels, so heads must divide dim",
                      f"set model.options.heads: {fits}, or a dim that {options.heads} divides")


def pipeline_needs_gpt(spec: JobSpec) -> Iterator[Problem]:
    if spec.uses_pipeline and spec.model.name != "gpt":
        yield Problem("parallel.pipeline.stages", f"{spec.parallel.pipeline.stages} with "
                      f"model.name {spec.model.name!r}", "pipeline stages cut the gpt block list; "
                      "other models train data-parallel only",
                      "set model.name: gpt, or parallel.pipeline.stages: 1")


def whole_pipelines(spec: JobSpec) -> Iterator[Problem]:
    stages, world = spec.parallel.pipeline.stages, spec.world_size
    problem = ParallelLayout.problem(world, stages)    # the same check every rank's layout makes
    if problem is not None:
        yield Problem("parallel.pipeline.stages", f"{stages} with {world} ranks "
                      f"(slurm.nodes {spec.slurm.nodes} x slurm.tasks_per_node "
                      f"{spec.slurm.tasks_per_node})", problem.rule,
                      f"use {problem.fitting_world} ranks (slurm.nodes x slurm.tasks_per_node), "
                      f"or a stage count that divides {world}")


def microbatches_split_batch(spec: JobSpec) -> Iterator[Problem]:
    micro, batch = spec.parallel.pipeline.microbatches, spec.data.batch_size
    if spec.parallelism is not Parallelism.PIPELINE or batch % micro == 0:
        return
    divisors = [d for d in range(1, batch + 1) if batch % d == 0]
    yield Problem("parallel.pipeline.microbatches", f"{micro} with data.batch_size {batch}",
                  "the micro-batch count must divide the per-replica batch, or the last "
                  "micro-batch differs in shape and the stages disagree",
                  f"use one of {divisors} micro-batches, or a batch size that {micro} divides")


def one_f_one_b_depth(spec: JobSpec) -> Iterator[Problem]:
    pipe = spec.parallel.pipeline
    if spec.uses_pipeline and pipe.schedule == "1f1b" and pipe.microbatches < pipe.stages:
        yield Problem("parallel.pipeline.microbatches", f"{pipe.microbatches} with schedule "
                      f"'1f1b' and {pipe.stages} stages", "1F1B needs at least one micro-batch "
                      "per stage (M >= K) to fill the pipeline",
                      f"set parallel.pipeline.microbatches: {pipe.stages} or more, or "
                      "parallel.pipeline.schedule: gpipe")


def balance_matches_model(spec: JobSpec) -> Iterator[Problem]:
    pipe, blocks = spec.parallel.pipeline, gpt_blocks(spec)
    if not spec.uses_pipeline or not blocks:
        return
    layers = blocks - 2
    if isinstance(pipe.balance, str):
        if pipe.stages > blocks:
            yield Problem("parallel.pipeline.stages", f"{pipe.stages} with {blocks} gpt blocks "
                          f"({layers} layers + embedding + head)", "every stage needs a block",
                          f"use at most {blocks} stages, or more model.options.layers")
        return
    given = f"{pipe.balance} with {pipe.stages} stages and {blocks} gpt blocks ({layers} layers + embedding + head)"
    if len(pipe.balance) != pipe.stages or any(n < 1 for n in pipe.balance) or sum(pipe.balance) != blocks:
        even = [blocks // pipe.stages + (i < blocks % pipe.stages) for i in range(pipe.stages)]
        yield Problem("parallel.pipeline.balance", given,
                      "one block count >= 1 per stage, summing to the block count (layers + 2)",
                      f"set parallel.pipeline.balance: {even if min(even) > 0 else 'auto'}")


def pipeline_without_accumulation(spec: JobSpec) -> Iterator[Problem]:
    if spec.parallelism is Parallelism.PIPELINE and spec.parallel.accumulation > 1:
        accumulation = spec.parallel.accumulation
        micro = spec.parallel.pipeline.microbatches * accumulation
        yield Problem("parallel.accumulation", f"{accumulation} with the pipeline engine (gpt)",
                      "micro-batches already accumulate gradients within a pipeline step",
                      f"for the same samples per step set parallel.accumulation: 1, "
                      f"parallel.pipeline.microbatches: {micro} and data.batch_size: "
                      f"{spec.data.batch_size * accumulation}")


def microbatches_unused(spec: JobSpec) -> Iterator[Problem]:
    pipe = spec.parallel.pipeline
    changed = pipe.microbatches != 1 or pipe.remat or pipe.balance != "auto" or pipe.schedule != "gpipe"
    if spec.parallelism is not Parallelism.PIPELINE and changed:
        yield Problem("parallel.pipeline", "settings with parallel.pipeline.stages 1",
                      "only the gpt model runs on the pipeline engine; these settings are ignored",
                      "set model.name: gpt and parallel.pipeline.stages: 2 or more, or remove them")


def few_microbatches(spec: JobSpec) -> Iterator[Problem]:
    pipe = spec.parallel.pipeline
    if spec.uses_pipeline and pipe.microbatches < 4 * pipe.stages:
        bubble = (pipe.stages - 1) / (pipe.microbatches + pipe.stages - 1)
        yield Problem("parallel.pipeline.microbatches", f"{pipe.microbatches} with "
                      f"{pipe.stages} stages", f"each stage idles {bubble:.0%} of a step "
                      "(the bubble (K-1)/(M+K-1))",
                      f"use {4 * pipe.stages} or more micro-batches if the batch allows")


PIPELINE_ERROR_RULES = (model_matches_data, byte_vocabulary, heads_divide_width,
                        pipeline_needs_gpt, whole_pipelines, microbatches_split_batch,
                        one_f_one_b_depth, balance_matches_model, pipeline_without_accumulation)
PIPELINE_WARNING_RULES = (microbatches_unused, few_microbatches)
