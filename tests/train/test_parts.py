"""The rank-side seams: the parts a trainer is given (`TrainingParts`), chosen from the parallel
layout, and `Checkpointing` working from its collaborators alone (one process, no trainer)."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from hpc_train import run_state
from hpc_train.errors import CheckpointMismatch
from hpc_train.launch.identity import RankInfo
from hpc_train.parallel.layout import Parallelism, ParallelLayout
from hpc_train.rundir import RunPaths
from hpc_train.runtime.heartbeat import Phase
from hpc_train.spec import spec_from_dict
from hpc_train.spec.global_batch import fit_to_nodes
from hpc_train.train import trainer
from hpc_train.train.checkpointing import Checkpointing
from hpc_train.train.parts import Collectives, TrainingParts
from hpc_train.train.pipeline_trainer import PipelineParts
from hpc_train.train.state import CheckpointedState, ModelWeights, Progress
from hpc_train.train.task import CausalLm
from hpc_train.train.trainer import PARTS, DataParallelParts, parts_for


def test_the_layout_names_its_parallelism():
    assert ParallelLayout(4).parallelism is Parallelism.DATA_PARALLEL
    assert ParallelLayout(4, stages=2).parallelism is Parallelism.PIPELINE
    assert ParallelLayout(2, 1, Parallelism.PIPELINE).parallelism is Parallelism.PIPELINE


@pytest.mark.parametrize("model, data, stages, parallelism", [
    ({"name": "resnet_tiny"}, {}, 1, Parallelism.DATA_PARALLEL),
    ({"name": "gpt"}, {"kind": "text", "vocab_size": 256}, 1, Parallelism.PIPELINE),
    ({"name": "gpt"}, {"kind": "text", "vocab_size": 256}, 2, Parallelism.PIPELINE),
])
def test_the_spec_puts_its_parallelism_in_the_layout(model, data, stages, parallelism):
    spec = spec_from_dict({"run": {"name": "t"}, "slurm": {"tasks_per_node": 2}, "model": model,
                           "data": data, "parallel": {"pipeline": {"stages": stages}}})
    assert spec.parallelism is parallelism and spec.layout.parallelism is parallelism


@pytest.mark.parametrize("layout, parts", [
    (ParallelLayout(2), DataParallelParts),
    (ParallelLayout(4, stages=2), PipelineParts),
    (ParallelLayout(2, 1, Parallelism.PIPELINE), PipelineParts),
])
def test_the_layout_alone_picks_the_parts(layout, parts):
    assert parts_for(layout) is parts
    assert set(PARTS) == set(Parallelism)        # every parallelism has its parts


def test_a_data_parallel_rank_does_not_import_the_other_kinds_parts():
    """Each rank start pays for what its kind of job uses: the pipeline's imports (pipelining,
    dynamo) cost a second of CPU, and CI starts a few hundred ranks."""
    probe = ("import sys, hpc_train.train.trainer; "
             "print(sorted(m for m in ('torch.distributed.pipelining', 'deepspeed', 'torch._dynamo') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


class Asked(Exception):
    pass


def test_the_trainer_asks_its_layout_for_its_parts(monkeypatch, tmp_path):
    asked = []

    def parts_for(layout):
        asked.append(layout)
        raise Asked

    monkeypatch.setattr(trainer, "parts_for", parts_for)
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)
    spec = spec_from_dict({"run": {"name": "t"}})
    with pytest.raises(Asked):
        trainer.Trainer(spec, RunPaths(tmp_path), RankInfo())
    assert asked == [spec.layout]


class OneLayer:
    """A minimal kind of job: what a new backend has to provide, and nothing more."""

    def __init__(self):
        self.model = torch.nn.Linear(2, 1)
        self.backend = Alone()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.precision = SimpleNamespace(loss_scale=None)
        self.task = CausalLm()

    def states(self) -> CheckpointedState:
        return CheckpointedState(replicated={"model": ModelWeights(self.model)})

    def train_step(self, micro_batches, clock) -> tuple[float | None, bool]:
        return 0.5, True

    def evaluate(self, val_batches, tick) -> torch.Tensor:
        return torch.zeros(3)


class Alone:
    """The collectives of a world of one rank."""

    def allreduce_sum(self, tensor):
        return tensor

    def barrier(self):
        pass

    def shutdown(self):
        pass


def test_a_class_with_the_members_is_accepted_and_one_without_is_not():
    parts = OneLayer()
    assert isinstance(parts, TrainingParts) and isinstance(parts.backend, Collectives)
    del parts.backend
    assert not isinstance(parts, TrainingParts)
    assert not isinstance(SimpleNamespace(model=None, backend=None, optimizer=None, precision=None),
                          TrainingParts)


@pytest.mark.parametrize("parallelism", list(Parallelism), ids=lambda p: p.name)
def test_the_parts_of_each_parallelism_have_the_protocols_methods(parallelism):
    module, name = PARTS[parallelism].split(":")
    parts = getattr(importlib.import_module(module), name)
    methods = [name for name, value in vars(TrainingParts).items()
               if inspect.isfunction(value) and not name.startswith("_")]
    assert sorted(methods) == ["evaluate", "states", "train_step"]
    for name in methods:
        wanted = list(inspect.signature(getattr(TrainingParts, name)).parameters)
        assert list(inspect.signature(getattr(parts, name)).parameters) == wanted, name


class Beats:
    def __init__(self):
        self.phases = []

    def progress(self, step=None, phase=None):
        self.phases.append(phase)


@pytest.mark.parametrize("write", ["sync", "async"])
def test_checkpointing_saves_and_resumes_from_its_collaborators(tmp_path, write):
    spec = spec_from_dict({"run": {"name": "t"}, "checkpoint": {"write": write}})
    paths = RunPaths(tmp_path)

    def checkpointing(model, progress, heartbeat):
        states = CheckpointedState(replicated={"model": ModelWeights(model), "progress": progress})
        return Checkpointing(states, progress, spec, paths, RankInfo(), Alone(), heartbeat)

    model, beats = torch.nn.Linear(2, 1), Beats()
    progress = Progress(64, 1, None, step=7, epoch=1, consumed=128, samples=576)
    saving = checkpointing(model, progress, beats)
    saving.save("periodic")
    saving.finish_writes()
    assert [Phase.CHECKPOINT, Phase.SAVED] == beats.phases[:2]

    fresh, fresh_progress = torch.nn.Linear(2, 1), Progress(32, 1, None)
    assert checkpointing(fresh, fresh_progress, Beats()).resume()
    assert torch.equal(fresh.weight, model.weight)
    # The position goes on; this segment's global batch stays its own, the saved one is told.
    assert (fresh_progress.step, fresh_progress.epoch, fresh_progress.consumed) == (7, 1, 128)
    assert (fresh_progress.samples, fresh_progress.samples_per_step) == (576, 32)
    assert fresh_progress.loaded["samples_per_step"] == 64
    assert run_state.read(paths).last_save == {"step": 7, "epoch": 1, "consumed": 128,
                                               "samples": 576, "samples_per_step": 64,
                                               "world_size": 1}


class StepsOnly:
    """The progress of a checkpoint from before samples were counted: the step alone."""

    def __init__(self, step):
        self.step = step

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        raise AssertionError("not loaded")


def test_a_step_based_checkpoint_resumes_at_its_own_world_size_only(tmp_path):
    spec = spec_from_dict({"run": {"name": "t"}, "checkpoint": {"write": "sync"}})
    paths = RunPaths(tmp_path)

    def checkpointing(progress, saved=None):
        states = CheckpointedState(replicated={"progress": saved or progress})
        return Checkpointing(states, progress, spec, paths, RankInfo(), Alone(), Beats())

    # 50 steps of 64 samples, 46 steps per epoch: epoch 1, 4 steps in.
    checkpointing(Progress(64, 1, None, step=50), saved=StepsOnly(50)).save("periodic")
    derived = Progress(64, 1, lambda step: (step // 46, step % 46 * 64, step * 64))
    assert checkpointing(derived).resume()
    assert (derived.step, derived.epoch, derived.consumed, derived.samples) == (50, 1, 256, 3200)

    meta = next(paths.checkpoints.glob("step-*")) / "meta.json"
    meta.write_text(meta.read_text().replace('"world_size": 1', '"world_size": 2'))
    with pytest.raises(CheckpointMismatch, match="resumes only on its own 2 ranks, not 1"):
        checkpointing(Progress(64, 1, None)).resume()


def test_a_start_on_other_nodes_of_the_range_loads_the_checkpoint_without_consent(monkeypatch,
                                                                                   tmp_path):
    """The ranks train with the spec fitted to their start's nodes; checkpoints record the
    run's written spec, so the next start on another node count of the range loads them."""
    monkeypatch.setattr(trainer, "parts_for", lambda layout: lambda *args: OneLayer())
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)
    written = spec_from_dict({
        "run": {"name": "t"}, "slurm": {"nodes": "1-2"},
        "data": {"kind": "synthetic", "train_samples": 256, "val_samples": 0, "image_size": 8,
                 "workers": 0}, "model": {"name": "resnet_tiny"},
        "parallel": {"keep_global_batch": True}, "checkpoint": {"write": "sync"}})
    shrunk, paths = fit_to_nodes(written, 1), RunPaths(tmp_path)

    def start(spec, **kwargs):
        return trainer.Trainer(spec, paths, RankInfo(), heartbeat=Beats(), **kwargs)

    on_one = start(shrunk, written=written)
    on_one.progress.advance()
    on_one.checkpoints.save("periodic")
    again = start(written)
    assert again.checkpoints.resume() and again.progress.step == 1
    # A checkpoint that recorded the fitted spec would have needed `resume --allow-spec-change`.
    recorded_fitted = start(shrunk)
    recorded_fitted.progress.step = 2
    recorded_fitted.checkpoints.save("periodic")
    with pytest.raises(CheckpointMismatch, match="parallel.accumulation, slurm.nodes"):
        start(written).checkpoints.resume()
