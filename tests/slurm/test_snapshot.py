"""The code snapshot taken at submit: what is copied, the cache key, the cache itself, the link
of a run, and the driver line that imports from it (run by bash here, with a stand-in Python)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train.errors import SubmitError
from hpc_train.rundir import RunPaths
from hpc_train.runtime.environment import code_problem
from hpc_train.slurm import snapshot
from hpc_train.slurm.run_code import CODE_KEEP, CODE_NEW, CODE_NONE, prepare_code
from hpc_train.slurm.script import driver_command


def make_package(root: Path) -> Path:
    package = root / "src" / "hpc_train"
    for name, text in {"__init__.py": "", "a.py": "A = 1\n", "sub/__init__.py": "",
                       "sub/b.py": "B = 2\n", "notes.txt": "not source\n",
                       "__pycache__/a.cpython-311.pyc": "bytecode", ".hidden/c.py": "C = 3\n",
                       "sub/__pycache__/b.cpython-311.pyc": "bytecode"}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    outside = root / "elsewhere"
    outside.mkdir()
    (outside / "d.py").write_text("D = 4\n")
    (package / "linked").symlink_to(outside, target_is_directory=True)
    return package


def test_only_source_files_are_copied_and_links_to_folders_not_followed(tmp_path):
    package = make_package(tmp_path)
    assert snapshot.source_files(package) == ["__init__.py", "a.py", "sub/__init__.py", "sub/b.py"]


def test_the_cache_key_follows_content_and_names_only():
    base = {"hpc_train/a.py": b"A = 1\n", "hpc_train/b.py": b"B = 2\n"}
    key = snapshot.digest(base)
    assert len(key) == 64 and key == snapshot.digest(dict(reversed(base.items())))
    assert snapshot.digest({**base, "hpc_train/a.py": b"A = 2\n"}) != key       # an edit
    assert snapshot.digest({"hpc_train/c.py": b"A = 1\n", "hpc_train/b.py": b"B = 2\n"}) != key  # a rename
    assert snapshot.digest({**base, "hpc_train/new.py": b""}) != key             # a new file


def test_take_copies_once_per_content_read_only(tmp_path):
    package = make_package(tmp_path)
    cache = tmp_path / "runs" / ".code"
    first = snapshot.take(package, cache)
    assert first.path == cache / first.sha256 and first.files == 4
    copied = first.path / "hpc_train" / "sub" / "b.py"
    assert copied.read_text() == "B = 2\n" and (copied.stat().st_mode & 0o222) == 0   # read-only
    again = snapshot.take(package, cache)
    assert again == first and copied.stat().st_ino == (first.path / "hpc_train/sub/b.py").stat().st_ino
    assert [p.name for p in cache.iterdir()] == [first.sha256]       # no partial folder left
    (package / "a.py").write_text("A = 'edited'\n")
    edited = snapshot.take(package, cache)
    assert edited.sha256 != first.sha256
    assert (first.path / "hpc_train/a.py").read_text() == "A = 1\n"   # the old copy is untouched


def test_a_snapshot_changed_after_it_was_written_is_refused(tmp_path):
    package = make_package(tmp_path)
    taken = snapshot.take(package, tmp_path / ".code")
    target = taken.path / "hpc_train" / "a.py"
    target.chmod(0o644)
    target.write_text("A = 'tampered'\n")
    with pytest.raises(SubmitError, match="changed after it was written.*Fix: remove that folder"):
        snapshot.take(package, tmp_path / ".code")


def test_a_run_links_keeps_and_drops_its_snapshot(tmp_path):
    package = make_package(tmp_path)
    paths = RunPaths.new(tmp_path / "runs", "r")
    taken = snapshot.take(package, paths.code_cache)
    code, recorded = prepare_code(paths, CODE_NEW, taken)
    assert code == paths.code and paths.code.resolve() == taken.path
    assert os.readlink(paths.code) == f"../.code/{taken.sha256}"      # relative: the root may move
    assert recorded == {"path": str(taken.path), "sha256": taken.sha256, "files": 4}
    code, recorded = prepare_code(paths, CODE_KEEP, None)
    assert code == paths.code and recorded["sha256"] == taken.sha256 and recorded["reused"]
    assert prepare_code(paths, CODE_NONE, None) == (None, None) and not paths.code.is_symlink()
    assert prepare_code(paths, CODE_KEEP, None) == (None, None)     # a run without one keeps none


def test_a_link_to_a_removed_snapshot_is_one_error_with_both_fixes(tmp_path):
    package = make_package(tmp_path)
    paths = RunPaths.new(tmp_path / "runs", "r")
    taken = snapshot.take(package, paths.code_cache)
    snapshot.link(paths, taken)
    subprocess.run(["rm", "-rf", str(taken.path)], check=True)
    with pytest.raises(SubmitError, match="holds no hpc_train.*--new-snapshot.*--no-snapshot"):
        prepare_code(paths, CODE_KEEP, None)


def test_the_driver_line_puts_the_snapshot_first_for_python(tmp_path):
    """bash runs the line as the batch script would; a stand-in Python prints what it got."""
    fake = tmp_path / "my python"
    fake.write_text('#!/bin/sh\necho "PYTHONPATH=$PYTHONPATH"\necho "PYTHONSAFEPATH=$PYTHONSAFEPATH"\necho "$@"\n')
    fake.chmod(0o755)
    code = tmp_path / "run $(touch pwned)" / "code"
    line = driver_command(str(fake), code.parent, code)
    for before, expected in ((None, str(code)), ("/user/lib", f"{code}:/user/lib")):
        env = {"PATH": os.environ["PATH"], **({"PYTHONPATH": before} if before else {})}
        out = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert out.stdout.splitlines() == [f"PYTHONPATH={expected}", "PYTHONSAFEPATH=1",
                                           f"-m hpc_train.job.driver {code.parent}"], out.stderr
    assert not (tmp_path / "pwned").exists()
    assert driver_command(str(fake), code.parent) == f"exec '{fake}' -m hpc_train.job.driver '{code.parent}'"


def test_python_imports_the_snapshot_not_the_checkout_in_the_current_directory(tmp_path):
    """The reason for PYTHONSAFEPATH: `python -m` otherwise imports the cwd's own copy first."""
    snap = tmp_path / "snap" / "pkgx"
    checkout = tmp_path / "checkout" / "pkgx"
    for where, marker in ((snap, "snapshot"), (checkout, "checkout")):
        where.mkdir(parents=True)
        (where / "__init__.py").write_text(f"WHO = {marker!r}\n")
        (where / "__main__.py").write_text("from pkgx import WHO\nprint(WHO)\n")
    for safe, expected in (("1", "snapshot"), ("", "checkout")):
        env = {**os.environ, "PYTHONPATH": str(snap.parent), "PYTHONSAFEPATH": safe}
        out = subprocess.run([sys.executable, "-m", "pkgx"], capture_output=True, text=True, env=env,
                             cwd=checkout.parent)
        assert out.stdout.strip() == expected, out.stderr


def test_code_problem_only_when_the_snapshot_was_asked_for_and_missed(tmp_path):
    link = tmp_path / "run" / "code"
    (tmp_path / "snap" / "hpc_train").mkdir(parents=True)
    link.parent.mkdir()
    link.symlink_to(tmp_path / "snap")
    asked = {"PYTHONPATH": f"{link}:/other"}
    assert code_problem(asked, link, tmp_path / "snap" / "hpc_train") is None
    assert code_problem({"PYTHONPATH": "/other"}, link, tmp_path / "checkout" / "hpc_train") is None
    problem = code_problem(asked, link, tmp_path / "checkout" / "hpc_train")
    assert "not from the run's snapshot" in problem and "Fix:" in problem


def test_the_built_jpeg_decoder_travels_with_the_snapshot(tmp_path):
    """A job imports the snapshot: the extension built in place must be in it, or the job decodes
    with the slower fallback while the checkout it came from has the fast one."""
    package = tmp_path / "hpc_train"
    (package / "data").mkdir(parents=True)
    (package / "data" / "decode.py").write_text("")
    (package / "data" / "_cropjpeg.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    (package / "data" / "_cropjpeg.cpython-311-x86_64-linux-gnu.so.stamp").write_text("x")
    assert snapshot.source_files(package) == ["data/_cropjpeg.cpython-311-x86_64-linux-gnu.so",
                                              "data/decode.py"]
