"""`evaluate` in one process on a checkpointed synthetic run; its pure parts; its refusals."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

from hpc_train.cli import main
from hpc_train.errors import UsageError
from hpc_train.evaluate.data import check_split, evaluation_data
from hpc_train.evaluate.report import per_class
from hpc_train.evaluate.run import Request, evaluate_run, parts_of
from hpc_train.spec import load_spec
from hpc_train.train.data import validation_loader
from hpc_train.train.evaluation import evaluate_classifier
from hpc_train.train.saved_run import SavedCheckpoint, open_run
from tests.conftest import REPO
from tests.runs import checkpointed_run, local_run


def listing(root):
    return sorted(p.relative_to(root) for p in root.rglob("*"))


def test_parts_are_shared_round_robin():
    assert parts_of(0, 1, 3) == [0, 1, 2]
    assert [parts_of(rank, 2, 3) for rank in (0, 1)] == [[0, 2], [1]]
    assert parts_of(3, 4, 2) == []                  # more evaluating ranks than parts: idle


def test_per_class_names_and_empty_classes():
    assert per_class([(1, 2), (0, 0)], ["cat", "dog"]) == [
        {"index": 0, "class": "cat", "samples": 2, "accuracy": 0.5},
        {"index": 1, "class": "dog", "samples": 0, "accuracy": None}]
    assert per_class([(1, 1)], None)[0]["class"] == "0"


@pytest.mark.parametrize("split", ["val", "train", "v_2-x"])
def test_split_names_that_make_a_file_name(split):
    assert check_split(split) == split


@pytest.mark.parametrize("split", ["../x", "a b", ""])
def test_split_names_that_do_not(split):
    with pytest.raises(UsageError, match="--split"):
        check_split(split)


def test_one_process_sums_each_part_with_its_ranks_buffers(tmp_path):
    paths = checkpointed_run(tmp_path, world_size=2)
    report, path = evaluate_run(Request(str(paths.root)), environ={})
    assert path == paths.root / "eval-val-8.json" and json.loads(path.read_text()) == report
    assert [p.name for p in paths.root.glob(".eval-*")] == []          # no temporary left
    # What the two training ranks' validations sum to, part by part, with their own buffers.
    _, spec = open_run(paths.root)
    saved = SavedCheckpoint(paths, spec, 8)
    dataset, _, _ = evaluation_data(spec, "val", None)
    expected = sum(evaluate_classifier(saved.model(rank), validation_loader(dataset, spec, rank, 2, False),
                                       torch.device("cpu"), contextlib.nullcontext, 10)
                   for rank in (0, 1))
    assert report["samples"] == 60 == sum(c["samples"] for c in report["per_class"])
    assert report["accuracy"] == expected[1].item() / 60
    assert report["loss"] == pytest.approx(expected[0].item() / 60, rel=1e-12)
    assert (report["step"], report["split"], report["ranks"], report["trained_ranks"]) == (8, "val", 1, 2)
    assert report["spec_hash"] and report["images_per_s"] > 0


def test_cli_json_and_an_older_step(tmp_path, capsys):
    paths = checkpointed_run(tmp_path, steps=(4, 8))
    assert main(["evaluate", str(paths.root), "--checkpoint", "4", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["step"] == 4 and (paths.root / "eval-val-4.json").is_file()
    assert not (paths.root / "eval-val-8.json").exists()


@pytest.mark.parametrize("args, message", [
    (["--checkpoint", "5"], "--checkpoint 5: .* steps 8$"),
    (["--data", "/no/such/shards"], "--data /no/such/shards: the run trains on synthetic data"),
    (["--split", "test"], "--split test: the run's synthetic data has no such split"),
])
def test_refusals_are_one_line_exit_2_and_write_nothing(tmp_path, capsys, args, message):
    import re

    paths = checkpointed_run(tmp_path)
    before = listing(tmp_path)
    assert main(["evaluate", str(paths.root), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err.strip()), err
    assert listing(tmp_path) == before


def test_shards_must_exist_and_have_the_runs_classes(tmp_path):
    shards = REPO / "data" / "demo-shards"
    if not (shards / "val" / "manifest.json").is_file():
        pytest.skip("no demo shards (bash env/setup.sh writes them)")
    spec = load_spec(local_run(tmp_path).spec)
    with pytest.raises(UsageError, match=r"--data /nowhere: no /nowhere/val/manifest.json"):
        evaluation_data(spec, "val", "/nowhere")
    other = load_spec(local_run(tmp_path, "data.num_classes=5", name="five").spec)
    with pytest.raises(UsageError, match="its 10 classes are not the 5 the run was trained on"):
        evaluation_data(other, "val", str(shards))
    dataset, names, source = evaluation_data(spec, "val", str(shards))
    assert len(dataset) == 300 and names[0] == "n00000000" and source.endswith("demo-shards/val")
