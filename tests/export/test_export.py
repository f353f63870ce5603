"""`export`: a file that torch.load(weights_only=True) reads, rebuilt into the same model."""

from __future__ import annotations

import pytest
import torch

from hpc_train.cli import main
from hpc_train.errors import UsageError
from hpc_train.export import load_exported
from hpc_train.export.meta import export_meta, model_options
from hpc_train.export.write import export_run
from hpc_train.models import build_model
from hpc_train.spec import load_spec
from hpc_train.train.saved_run import SavedCheckpoint, open_run
from tests.runs import checkpointed_run, local_run

PLAIN = (str, int, float, bool, list, dict)   # dict: model_options, itself plain


def checkpoint_model(paths, step=8):
    _, spec = open_run(paths.root)
    return SavedCheckpoint(paths, spec, step).model()


def test_model_options_are_complete():
    assert model_options("resnet_tiny", {"width": 8}) == {
        "zero_init_residual": False, "width": 8, "layers": [1, 1, 1, 1]}
    assert model_options("resnet50", {}) == {"zero_init_residual": False}


def test_meta_of_image_shards_and_of_synthetic_data(tmp_path):
    shards = load_spec(local_run(tmp_path, name="shards").spec)
    meta = export_meta(shards, step=3, spec_hash="abc", run_dir="/r", class_names=["a", "b"],
                       fmt="state_dict")
    assert (meta["input_size"], meta["resize_size"], meta["crop_size"]) == ([3, 32, 32], 36, 32)
    assert meta["mean"] == [0.485, 0.456, 0.406] and meta["std"] == [0.229, 0.224, 0.225]
    assert (meta["step"], meta["spec_hash"], meta["class_names"]) == (3, "abc", ["a", "b"])
    synthetic = load_spec(local_run(tmp_path, "data.kind=synthetic", name="syn").spec)
    meta = export_meta(synthetic, step=3, spec_hash="abc", run_dir="/r", class_names=None, fmt="state_dict")
    assert meta["mean"] == [0.0] * 3 and meta["std"] == [1.0] * 3 and meta["class_names"] == []


def test_state_dict_file_loads_weights_only_into_a_fresh_model(tmp_path):
    paths = checkpointed_run(tmp_path)
    out = tmp_path / "model.pt"
    done = export_run(str(paths.root), out)
    saved = torch.load(out, weights_only=True)
    assert set(saved) == {"state_dict", "meta"}
    assert all(isinstance(v, PLAIN) for v in saved["meta"].values()), saved["meta"]
    meta = saved["meta"]
    assert (meta["model"], meta["num_classes"], meta["step"], done.step) == ("resnet_tiny", 10, 8, 8)
    fresh = build_model(meta["model"], meta["num_classes"], meta["model_options"])
    fresh.load_state_dict(saved["state_dict"])        # strict: the same (torchvision) names
    images = torch.randn(4, 3, 16, 16)
    expected = checkpoint_model(paths)(images)
    assert torch.equal(fresh.eval()(images), expected)
    model, meta = load_exported(out)
    assert torch.equal(model(images), expected) and meta == saved["meta"]


def test_torchscript_file(tmp_path, capsys):
    paths = checkpointed_run(tmp_path)
    out = tmp_path / "model.ts"
    assert main(["export", str(paths.root), "-o", str(out), "--format", "torchscript"]) == 0
    assert "resnet_tiny (10 classes, input 3x16x16) from step 8" in capsys.readouterr().out
    model, meta = load_exported(out)
    assert isinstance(model, torch.jit.ScriptModule) and meta["file_format"] == "torchscript"
    images = torch.randn(2, 3, 16, 16)
    assert torch.equal(model(images), checkpoint_model(paths)(images))


def test_a_model_that_does_not_script_is_one_clear_error(tmp_path, monkeypatch):
    def refuse(model):
        raise RuntimeError("Module 'X' has no attribute 'y'\nmore detail")

    monkeypatch.setattr(torch.jit, "script", refuse)
    paths = checkpointed_run(tmp_path)
    with pytest.raises(UsageError, match=r"does not script \(Module 'X' has no attribute 'y'\)\. "
                                         "Fix: use --format state_dict"):
        export_run(str(paths.root), tmp_path / "m.ts", fmt="torchscript")
    assert not (tmp_path / "m.ts").exists()


@pytest.mark.parametrize("args, message", [
    (["-o", "{tmp}/no/dir/model.pt"], "give a file in an existing directory"),
    (["-o", "{tmp}/model.pt", "--checkpoint", "9"], "--checkpoint 9: .* steps 8$"),
])
def test_refusals_write_nothing(tmp_path, capsys, args, message):
    import re

    paths = checkpointed_run(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert main(["export", str(paths.root), *[a.format(tmp=tmp_path) for a in args]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err.strip()), err
    assert sorted(tmp_path.rglob("*")) == before


def test_a_file_export_did_not_write_is_refused(tmp_path):
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(UsageError, match="not a file that `python -m hpc_train export` wrote"):
        load_exported(tmp_path / "other.pt")
