"""Node-local copies (data/local_copy.py): what is copied, kept, replaced, or refused."""

from __future__ import annotations

import json
import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from hpc_train.data.local_copy import copy_shards, expand_place, plan, wait_verdict, write_verdict
from hpc_train.errors import DataError
from tests.conftest import REPO

DEMO = REPO / "data" / "demo-shards"


@pytest.fixture
def shared(tmp_path) -> Path:
    if not (DEMO / "train" / "manifest.json").is_file():
        pytest.skip("demo shards missing: run bash env/setup.sh")
    copy = tmp_path / "shared" / "demo-shards"
    shutil.copytree(DEMO, copy)
    return copy


def test_the_place_is_expanded_on_the_node():
    assert expand_place("$SLURM_TMPDIR/x", {"SLURM_TMPDIR": "/tmp/job7"}) == (Path("/tmp/job7/x"), "")
    place, why = expand_place("$SLURM_TMPDIR", {})
    assert place is None and "$SLURM_TMPDIR is not set on this node" in why
    assert expand_place("/local/scratch", {}) == (Path("/local/scratch"), "")


def test_every_shard_of_every_split_with_its_checksum(shared):
    items = plan(shared)
    manifest = json.loads((shared / "train" / "manifest.json").read_text())
    shards = [i for i in items if i.relative.startswith("train/shard-") and i.relative.endswith(".h5")]
    assert [(i.relative, i.sha256) for i in shards] == [
        (f"train/shard-{n:05d}.h5", s["sha256"]) for n, s in enumerate(manifest["shards"])]
    assert {"train/manifest.json", "val/manifest.json"} <= {i.relative for i in items}


def test_copied_once_kept_on_the_next_start_and_a_damaged_copy_replaced(shared, tmp_path):
    place = tmp_path / "node1"
    first = copy_shards(shared, place, "start-1")
    assert first.local and first.copied == len(plan(shared)) and first.kept == 0
    local = Path(first.root)
    assert local == place / "demo-shards" and (local / "train" / "shard-00000.h5").is_file()
    again = copy_shards(shared, place, "start-2")
    assert (again.copied, again.kept, again.replaced) == (0, len(plan(shared)), 0)
    victim = local / "train" / "shard-00001.h5"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF              # same size, one byte flipped: only the sha256 tells
    victim.write_bytes(bytes(data))
    repaired = copy_shards(shared, place, "start-3")
    assert (repaired.copied, repaired.replaced) == (1, 1)
    assert victim.read_bytes() == (shared / "train" / "shard-00001.h5").read_bytes()


def test_a_damaged_shared_shard_is_refused_not_copies(shared, tmp_path):
    source = shared / "train" / "shard-00000.h5"
    data = bytearray(source.read_bytes())
    data[100] ^= 0xFF
    source.write_bytes(bytes(data))
    with pytest.raises(DataError, match="does not match the manifest's sha256"):
        copy_shards(shared, tmp_path / "node1", "start-1")
    assert not list((tmp_path / "node1").rglob("*.part-*"))


def test_a_disk_too_small_falls_back_to_the_shared_path(shared, tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: usage(10 << 20, 10 << 20, 1024))
    copy = copy_shards(shared, tmp_path / "node1", "start-1")
    assert not copy.local and copy.root == str(shared) and "MiB free" in copy.note


def test_ranks_read_the_verdict_of_their_own_start(tmp_path, shared):
    copy = copy_shards(shared, tmp_path, "start-9")
    write_verdict(tmp_path, copy)
    assert wait_verdict(tmp_path, "start-9", timeout=5).root == copy.root
    with pytest.raises(DataError, match="no local-copy verdict"):
        wait_verdict(tmp_path, "start-10", timeout=0.5)
