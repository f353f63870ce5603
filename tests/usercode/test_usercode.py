"""References to the user's code (hpc_train/usercode.py): their form, finding them without
importing them, and loading them on a rank with the user's own traceback kept."""

from __future__ import annotations

import sys
import textwrap

import pytest

from hpc_train import usercode
from hpc_train.usercode import Reference, UserCodeError


@pytest.mark.parametrize("text, module, attribute", [
    ("my_lab.models:unet", "my_lab.models", "unet"),
    ("torch.optim:RAdam", "torch.optim", "RAdam"),
    ("a:Zoo.unet", "a", "Zoo.unet"),
    (" pkg.mod:f ", "pkg.mod", "f"),
])
def test_a_reference_is_module_colon_callable(text, module, attribute):
    assert usercode.parse(text) == Reference(module, attribute)


@pytest.mark.parametrize("text", ["my-lab.models:unet", "models", "a:b:c", "a.:f", ":f", "a:",
                                  "a b:f", "a:f()", "1pkg:f"])
def test_a_wrong_form_names_the_rule(text):
    with pytest.raises(ValueError, match="package.module:callable"):
        usercode.parse(text)


def write(root, files: dict[str, str]):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_a_module_is_located_without_being_imported(tmp_path):
    write(tmp_path, {"lab/__init__.py": "raise SystemExit('imported!')\n",
                     "lab/models.py": "raise SystemExit('imported!')\n",
                     "single.py": "", "plain/sub.py": ""})
    roots = [tmp_path]
    assert usercode.locate(usercode.parse("lab.models:net"), roots) == tmp_path / "lab/models.py"
    assert usercode.locate(usercode.parse("lab:net"), roots) == tmp_path / "lab/__init__.py"
    assert usercode.locate(usercode.parse("single:f"), roots) == tmp_path / "single.py"
    assert usercode.locate(usercode.parse("plain.sub:f"), roots) == tmp_path / "plain/sub.py"
    assert usercode.locate(usercode.parse("lab.missing:net"), roots) is None
    assert usercode.locate(usercode.parse("nowhere:net"), roots) is None
    assert "lab" not in sys.modules


@pytest.mark.parametrize("module, source, top", [
    ("lab.models", "lab/models.py", "lab"), ("lab", "lab/__init__.py", "lab"),
    ("lab.zoo.nets", "lab/zoo/nets.py", "lab"), ("lab.zoo", "lab/zoo/__init__.py", "lab"),
    ("single", "single.py", "single.py")])
def test_the_snapshot_copies_the_top_package(tmp_path, module, source, top):
    assert usercode.package_folder(Reference(module, "f"), tmp_path / source) == tmp_path / top


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    write(tmp_path, {
        "ulab/__init__.py": "",
        "ulab/good.py": """
            VALUE = 3
            def build(width=2):
                return ["built", width]
            def strict(*, width):
                return width
            def broken(width=2):
                return helper(width)
            def helper(width):
                raise TypeError("inside the user's code")
            class Zoo:
                @staticmethod
                def net():
                    return "net"
            """,
        "ulab/bad_import.py": "import numpy\nx = 1 / 0\n",
    })
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m == "ulab" or m.startswith("ulab.")]:
        del sys.modules[name]


def test_load_and_call(user_package):
    assert usercode.call("ulab.good:build", "a model", width=5) == ["built", 5]
    assert usercode.load("ulab.good:Zoo.net")() == "net"


@pytest.mark.parametrize("text, words", [
    ("ulab.nothing:f", "no module named 'ulab.nothing'"),
    ("ulab.good:missing", "'missing' is not defined in ulab.good; it defines VALUE, Zoo, broken"),
    ("ulab.good:VALUE", "int is not callable"),
    ("ulab.bad_import:f", "importing ulab.bad_import raised ZeroDivisionError"),
])
def test_a_reference_that_cannot_be_used_says_why(user_package, text, words):
    with pytest.raises(UserCodeError) as caught:
        usercode.load(text)
    assert str(caught.value).startswith(text) and words in str(caught.value)


def test_the_users_own_error_keeps_their_traceback(user_package):
    with pytest.raises(UserCodeError) as caught:
        usercode.load("ulab.bad_import:f")
    frames = [f.filename for f in _frames(caught.value.__cause__)]
    assert frames[-1].endswith("ulab/bad_import.py")


def _frames(exc):
    import traceback

    return traceback.extract_tb(exc.__traceback__)


def test_a_call_with_the_wrong_options_names_the_reference(user_package):
    with pytest.raises(UserCodeError, match=r"ulab.good:strict could not be called to build a "
                                            r"model .*\['depth'\]"):
        usercode.call("ulab.good:strict", "a model", depth=3)
    # A TypeError raised inside the user's function is theirs, as raised.
    with pytest.raises(TypeError, match="inside the user's code"):
        usercode.call("ulab.good:broken", "a model")
