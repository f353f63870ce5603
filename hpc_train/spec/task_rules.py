"""Cross-field rules of `task`: a step that cannot work with the job's model, data or layout is
refused at submit, in one line naming the key, the value, the rule and the fix."""

from __future__ import annotations

from collections.abc import Iterator

from hpc_train.models.catalog import model as model_entry
from hpc_train.spec.problems import Problem
from hpc_train.spec.schema import TOKEN_KINDS, JobSpec, TaskKind

IMAGE_KINDS = ("synthetic", "hdf5")


def eval_needs_own_step(spec: JobSpec) -> Iterator[Problem]:
    if spec.task.eval is not None and spec.task_kind is not TaskKind.OWN:
        yield Problem("task.eval", f"{spec.task.eval!r} with task.name {spec.task.name!r}",
                      "task.eval evaluates with your own step; classification and causal_lm "
                      "evaluate with ours", "set task.name to your step (package.module:callable), "
                      "or remove task.eval")


def task_fits_model_and_data(spec: JobSpec) -> Iterator[Problem]:
    kind, block_list = spec.task_kind, model_entry(spec.model.name).block_list
    if kind is TaskKind.OWN and (block_list or spec.uses_pipeline):
        fix = ("set task.name: causal_lm, or parallel.pipeline.stages: 1" if spec.uses_pipeline
               else "set task.name: causal_lm (or auto), or name your own model in model.name")
        yield Problem("task.name", f"{spec.task.name!r} with model.name {spec.model.name!r}",
                      "your own step takes the whole model, and the gpt block list (or your "
                      "model's blocks) trains in pipeline stages, whose loss is the next-token one",
                      fix)
    elif kind is TaskKind.CLASSIFICATION and (block_list or spec.data.kind in TOKEN_KINDS):
        yield Problem("task.name", f"'classification' with model.name {spec.model.name!r} and "
                      f"data.kind {spec.data.kind!r}", "a language model on token sequences "
                      "predicts the next token", "set task.name: causal_lm (or auto)")
    elif kind is TaskKind.CAUSAL_LM and spec.data.kind in IMAGE_KINDS:
        yield Problem("task.name", f"'causal_lm' with data.kind {spec.data.kind!r}",
                      "images come with a class index, not a sequence of next tokens",
                      "set task.name: classification (or auto), or data.kind: dataset with "
                      "your token sequences")


TASK_ERROR_RULES = (eval_needs_own_step, task_fits_model_and_data)
