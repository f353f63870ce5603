"""Checkpoint layout, retention, the atomic save protocol, RNG capture, spec-change guard."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from hpc_train.checkpoint import layout
from hpc_train.checkpoint.manager import CheckpointManager
from hpc_train.checkpoint.retention import steps_to_delete
from hpc_train.checkpoint.rng import capture_rng, restore_rng
from hpc_train.errors import CheckpointError
from hpc_train.spec.diff import changed_keys
from hpc_train.train.state import check_spec


def test_complete_steps_need_the_marker_and_the_name():
    listing = {"step-00000100": True, "step-00000200": False, "step-00000050": True,
               ".step-00000300.tmp": True, "notes": True}
    assert layout.complete_steps(listing) == [50, 100]


@pytest.mark.parametrize("steps, keep_last, keep_every, deleted", [
    ([100, 200, 300, 400], 2, None, [100, 200]),
    ([100, 200, 300, 400], 10, None, []),
    # one per 1000 for good: the first saved at or after each multiple (1100, 2050)
    ([900, 1100, 1500, 2050, 2500, 3000], 1, 1000, [900, 1500, 2500]),
])
def test_retention(steps, keep_last, keep_every, deleted):
    assert steps_to_delete(steps, keep_last, keep_every) == deleted


def _manager(tmp_path, keep_last=2):
    return CheckpointManager(tmp_path / "ckpt", rank=0, world_size=1, barrier=lambda: None,
                             keep_last=keep_last)


def test_save_load_and_retention(tmp_path):
    manager = _manager(tmp_path)
    for step in (10, 20, 30):
        manager.save(step, {"w": torch.full((2,), float(step))}, {"r": step}, {"spec_hash": "h"})
    assert layout.list_complete(manager.root) == [20, 30]
    replicated, own, meta = manager.load()
    assert torch.equal(replicated["w"], torch.full((2,), 30.0)) and own == {"r": 30}
    assert meta["step"] == 30 and meta["spec_hash"] == "h" and meta["world_size"] == 1


def test_incomplete_and_temporary_checkpoints_are_never_loaded(tmp_path):
    manager = _manager(tmp_path)
    manager.save(10, {"w": torch.zeros(1)}, {}, {})
    # A save killed after the rename but before its marker, and one killed mid-write.
    (manager.root / layout.step_dir_name(20)).mkdir()
    (manager.root / layout.step_dir_name(20) / layout.REPLICATED).write_bytes(b"half a file")
    (manager.root / layout.tmp_dir_name(30)).mkdir()
    assert manager.latest() == 10
    assert manager.load()[2]["step"] == 10
    with pytest.raises(CheckpointError, match="not complete"):
        manager.load(20)
    # The next save of step 20 replaces the broken directory and cleans the temporary one.
    manager.save(20, {"w": torch.ones(1)}, {}, {})
    assert manager.latest() == 20 and not (manager.root / layout.tmp_dir_name(30)).exists()


def test_loading_refuses_pickled_code(tmp_path):
    manager = _manager(tmp_path)
    manager.save(10, {"w": torch.zeros(1)}, {}, {})

    class Evil:
        def __reduce__(self):
            return (print, ("this must never run",))

    torch.save({"x": Evil()}, manager.root / layout.step_dir_name(10) / layout.REPLICATED)
    with pytest.raises(CheckpointError, match="cannot load"):
        manager.load()


def test_no_checkpoint_is_an_error(tmp_path):
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        _manager(tmp_path).load()


def test_rng_round_trip_through_a_safe_load(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    saved = capture_rng()
    torch.save(saved, tmp_path / "rng.pt")
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    restore_rng(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_spec_change_guard_lists_keys():
    saved = {"optim": {"base_lr": 0.1, "epochs": 2}, "run": {"name": "a"}}
    current = {"optim": {"base_lr": 0.2, "epochs": 2}, "run": {"name": "a"}}
    assert changed_keys(saved, current) == ["optim.base_lr"]
    with pytest.raises(CheckpointError, match="optim.base_lr"):
        check_spec(saved, current, allowed=False)
    assert check_spec(saved, current, allowed=True) == ["optim.base_lr"]


def test_a_key_added_since_the_checkpoint_counts_as_its_default():
    from hpc_train.spec import spec_from_dict, spec_to_dict

    current = spec_to_dict(spec_from_dict({"run": {"name": "a"}}))
    saved = {**current, "parallel": {k: v for k, v in current["parallel"].items()
                                     if k != "keep_global_batch"}}
    assert check_spec(saved, current, allowed=False) == []
    changed = {**current, "parallel": {**current["parallel"], "keep_global_batch": True}}
    with pytest.raises(CheckpointError, match="parallel.keep_global_batch"):
        check_spec(current, changed, allowed=False)


class _Shards:
    """A sharded part of some library's format that records what it was asked to do."""

    names = ("model",)

    def __init__(self, format: str, writes: bool = True):
        self.format, self.writes, self.loaded = format, writes, []

    def save(self, directory, midway=lambda: None):
        self.loaded.append(("save", directory))

    def load(self, directory):
        self.loaded.append(("load", directory))

    def load_replicated(self, replicated):
        self.loaded.append(("replicated", replicated))


def test_a_sharded_part_of_another_librarys_format_is_refused_not_read(tmp_path):
    # An fsdp checkpoint (dcp) resumed by a DeepSpeed job and back: a refusal (the resume
    # stops and says why), never a load that fails and sets the checkpoint aside as damaged.
    from hpc_train.errors import CheckpointMismatch
    from hpc_train.train.state import CheckpointedState

    for saved, reader in (("dcp", _Shards("deepspeed")), ("deepspeed", _Shards("dcp", writes=False)),
                          ("dcp", None)):
        with pytest.raises(CheckpointMismatch, match="sharded in"):
            CheckpointedState({}, sharded=reader).load({}, None, dict, tmp_path, saved)
        assert reader is None or reader.loaded == []
    same = _Shards("dcp")
    CheckpointedState({}, sharded=same).load({}, None, dict, tmp_path, "dcp")
    assert same.loaded == [("load", tmp_path)]
    assert CheckpointedState({}, sharded=same).writes_sharded == "dcp"
    assert CheckpointedState({}, sharded=_Shards("dcp", writes=False)).writes_sharded is None


def test_kill_in_save_fires_only_in_the_sharded_save_of_its_rank_and_step():
    import signal
    import subprocess
    import sys

    from hpc_train.runtime import faults

    assert faults.parse_fault("kill_in_save:1:8") == faults.Fault("kill_in_save", 1, 8)
    injector = faults.FaultInjector(1, {faults.FAULT_ENV: "kill_in_save:1:8"})
    injector.at_step(8)              # a fault of the save, not of the step: nothing here
    injector.in_sharded_save(4)      # another step's save
    faults.FaultInjector(0, {faults.FAULT_ENV: "kill_in_save:1:8"}).in_sharded_save(8)
    code = ("from hpc_train.runtime import faults; "
            "faults.FaultInjector(1, {faults.FAULT_ENV: 'kill_in_save:1:8'}).in_sharded_save(8)")
    killed = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert killed.returncode == -signal.SIGKILL
