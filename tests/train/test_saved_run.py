"""Opening a run's checkpoint for inference: which step, which buffers, what is refused."""

from __future__ import annotations

import pytest
import torch

from hpc_train.checkpoint import layout
from hpc_train.errors import CheckpointError, UsageError
from hpc_train.rundir import RunPaths
from hpc_train.train.saved_run import SavedCheckpoint, choose_step, open_run
from tests.runs import checkpointed_run, local_run


def listing(root):
    return sorted(p.relative_to(root) for p in root.rglob("*"))


def test_latest_complete_step_unless_one_is_given(tmp_path):
    paths = checkpointed_run(tmp_path, steps=(4, 8))
    (paths.checkpoints / layout.step_dir_name(12)).mkdir()           # no COMPLETE marker
    assert choose_step(paths, None) == 8
    assert choose_step(paths, 4) == 4
    with pytest.raises(UsageError, match=r"--checkpoint 12: .* steps 4, 8$"):
        choose_step(paths, 12)


def test_a_run_without_a_complete_checkpoint_is_refused_and_left_alone(tmp_path):
    paths = local_run(tmp_path)
    before = listing(tmp_path)
    with pytest.raises(UsageError, match="no complete checkpoint"):
        choose_step(paths, None)
    assert listing(tmp_path) == before                  # not even checkpoints/ was created


def test_not_a_run_directory_and_gpt_runs_are_refused(tmp_path):
    with pytest.raises(UsageError, match="not a run directory: it has no spec.yaml"):
        open_run(tmp_path)
    gpt = local_run(tmp_path, spec_file="jobs/transformer_pipeline_cpu.yaml", name="gpt")
    with pytest.raises(UsageError, match="gpt on the pipeline engine"):
        open_run(gpt.root)


def test_each_rank_has_its_own_batchnorm_statistics(tmp_path):
    paths, spec = open_run(checkpointed_run(tmp_path, world_size=2).root)
    saved = SavedCheckpoint(paths, spec, 8)
    assert saved.world_size == 2
    first, second = saved.model(), saved.model(1)
    assert not first.training
    for (name, a), (_, b) in zip(first.named_parameters(), second.named_parameters()):
        assert torch.equal(a, b), name
    assert not torch.equal(first.bn1.running_mean, second.bn1.running_mean)
    assert torch.equal(second.bn1.running_mean, saved.buffers_of(1)["bn1.running_mean"])


def test_weights_that_do_not_fit_the_spec_are_one_clear_error(tmp_path):
    paths = checkpointed_run(tmp_path)
    spec_text = paths.spec.read_text().replace("name: resnet_tiny", "name: resnet18")
    RunPaths(paths.root).spec.write_text(spec_text)
    paths, spec = open_run(paths.root)
    with pytest.raises(CheckpointError, match="do not fit model resnet18 .* spec.yaml changed"):
        SavedCheckpoint(paths, spec, 8).model()
