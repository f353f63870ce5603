"""evaluate and export on a real run: the shipped smoke job, trained once by 2 Horovod ranks.

The evaluation of the checkpoint that the trainer validated last equals the trainer's val line
(accuracy exactly), in one process and under mpirun -np 2; the exported file, loaded with
weights_only=True into a fresh model, gives the checkpoint's outputs bit for bit.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from hpc_train.rundir import read_jsonl
from tests.conftest import REPO
from tests.runs import cli, describe_failure, drive, local_run

pytestmark = [pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    paths = local_run(tmp_path_factory.mktemp("runs"), name="smoke")
    assert drive(paths) == 0, describe_failure(paths)
    return paths


def val_lines(paths) -> list[dict]:
    return [m for m in read_jsonl(paths.metrics) if m.get("split") == "val"]


def assert_reproduces(report: dict, line: dict) -> None:
    assert report["step"] == line["step"]
    assert report["accuracy"] == line["accuracy"]                 # exactly
    assert report["loss"] == pytest.approx(line["loss"], rel=1e-12, abs=0)


def test_evaluate_reproduces_the_trainers_validation(smoke):
    lines = val_lines(smoke)
    assert len(lines) == 2                                        # two epochs
    out = cli("evaluate", str(smoke.root), "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert_reproduces(report, lines[-1])
    assert json.loads((smoke.root / f"eval-val-{lines[-1]['step']}.json").read_text()) == report
    assert report["samples"] == 300 and report["ranks"] == 1 and report["trained_ranks"] == 2
    assert [c["class"] for c in report["per_class"]][:2] == ["n00000000", "n00000001"]
    # The first epoch's end: an older checkpoint, which the trainer validated too.
    out = cli("evaluate", str(smoke.root), "--checkpoint", str(lines[0]["step"]), "--json")
    assert out.returncode == 0, out.stderr
    assert_reproduces(json.loads(out.stdout), lines[0])


def test_evaluate_over_two_ranks_under_mpirun(smoke, mpirun_argv):
    argv = [*mpirun_argv(2), sys.executable, "-m", "hpc_train", "evaluate", str(smoke.root), "--json"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)                               # rank 0 alone prints
    assert report["ranks"] == 2
    assert_reproduces(report, val_lines(smoke)[-1])


@pytest.mark.parametrize("fmt", ["state_dict", "torchscript"])
def test_export_gives_the_checkpoints_outputs(smoke, tmp_path, fmt):
    from hpc_train.evaluate.data import evaluation_data
    from hpc_train.export import load_exported
    from hpc_train.models import build_model
    from hpc_train.train.saved_run import SavedCheckpoint, choose_step, open_run

    out_file = tmp_path / f"model.{fmt}"
    out = cli("export", str(smoke.root), "-o", str(out_file), "--format", fmt)
    assert out.returncode == 0, out.stderr
    paths, spec = open_run(smoke.root)
    step = choose_step(paths, None)
    dataset, _, _ = evaluation_data(spec, "val", None)
    images = torch.stack([dataset[i][0] for i in range(16)])
    expected = SavedCheckpoint(paths, spec, step).model()(images)
    if fmt == "state_dict":
        saved = torch.load(out_file, weights_only=True)
        fresh = build_model(saved["meta"]["model"], saved["meta"]["num_classes"],
                            saved["meta"]["model_options"])
        fresh.load_state_dict(saved["state_dict"])
        assert torch.equal(fresh.eval()(images), expected)
    model, meta = load_exported(out_file)
    assert torch.equal(model(images), expected)
    assert (meta["step"], meta["model"], meta["class_names"][0]) == (step, "resnet_tiny", "n00000000")
