"""`resume RUN_DIR`: a finished run continues from its last checkpoint; spec changes need consent."""

from __future__ import annotations

import pytest

from hpc_train import run_state
from hpc_train.rundir import read_jsonl
from hpc_train.spec import load_spec, spec_hash
from tests.runs import cli, drive, events, local_run, wait_for

pytestmark = [pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]

SMALL = ["data.kind=synthetic", "data.train_samples=512", "data.val_samples=0", "data.image_size=16",
         "data.workers=0", "optim.epochs=1", "log.every_steps=2"]


def test_resume_needs_consent_for_changes_then_continues(tmp_path):
    paths = local_run(tmp_path, *SMALL)
    assert drive(paths) == 0                                    # 8 steps, checkpoint at step 8
    spec_before = paths.spec.read_text()

    refused = cli("resume", str(paths.root), "--local", "--set", "optim.epochs=2")
    assert refused.returncode == 2 and "optim.epochs" in refused.stderr
    assert "--allow-spec-change" in refused.stderr
    assert paths.spec.read_text() == spec_before and not events(paths, "resubmitted")

    accepted = cli("resume", str(paths.root), "--local", "--set", "optim.epochs=2", "--allow-spec-change",
                   "--new-snapshot")
    assert accepted.returncode == 0, accepted.stderr
    (tmp_path / "before.yaml").write_text(spec_before)        # the consent the ranks read
    assert run_state.read(paths).consented_specs == (
        (spec_hash(load_spec(tmp_path / "before.yaml")), spec_hash(load_spec(paths.spec))),)
    # The resumed job runs in the background (the local executor): its end is its finished event.
    wait_for(lambda: len(events(paths, "finished")) >= 2, 240, "the resumed run's finished event")
    # The run had no snapshot (driven here); --new-snapshot gave it one, and the job imported it.
    first, resumed, job = read_jsonl(paths.environment)
    assert [e["where"] for e in (first, resumed, job)] == ["job", "resume", "job"]
    assert first["code"] != str(paths.code / "hpc_train") and resumed["snapshot"]["sha256"]
    assert job["code"] == str(paths.code / "hpc_train") and paths.code.is_symlink()
    assert events(paths, "finished")[-1]["status"] == "completed"
    resumed = events(paths, "resumed")[-1]
    assert resumed["from_checkpoint"] == 8 and resumed["spec_changed"] == ["optim.epochs"]
    assert max(e["step"] for e in events(paths, "rank_finished")) == 16


def test_resume_refuses_a_directory_that_is_not_a_run(tmp_path):
    out = cli("resume", str(tmp_path), "--local")
    assert out.returncode == 2 and "not a run directory" in out.stderr
