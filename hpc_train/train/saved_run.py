"""A run's checkpoint opened for inference (`evaluate`, `export`): the model, as trained.

Read-only: nothing is created or changed in the run directory. The component names read here
("model", "buffers") are the ones `DataParallelParts.states` saves (train/trainer.py), and for
a pipeline run of the user's own model each stage file's "model" (train/pipeline_trainer.py),
whose blocks' names load through the model's block list into the model's own names
(models/blocks.py). gpt runs are refused with a message that says where their validation
figures are.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from hpc_train.checkpoint import layout
from hpc_train.checkpoint.manager import CheckpointManager
from hpc_train.checkpoint.sharded import whole_state
from hpc_train.errors import CheckpointError, UsageError
from hpc_train.models import build_model
from hpc_train.models.blocks import block_list
from hpc_train.parallel.layout import Parallelism
from hpc_train.rundir import RunPaths
from hpc_train.usercode import add_to_path


def open_run(run_dir: str | Path):
    """(RunPaths, the run's own spec from its spec.yaml); UsageError for what cannot be opened."""
    from hpc_train.spec import load_spec

    paths = RunPaths(Path(run_dir).resolve())
    if not paths.spec.is_file():
        raise UsageError(f"{run_dir} is not a run directory: it has no {paths.spec.name}. "
                         "Fix: give a directory that `submit` created (runs/<name>-<stamp>)")
    spec = load_spec(paths.spec)
    add_to_path(spec.run.code)     # the user's model is built from their package, as on a rank
    if spec.parallelism is Parallelism.DEEPSPEED:
        raise UsageError(f"{run_dir} trains with DeepSpeed ZeRO: its checkpoints are DeepSpeed's "
                         "shards, which evaluate and export do not read yet. Its validation loss "
                         "and accuracy are the \"split\": \"val\" lines of metrics.jsonl")
    if spec.model.name == "gpt":
        raise UsageError(f"{run_dir} trains gpt on the pipeline engine (a checkpoint file per "
                         "stage) or sharded by fsdp; evaluate and export take the image models (resnet*) only. Its "
                         "validation loss and next-token accuracy are the \"split\": \"val\" lines "
                         "of metrics.jsonl")
    return paths, spec


def choose_step(paths: RunPaths, step: int | None) -> int:
    """`step`, or the latest complete checkpoint when None; UsageError when there is none."""
    steps = layout.list_complete(paths.checkpoints)
    if not steps:
        raise UsageError(f"{paths.root} has no complete checkpoint under checkpoints/ (a run "
                         "that saved none yet, or only unfinished saves). Fix: let the run save "
                         "one (checkpoint.every_steps, or the end of an epoch), then try again")
    if step is None:
        return steps[-1]
    if step not in steps:
        shown = ", ".join(map(str, steps))
        raise UsageError(f"--checkpoint {step}: {paths.root} has no complete checkpoint of that "
                         f"step; its complete checkpoints are at steps {shown}")
    return step


class SavedCheckpoint:
    """One complete checkpoint of an image-model run: weights, meta, each rank's buffers."""

    def __init__(self, paths: RunPaths, spec, step: int):
        self.paths, self.spec, self.step = paths, spec, step
        self.directory = paths.checkpoints / layout.step_dir_name(step)
        # The checkpoints/ folder exists (choose_step found the step in it): nothing is created.
        self._files = CheckpointManager(paths.checkpoints, 0, 1, barrier=lambda: None)
        try:
            self.meta = json.loads((self.directory / layout.META).read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"cannot read {self.directory / layout.META}: {exc}") from None
        sharded = self._files.sharded_part(step)
        self.staged = spec.parallelism is Parallelism.PIPELINE
        # An fsdp run's model is in its sharded part (every rank's shards), gathered here; a
        # pipeline run's in its stage files, each under its blocks' names.
        if self.staged:
            self.weights = {name: tensor for path in layout.stage_files(self.directory)
                            for name, tensor in self._files.load_file(step, path.name)["model"].items()}
        elif sharded is not None:
            self.weights = whole_state(sharded)["model"]
        else:
            self.weights = self._files.load_file(step, layout.REPLICATED)["model"]

    @property
    def world_size(self) -> int:
        """Ranks of the job that saved it (each has its own BatchNorm statistics)."""
        return int(self.meta.get("world_size", 1))

    @property
    def spec_hash(self) -> str:
        return str(self.meta.get("spec_hash", ""))

    def buffers_of(self, rank: int) -> dict | None:
        """Rank `rank`'s model buffers as it saved them; None when the checkpoint has none."""
        if not (self.directory / layout.rank_file_name(rank)).is_file():
            return None
        return self._files.load_file(self.step, layout.rank_file_name(rank)).get("buffers")

    def model(self, rank: int | None = None) -> torch.nn.Module:
        """The model with the saved weights and rank 0's buffers, or `rank`'s."""
        spec = self.spec
        model = build_model(spec.model.name, spec.data.num_classes, spec.model.options)
        # A pipeline run's blocks share the model's modules: loaded through them, the weights
        # land in the model under its own names.
        target = block_list(spec.model.name, model, spec.model.blocks) if self.staged else model
        try:
            target.load_state_dict(self.weights)
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[0:2]
            raise CheckpointError(f"{self.directory}: the weights do not fit model "
                                  f"{spec.model.name} of {self.paths.spec} ({' '.join(first)}); "
                                  "was spec.yaml changed after this checkpoint?") from None
        # Rank 0's own for None: an fsdp checkpoint's sharded part keeps one rank's buffers,
        # DCP's choice (a replicated one's are rank 0's already).
        buffers = self.buffers_of(rank or 0)
        if buffers:
            own = dict(model.named_buffers())
            for name, value in buffers.items():
                own[name].copy_(value)
        return model.eval()
