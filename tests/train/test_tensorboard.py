"""TensorBoard event files: one run per run directory, continued across restarts with exactly one
point per logged step (a resumed run purges what the lost work had logged)."""

from __future__ import annotations

import os

import pytest

from hpc_train.train.trackers.protocol import flat_params, scalar_tags
from tests.runs import drive, events, local_run


def test_metrics_records_become_train_and_val_curves():
    record = {"time": 1.0, "step": 7, "epoch": 0, "loss": 2.5, "lr": 0.1, "images_per_s": 640.0,
              "loss_scale": None, "skipped_steps": 0, "flag": True}
    assert scalar_tags(record) == {"train/loss": 2.5, "train/lr": 0.1, "train/images_per_s": 640.0,
                                   "train/skipped_steps": 0.0}
    val = {"time": 2.0, "step": 46, "epoch": 0, "split": "val", "loss": 0.3, "accuracy": 0.9}
    assert scalar_tags(val) == {"val/loss": 0.3, "val/accuracy": 0.9}


def test_spec_settings_become_flat_params():
    spec = {"optim": {"base_lr": 0.4, "name": "sgd", "step_milestones": [30, 60]},
            "slurm": {"nodes": 2, "partition": None}, "log": {"tensorboard": True}}
    assert flat_params(spec) == {"optim.base_lr": 0.4, "optim.name": "sgd",
                                 "optim.step_milestones": "[30, 60]", "slurm.nodes": 2,
                                 "log.tensorboard": True}


def _points(directory, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(directory))
    accumulator.Reload()
    return [event.step for event in accumulator.Scalars(tag)]


def _raw_steps(directory, tag: str) -> list[int]:
    """Every point written, purged or not, straight from the event files."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    steps = []
    for path in sorted(directory.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            steps += [event.step for value in event.summary.value if value.tag == tag]
    return steps


@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.slow
def test_a_restarted_run_continues_its_curves_without_duplicates(tmp_path):
    # Rank 0 fails after step 15 of a run that checkpoints every 10 steps: the next run resumes
    # from step 10 and logs steps 11-15 again.
    paths = local_run(tmp_path, "optim.epochs=1", "log.every_steps=1", "checkpoint.every_steps=10",
                      "launch.restarts_in_job=0")
    assert drive(paths, env={**os.environ, "HPC_TRAIN_FAULT": "raise:0:15"}) == 1
    assert drive(paths) == 0
    assert events(paths, "resumed")[0]["from_checkpoint"] == 10
    total = events(paths, "rank_finished")[0]["step"]
    raw = _raw_steps(paths.tensorboard, "train/loss")
    assert raw.count(12) == 2, raw                       # the lost work had been logged
    assert _points(paths.tensorboard, "train/loss") == list(range(1, total + 1))
    assert _points(paths.tensorboard, "val/accuracy") == [total]
    assert len(_points(paths.tensorboard, "train/lr")) == total
