"""Every reader of a run directory on the login node, on every file of it damaged as a node
crash or a full disk leaves it: bytes that are not UTF-8, a file cut in half, binary garbage, an
empty file. The commands read what they can, say what they skipped, and never raise."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hpc_train.bench.inspect import make_run
from hpc_train.cli import main
from hpc_train.rundir import read_jsonl
from tests.conftest import REPO

DAMAGES = {
    "not-utf8": lambda data: data[:len(data) // 2] + b"\xff\xfe\x80" + data[len(data) // 2:],
    "cut-in-half": lambda data: data[:len(data) // 2],
    "garbage": lambda data: bytes(range(256)) * 8,
    "empty": lambda data: b"",
    # JSON (or YAML) nested past Python's recursion limit (1000; 20 times that, should a library
    # have raised it): its parsers raise RecursionError.
    "nested-deep": lambda data: b"[" * 20_000 + b"]" * 20_000,
    "a-nested-deep-line": lambda data: data + b"\n" + b"[" * 20_000 + b"]" * 20_000 + b"\n",
}
COMMANDS = (["status", "--no-slurm"], ["status", "--json", "--no-slurm"], ["diagnose"],
            ["report", "--no-slurm", "--no-plot"], ["logs", "--all-ranks"])


@pytest.fixture(scope="module", params=["per-rank", "per-node"])
def pristine(tmp_path_factory, request) -> Path:
    """A finished run; per-node: its beats and logs as a node's writer leaves them
    (heartbeat/node-<host>.json, logs/node-<host>.log) instead of one file per rank."""
    paths = make_run(tmp_path_factory.mktemp("pristine"), ranks=2, metric_lines=40)
    shutil.copy(REPO / "jobs/smoke.yaml", paths.spec)
    (paths.root / "environment.jsonl").write_text('{"rank": 0, "host": "node0", "env": {}}\n')
    if request.param == "per-node":
        beats = [json.loads(paths.rank_heartbeat(r).read_text()) for r in (0, 1)]
        paths.node_heartbeat("node0").write_text(json.dumps(
            {"host": "node0", "writer": 0, "time": beats[0]["time"], "beats": beats}))
        paths.node_log("node0").write_text("".join(
            f"[rank {r}] {line}\n" for r in (0, 1) for line in paths.rank_log(r).read_text().splitlines()))
        for r in (0, 1):
            paths.rank_heartbeat(r).unlink()
            paths.rank_log(r).unlink()
    return paths.root


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_the_pristine_run_has_the_files_the_readers_read(pristine, capsys):
    assert main(["logs", str(pristine), "--all-ranks"]) == 0
    printed = capsys.readouterr().out
    assert "[rank 0]" in printed and "[rank 1]" in printed
    names = _files(pristine)
    logs = "logs/node-" if "logs/node-node0.log" in names else "logs/rank-"
    beats = "heartbeat/node-" if logs == "logs/node-" else "heartbeat/rank-"
    for expected in ("events.jsonl", "metrics.jsonl", "spec.yaml", "environment.jsonl", logs, beats):
        assert any(name.startswith(expected) for name in names), names


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_every_reader_survives_every_damaged_file(pristine, tmp_path, damage, capsys):
    for name in _files(pristine):
        run = tmp_path / name.replace("/", "_")
        shutil.copytree(pristine, run)
        target = run / name
        target.write_bytes(DAMAGES[damage](target.read_bytes()))
        for command in COMMANDS:
            code = main([command[0], str(run), *command[1:]])   # raises on a traceback
            out = capsys.readouterr()
            assert code in (0, 1, 2, 7), (name, command, code, out.err[-2000:])
            assert "Traceback" not in out.err + out.out, (name, command)


def test_a_directory_in_place_of_a_run_file_is_read_as_missing(pristine, tmp_path, capsys):
    for name in _files(pristine):
        run = tmp_path / name.replace("/", "_")
        shutil.copytree(pristine, run)
        (run / name).unlink()
        (run / name).mkdir()
        for command in COMMANDS:
            code = main([command[0], str(run), *command[1:]])   # raises on a traceback
            out = capsys.readouterr()
            assert code in (0, 1, 2, 7), (name, command, code, out.err[-2000:])


def test_a_jsonl_file_with_bytes_that_are_not_utf8_is_read_and_the_damage_said(tmp_path, caplog):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"event": "a"}\n{"event": "b\xff"}\n\xff\xfe\n{"event": "c"}\n{"ev')
    records = read_jsonl(path)
    assert [r["event"] for r in records] == ["a", "b\ufffd", "c"]
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "2 line(s) with bytes that are not UTF-8" in said and "2 line(s) that are not JSON" in said
    caplog.clear()
    read_jsonl(path)                  # the same damage is said once per process
    assert not caplog.records
