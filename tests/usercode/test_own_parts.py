"""The user's model, dataset and optimizer named in a spec: checked on the login node (form,
module found from the submit directory, nothing imported), copied into the code snapshot, and
built on a rank."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from hpc_train.errors import DataError
from hpc_train.spec import load_spec
from hpc_train.spec.code_refs import code_problems, own_packages
from hpc_train.spec.problems import SpecInvalid
from hpc_train.usercode import UserCodeError
from tests.conftest import REPO
from tests.runs import cli

EXAMPLE = REPO / "examples/user_cnn"


def spec_with(*overrides: str):
    return load_spec(REPO / "jobs/user_cnn.yaml", list(overrides))


@pytest.mark.parametrize("override, words", [
    ("model.name=resnt50", "did you mean 'resnet50'?"),
    ("model.name=my-lab.models:unet", "package.module:callable"),
    ("optim.name=torch.optim.RAdam", "sgd, adamw, or a reference"),
    ("data.dataset=lab_cnn.data", "package.module:callable"),
    ("data.kind=hdf5", "your dataset is only read with data.kind dataset"),
    ("optim.name=sgd", None),
    ("data.path=/data", "pass your dataset's paths in data.options"),
])
def test_validate_refuses_a_wrong_reference_in_one_line(override, words):
    out = cli("validate", "jobs/user_cnn.yaml", "--set", override)
    if words is None:
        assert out.returncode == 0, out.stderr
        return
    errors = [line for line in out.stderr.splitlines() if line.startswith(("error", "warning"))]
    assert words in out.stderr and len(errors) >= 1, out.stderr
    if "warning" not in errors[0]:
        assert out.returncode == 2 and len(errors) == 1, out.stderr


def test_validate_names_a_module_that_is_nowhere_without_importing_anything(tmp_path):
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "__init__.py").write_text("open('IMPORTED', 'w')\n")
    (tmp_path / "lab" / "nets.py").write_text("open('IMPORTED', 'w')\n")
    spec = load_spec(REPO / "jobs/smoke.yaml", ["model.name=lab.nets:net", "optim.name=lab.opt:fast"])
    problems = code_problems(spec, tmp_path)
    assert [(p.key, p.given) for p in problems] == [("optim.name", "'lab.opt:fast'")]
    assert "no module lab.opt" in problems[0].rule and "run.code" in problems[0].fix
    assert not (tmp_path / "IMPORTED").exists()
    out = cli("validate", "jobs/user_cnn.yaml", "--set", "model.name=lab_cnn.nets:SmallCNN")
    assert out.returncode == 2 and "no module lab_cnn.nets" in out.stderr, out.stderr
    out = cli("validate", "jobs/user_cnn.yaml", "--set", "run.code=[examples/nothing]")
    assert out.returncode == 2 and "run.code" in out.stderr, out.stderr


def test_the_users_packages_are_the_ones_found_in_the_submit_directory_or_run_code():
    spec = spec_with("optim.name=torch.optim:RAdam")
    assert own_packages(spec, REPO) == {"lab_cnn": EXAMPLE / "lab_cnn"}   # not torch


def test_the_snapshot_holds_the_users_package(tmp_path):
    from hpc_train.slurm import snapshot

    taken = snapshot.take(snapshot.package_dir(), tmp_path / "cache", {"lab_cnn": EXAMPLE / "lab_cnn"})
    assert (taken.path / "lab_cnn" / "model.py").read_bytes() == (EXAMPLE / "lab_cnn/model.py").read_bytes()
    assert (taken.path / "hpc_train" / "usercode.py").is_file()
    again = snapshot.take(snapshot.package_dir(), tmp_path / "cache", {"lab_cnn": EXAMPLE / "lab_cnn"})
    assert again == taken                                        # checked and shared
    alone = snapshot.take(snapshot.package_dir(), tmp_path / "cache")
    assert alone.sha256 != taken.sha256
    with pytest.raises(Exception, match="rename it"):
        snapshot.take(snapshot.package_dir(), tmp_path / "cache", {"hpc_train": EXAMPLE / "lab_cnn"})


def test_run_code_is_made_absolute_at_submit(tmp_path):
    from hpc_train.spec.paths import resolve_paths

    assert resolve_paths(spec_with(), REPO).run.code == [str(EXAMPLE)]


def test_exponents_in_options_are_numbers():
    spec = spec_with("optim.name=torch.optim:RAdam", "optim.options.eps=1e-6")
    assert spec.optim.options == {"eps": 1e-6}


@pytest.fixture
def example_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield
    for name in [m for m in sys.modules if m.startswith("lab_cnn")]:
        del sys.modules[name]


def test_the_users_model_and_optimizer_are_built_from_the_spec(example_on_path):
    from hpc_train.models import build_model, declared_units
    from hpc_train.train.optim import build_optimizer

    spec = spec_with("optim.name=torch.optim:RAdam", "optim.options.eps=1e-6")
    model = build_model(spec.model.name, spec.data.num_classes, spec.model.options)
    assert type(model).__name__ == "SmallCNN" and model.head[-1].out_features == 10
    assert len(declared_units(model)) == 3
    optimizer = build_optimizer(spec.optim, model.parameters(), lr=0.5)
    assert isinstance(optimizer, torch.optim.RAdam) and optimizer.defaults["eps"] == 1e-6
    with pytest.raises(UserCodeError, match=r"could not be called to build a model .*\['depth'\]"):
        build_model(spec.model.name, 10, {"depth": 3})


def test_the_users_dataset_is_read_by_index(example_on_path):
    from hpc_train.data.sampler import SampleKey
    from hpc_train.train.data import _datasets

    spec = spec_with("data.options.root=" + str(REPO / "data/demo"))
    train, val = _datasets(spec, uint8=False)
    image, label = train[SampleKey(3, 5)]
    assert image.shape == (3, 32, 32) and label == 0
    assert len(train) > len(val) > 0


def write_module(tmp_path, monkeypatch, text: str):
    (tmp_path / "udata.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("udata", None)


def test_a_dataset_without_length_or_a_model_that_is_not_a_module_is_refused(tmp_path, monkeypatch):
    from hpc_train.models import build_model
    from hpc_train.train.data import _datasets

    write_module(tmp_path, monkeypatch, """
        import torch
        class Stream(torch.utils.data.IterableDataset):
            def __iter__(self):
                yield 1
        def stream(split):
            return Stream() if split == "train" else None
        def not_a_module():
            return "a string"
        """)
    spec = load_spec(REPO / "jobs/smoke.yaml", ["data.kind=dataset", "data.dataset=udata:stream",
                                                "data.path=null"])
    with pytest.raises(DataError, match="udata:stream returned Stream for split 'train', which "
                                        "has no __len__"):
        _datasets(spec, uint8=False)
    with pytest.raises(UserCodeError, match="returned str, not a torch.nn.Module"):
        build_model("udata:not_a_module", 10, {})


def test_a_dataset_that_changed_is_refused_at_resume():
    from hpc_train.data.sampler import ResumableBlockSampler

    def sampler(samples=640, fingerprint=None):
        return ResumableBlockSampler(samples, 0, 2, 32, block_size=1, fingerprint=fingerprint)

    saved = sampler(fingerprint="v1").state_dict()
    sampler(fingerprint="v1").load_state_dict(saved)
    with pytest.raises(DataError, match="fingerprint=v1, this run has v2"):
        sampler(fingerprint="v2").load_state_dict(saved)
    with pytest.raises(DataError, match="num_samples=640, this run has 704"):
        sampler(704, fingerprint="v1").load_state_dict(saved)
    sampler(fingerprint="v1").load_state_dict(sampler().state_dict())   # saved before it had one
    assert "fingerprint" not in sampler().state_dict()                  # our data: as before


def test_validate_import_builds_the_users_code_in_a_subprocess(tmp_path):
    out = cli("validate", "jobs/user_cnn.yaml", "--no-slurm", "--import", "--set",
              "task.name=lab_cnn.steps:train_step")
    assert out.returncode == 0, out.stderr
    assert "model.name lab_cnn.model:SmallCNN: SmallCNN, 24,346 parameters" in out.stdout
    assert "task.name lab_cnn.steps:train_step: train_step(model, batch) imports" in out.stdout
    assert "data.dataset lab_cnn.data:images: train 3,000 samples, val 300 samples" in out.stdout
    (tmp_path / "broken_lab").mkdir()
    (tmp_path / "broken_lab" / "__init__.py").write_text("")
    (tmp_path / "broken_lab" / "nets.py").write_text("def build():\n    return make_layers()\n")
    out = cli("validate", "jobs/user_cnn.yaml", "--no-slurm", "--import", "--set",
              f"run.code=[examples/user_cnn, {tmp_path}]", "--set", "model.name=broken_lab.nets:build",
              "--set", "model.options={}")
    assert out.returncode == 2
    assert 'broken_lab/nets.py", line 2, in build' in out.stderr and "NameError" in out.stderr, out.stderr


def test_fsdp_units_named_by_class(example_on_path):
    from hpc_train.models import build_model, shard_units

    spec = spec_with("parallel.backend=fsdp", "parallel.fsdp.units=[Conv2d, Linear]")
    model = build_model(spec.model.name, 10, spec.model.options)
    units = shard_units(spec.model.name, model, spec.parallel.fsdp.units)
    assert [type(u).__name__ for u in units] == ["Linear", "Conv2d", "Conv2d", "Conv2d"]
    nested = shard_units(spec.model.name, model, ["Sequential", "Conv2d"])
    position = {id(u): i for i, u in enumerate(nested)}
    pairs = [(position[id(inner)], i) for i, outer in enumerate(nested)
             for inner in outer.modules() if inner is not outer and id(inner) in position]
    assert len(pairs) == 3 and all(a < b for a, b in pairs)     # children sharded before parents
    with pytest.raises(ValueError, match="no submodule of class Block in lab_cnn.model:SmallCNN; "
                                         "its classes: .*SmallCNN"):
        shard_units(spec.model.name, model, ["Block"])
    out = cli("validate", "jobs/user_cnn.yaml", "--no-slurm", "--set", "parallel.backend=fsdp",
              "--set", "parallel.fsdp.units=[lab_cnn.Block]")
    assert out.returncode == 2 and "a class name is one Python identifier" in out.stderr
