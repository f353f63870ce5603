"""Checkpoints under damage, with the shipped smoke job run by the real driver, mpirun and Horovod:
a newest checkpoint that `weights_only` refuses is skipped (and never runs its code), a full disk
during a save keeps the previous checkpoint and a parseable events file, and retention removes a
checkpoint's marker before its files."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from hpc_train.checkpoint import layout
from hpc_train.checkpoint.manager import remove_checkpoint
from tests.conftest import IN_CI
from tests.runs import cli, describe_failure, drive, events, known_beat, local_run

EVERY_5 = ["checkpoint.every_steps=5", "log.every_steps=1", "optim.max_steps=20"]


def test_retention_removes_the_marker_before_the_files(tmp_path, monkeypatch):
    directory = tmp_path / layout.step_dir_name(40)
    directory.mkdir()
    for name in (layout.REPLICATED, layout.rank_file_name(0), layout.META, layout.MARKER):
        (directory / name).write_text("x")
    seen = []
    real_rmtree = shutil.rmtree
    monkeypatch.setattr(shutil, "rmtree", lambda path, **kw: (seen.append(sorted(os.listdir(path))),
                                                               real_rmtree(path, **kw)))
    remove_checkpoint(directory)
    assert seen and layout.MARKER not in seen[0] and layout.REPLICATED in seen[0]
    assert not directory.exists()
    assert layout.list_complete(tmp_path) == []


class _RunsCode:
    """A pickle that would run a command when loaded without weights_only."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.slow
def test_a_newest_checkpoint_that_does_not_load_is_skipped_not_run(tmp_path):
    paths = local_run(tmp_path, *EVERY_5)
    assert drive(paths, signal_at_step=12, signum=signal.SIGUSR2) == 75, describe_failure(paths)
    newest = max(e["step"] for e in events(paths, "checkpoint_saved"))
    assert newest == 15                                     # stops are agreed every 5 steps
    marker = tmp_path / "code-ran"
    with open(paths.checkpoints / layout.step_dir_name(newest) / layout.REPLICATED, "wb") as f:
        pickle.dump({"model": _RunsCode(marker)}, f)

    assert drive(paths) == 0, describe_failure(paths)
    assert not marker.exists(), "loading a checkpoint ran code"
    skipped = events(paths, "checkpoint_skipped")
    assert [e["step"] for e in skipped] == [15] and "weights_only" in skipped[0]["error"].lower().replace(" ", "_")
    assert Path(skipped[0]["moved_to"]).is_dir()
    resumed = events(paths, "resumed")[-1]
    assert (resumed["from_checkpoint"], resumed["skipped"]) == (10, [15])
    assert events(paths, "finished")[-1]["status"] == "completed"
    assert {e["step"] for e in events(paths, "rank_finished")} == {20}
    # The step set aside was trained and saved again, as a checkpoint that loads.
    assert 15 in layout.list_complete(paths.checkpoints)


@pytest.fixture
def small_disk(tmp_path):
    """A 48 MiB tmpfs, the run's file system; needs root (CI is root)."""
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("CI=true: the disk-full test needs root to mount a tmpfs")
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], check=True, timeout=30)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], timeout=30)


def _fill(mount: Path, leave: int) -> None:
    """Fill the file system until `leave` bytes are free."""
    free = shutil.disk_usage(mount).free
    with open(mount / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - leave))


@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.slow
def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(small_disk):
    import torch

    paths = local_run(small_disk, "checkpoint.every_steps=10", "log.every_steps=1",
                      "optim.max_steps=40")
    first = layout.step_dir_name(10)

    def fill_after_first_save():
        deadline = time.monotonic() + 300      # catches a hang; the assertions below then fail
        while time.monotonic() < deadline and not (paths.checkpoints / first / layout.MARKER).exists():
            time.sleep(0.05)
        size = sum(p.stat().st_size for p in (paths.checkpoints / first).iterdir())
        _fill(small_disk, leave=size // 3)          # room for logs, not for the next checkpoint

    filler = threading.Thread(target=fill_after_first_save)
    filler.start()
    returncode = drive(paths)
    filler.join()
    assert returncode != 0
    # The previous checkpoint is whole and loads.
    assert layout.list_complete(paths.checkpoints) == [10]
    torch.load(paths.checkpoints / first / layout.REPLICATED, weights_only=True)
    # Every line of the events file parses; the driver recorded how the run ended (or said why not).
    lines = paths.events.read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines]
    out = cli("diagnose", str(paths.root))
    assert out.returncode == 0 and "ENOSPC" in out.stdout, out.stdout


@pytest.mark.mpi
@pytest.mark.slow
# fsdp's with --heavy: its ranks' own parts killed mid-save are tests/train/test_fsdp.py's.
@pytest.mark.parametrize("backend", [pytest.param("horovod", marks=pytest.mark.horovod),
                                     pytest.param("fsdp", marks=pytest.mark.heavy)])
def test_sigkill_during_a_background_write_leaves_the_previous_checkpoint(backend, tmp_path):
    """checkpoint.write: async (the default). Rank 0's background write of step 20 is held
    after every rank's file is on disk (fsdp: and every rank's shards) and before the marker
    (HPC_TRAIN_FAULT slow_write) while training goes on; rank 0 is then SIGKILLed. Step 10 stays
    the newest complete checkpoint, loads with weights_only, and the next run resumes from it
    and completes."""
    import torch

    paths = local_run(tmp_path, "checkpoint.every_steps=10", "log.every_steps=1",
                      "optim.max_steps=30", "launch.env.HPC_TRAIN_FAULT=slow_write:0:20:120",
                      "launch.restarts_in_job=0", f"parallel.backend={backend}")
    assert paths.spec.read_text().count("write: async") == 1
    tmp = paths.checkpoints / layout.tmp_dir_name(20)
    seen = {}

    def kill_rank0_mid_write():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            written = {p.name for p in tmp.glob("rank-*.pt")} if tmp.is_dir() else set()
            beat = known_beat(paths, 0) or {}
            # Both ranks' files are in the temporary directory and training is past step 20.
            if written == {"rank-00000.pt", "rank-00001.pt"} and beat.get("step", 0) > 21:
                seen.update(step=beat["step"], written=sorted(written),
                            sharded=(tmp / layout.SHARDED / ".metadata").is_file())
                os.kill(beat["pid"], signal.SIGKILL)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_rank0_mid_write)
    killer.start()
    returncode = drive(paths)
    killer.join()
    # Seen: both ranks' files of step 20 written while rank 0 trained past step 21, so training
    # went on while the write was in flight, not blocked by it.
    assert seen, f"the write of step 20 was never seen in flight\n{describe_failure(paths)}"
    assert returncode != 0
    assert layout.list_complete(paths.checkpoints) == [10]
    assert not (paths.checkpoints / layout.step_dir_name(20)).exists()
    for name in (layout.REPLICATED, layout.rank_file_name(0), layout.rank_file_name(1)):
        torch.load(paths.checkpoints / layout.step_dir_name(10) / name, weights_only=True)
    if backend == "fsdp":     # the shards of step 20 were written, but never count
        assert (paths.checkpoints / layout.step_dir_name(10) / layout.SHARDED / ".metadata").is_file()
        assert seen["sharded"]
    saved = events(paths, "checkpoint_saved")
    assert [(e["step"], e["mode"]) for e in saved] == [(10, "async")]

    # The next run, without the fault (as `resume --set ... --allow-spec-change` would record
    # it), resumes from step 10 and finishes.
    from hpc_train import run_state
    from hpc_train.spec import dump_spec_yaml, load_spec, spec_hash

    before = load_spec(paths.spec)
    after = load_spec(paths.spec, ["launch.env.HPC_TRAIN_FAULT=''"])
    paths.spec.write_text(dump_spec_yaml(after))
    run_state.update(paths, lambda state: state.with_consent(spec_hash(before), spec_hash(after)))
    assert drive(paths) == 0, describe_failure(paths)
    assert events(paths, "resumed")[-1]["from_checkpoint"] == 10
    assert {e["step"] for e in events(paths, "rank_finished")} == {30}
    assert layout.list_complete(paths.checkpoints)[-1] == 30
