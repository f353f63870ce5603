"""Cross-field rules of the gpt model, token data and pipeline parallelism (item 6 of the
pipeline issue): each names the rule, the values and the fix, at submit time.

A wrong combination here would otherwise hang the job (ranks that do not form whole pipelines,
micro-batches that do not split the batch) or fail only after the queue wait. The pipeline cuts
gpt's block list or the user's own model's blocks (model.blocks); what those blocks are is only
known where the model is built (the ranks, `validate --import`: models/blocks.py), so a balance
list's sum is checked there for a user's model.
"""

from __future__ import annotations

from collections.abc import Iterator

from hpc_train.models.catalog import GptOptions, model as model_entry
from hpc_train.parallel.layout import Parallelism, ParallelLayout
from hpc_train.spec.problems import Problem
from hpc_train.spec.schema import BYTE_VOCAB, TOKEN_KINDS, JobSpec, TaskKind


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
    if tokens and not gpt and not model_entry(spec.model.name).own:
        yield Problem("model.name", f"{spec.model.name!r} with data.kind {spec.data.kind!r}",
                      "token data needs a language model", "set model.name: gpt, or your own "
                      "language model (package.module:callable)")


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


def pipeline_needs_blocks(spec: JobSpec) -> Iterator[Problem]:
    entry = model_entry(spec.model.name)
    if spec.uses_pipeline and not (entry.block_list or entry.own):
        yield Problem("parallel.pipeline.stages", f"{spec.parallel.pipeline.stages} with "
                      f"model.name {spec.model.name!r}", "pipeline stages cut the gpt block list "
                      "or your own model's blocks (model.blocks); the catalog's other models "
                      "train data-parallel only",
                      "set model.name: gpt (or your own model), or parallel.pipeline.stages: 1")


def own_pipeline_is_causal_lm(spec: JobSpec) -> Iterator[Problem]:
    """The last stage computes the next-token loss from the logits the last block returns; a
    classifier's pipeline is not built. (An own step is refused by task_rules.)"""
    if spec.uses_pipeline and model_entry(spec.model.name).own \
            and spec.task_kind is TaskKind.CLASSIFICATION:
        yield Problem("task.name", f"{spec.task.name!r} (classification) with your own model in "
                      f"{spec.parallel.pipeline.stages} pipeline stages", "the pipeline trains "
                      "causal_lm only: its first block takes token ids, its last stage computes "
                      "the next-token loss of the logits the last block returns",
                      "set task.name: causal_lm, with token data (data.kind text or tokens, or a "
                      "dataset of (ids, targets)), or parallel.pipeline.stages: 1")


def blocks_need_own_pipeline(spec: JobSpec) -> Iterator[Problem]:
    """model.blocks is where the stages cut the user's model: refused where it would be ignored
    (the run would train without the pipeline its author meant), and on a catalog model."""
    blocks = spec.model.blocks
    if blocks is None:
        return
    if not model_entry(spec.model.name).own:
        yield Problem("model.blocks", f"{blocks!r} with model.name {spec.model.name!r}",
                      "model.blocks names the blocks of your own model; the catalog's models "
                      "have theirs", "remove model.blocks, or name your own model in model.name")
    elif not spec.uses_pipeline:
        yield Problem("model.blocks", f"{blocks!r} with parallel.pipeline.stages "
                      f"{spec.parallel.pipeline.stages}", "model.blocks says where pipeline "
                      "stages cut your model; without stages it would be ignored",
                      "set parallel.pipeline.stages: 2 or more, or remove model.blocks")


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
    if not spec.uses_pipeline:
        return
    if not blocks:      # your own model: its block count is known on the ranks (models/blocks.py)
        if not isinstance(pipe.balance, str) and (len(pipe.balance) != pipe.stages
                                                  or any(n < 1 for n in pipe.balance)):
            yield Problem("parallel.pipeline.balance", f"{pipe.balance} with {pipe.stages} stages",
                          "one block count >= 1 per stage, summing to your model's blocks",
                          f"give {pipe.stages} counts, or set parallel.pipeline.balance: auto")
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
        engine = "gpt" if spec.model.name == "gpt" else "your model's blocks"
        yield Problem("parallel.accumulation", f"{accumulation} with the pipeline engine ({engine})",
                      "micro-batches already accumulate gradients within a pipeline step",
                      f"for the same samples per step set parallel.accumulation: 1, "
                      f"parallel.pipeline.microbatches: {micro} and data.batch_size: "
                      f"{spec.data.batch_size * accumulation}")


def microbatches_unused(spec: JobSpec) -> Iterator[Problem]:
    pipe = spec.parallel.pipeline
    changed = pipe.microbatches != 1 or pipe.remat or pipe.balance != "auto" or pipe.schedule != "gpipe"
    if spec.parallelism is not Parallelism.PIPELINE and changed:
        yield Problem("parallel.pipeline", "settings with parallel.pipeline.stages 1",
                      "only pipeline stages (or the gpt model) run on the pipeline engine; these "
                      "settings are ignored", "set parallel.pipeline.stages: 2 or more (gpt, or "
                      "your model with model.blocks), or remove them")


def few_microbatches(spec: JobSpec) -> Iterator[Problem]:
    pipe = spec.parallel.pipeline
    if spec.uses_pipeline and pipe.microbatches < 4 * pipe.stages:
        bubble = (pipe.stages - 1) / (pipe.microbatches + pipe.stages - 1)
        yield Problem("parallel.pipeline.microbatches", f"{pipe.microbatches} with "
                      f"{pipe.stages} stages", f"each stage idles {bubble:.0%} of a step "
                      "(the bubble (K-1)/(M+K-1))",
                      f"use {4 * pipe.stages} or more micro-batches if the batch allows")


PIPELINE_ERROR_RULES = (model_matches_data, byte_vocabulary, heads_divide_width,
                        pipeline_needs_blocks, own_pipeline_is_causal_lm, blocks_need_own_pipeline,
                        whole_pipelines, microbatches_split_batch, one_f_one_b_depth,
                        balance_matches_model, pipeline_without_accumulation)
PIPELINE_WARNING_RULES = (microbatches_unused, few_microbatches)
