"""`data shard / verify / info` end to end: real JPEGs made with Pillow, real HDF5 shards.

Checks the layout, attributes and manifest of docs/shard-format.md, byte-identical originals,
skips and --strict, resume, stale temporaries, array tasks and mpirun ranks (same manifest as
one process: the output is deterministic, so even the sha256s agree).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from hpc_train.cli import main
from hpc_train.data import decode
from hpc_train.data.convert import restart_interval, sample_order, split_into_shards
from tests.conftest import REPO

CLASSES = ["n01440764", "n01443537", "n01484850"]


def image_bytes(w: int, h: int, seed: int, fmt: str = "JPEG", mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), "RGB")
    if mode != "RGB":
        img = img.convert(mode)
    out = io.BytesIO()
    img.save(out, format=fmt)
    return out.getvalue()


def make_folders(root: Path, per_class: int = 4) -> dict[str, tuple[bytes, int]]:
    """ImageFolder tree; returns {key: (bytes, label)} of what should be converted."""
    expected = {}
    for label, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            key = f"{name}/{name}_{i}.JPEG"
            data = image_bytes(12 + i, 10 + label, seed=label * 100 + i)
            (root / key).write_bytes(data)
            expected[key] = (data, label)
    (root / CLASSES[0] / ".hidden.jpg").write_bytes(b"junk")       # hidden: ignored
    (root / CLASSES[0] / "notes.txt").write_text("not an image")   # not an image: ignored
    return expected


def shard(*args: str) -> int:
    return main(["data", "shard", *map(str, args)])


def read_shard(path: Path) -> dict:
    """A shard as docs/shard-format.md describes it, read with plain h5py (not our reader)."""
    with h5py.File(path, "r") as f:
        if f.attrs["encoding"] == "jpeg":
            encoded, offsets = f["encoded"][()], f["offsets"][()]
            images = [bytes(encoded[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]
            layout = {"encoded_chunks": f["encoded"].chunks, "offsets_start": int(offsets[0])}
        else:
            images, layout = f["images"][()], {}
        return {"attrs": {k: (v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()},
                "images": images, "layout": layout, "labels": f["labels"][()].tolist(),
                "keys": [k.decode() for k in f["keys"][()]], "shapes": f["shapes"][()].tolist(),
                "dtypes": {n: f[n].dtype for n in f}}


def run_cli(python, *args, env=None, cwd=REPO):
    return subprocess.run([python, "-m", "hpc_train", *map(str, args)], capture_output=True,
                          text=True, timeout=120, check=False, cwd=cwd, env=env)


@pytest.fixture
def folders(tmp_path):
    src = tmp_path / "train"
    return src, make_folders(src)


def test_class_folders_match_sources_and_the_format_doc(folders, tmp_path, capsys):
    src, expected = folders
    assert shard("--src", src, "--out", tmp_path / "out", "--shard-size", 5) == 0
    split = tmp_path / "out" / "train"
    manifest = json.loads((split / "manifest.json").read_text())
    assert {k: manifest[k] for k in ("format_version", "split", "encoding", "num_samples",
                                     "num_skipped", "shard_size", "seed")} == {
        "format_version": 2, "split": "train", "encoding": "jpeg", "num_samples": 12,
        "num_skipped": 0, "shard_size": 5, "seed": 0}
    assert manifest["class_names"] == CLASSES
    assert manifest["class_to_index"] == {c: i for i, c in enumerate(CLASSES)}
    assert [s["file"] for s in manifest["shards"]] == ["shard-00000.h5", "shard-00001.h5",
                                                       "shard-00002.h5"]
    order = sample_order([(k, lab) for k, (_, lab) in expected.items()], seed=0)
    seen = {}
    for index, (entry, planned) in enumerate(zip(manifest["shards"], split_into_shards(order, 5))):
        sidecar = json.loads((split / f"{entry['file']}.json").read_text())
        assert {k: sidecar[k] for k in entry} == entry  # the sidecar is the manifest entry
        assert entry["bytes"] == (split / entry["file"]).stat().st_size
        s = read_shard(split / entry["file"])
        assert s["attrs"] == {"format_version": 2, "encoding": "jpeg", "split": "train",
                              "num_samples": len(planned), "class_names": json.dumps(CLASSES),
                              "shard_index": index}
        assert list(zip(s["keys"], s["labels"])) == planned  # doc order: sorted, seeded shuffle
        assert s["dtypes"]["labels"] == np.int64 and s["dtypes"]["shapes"] == np.int32
        # One unchunked extent (what the reader's mapped view relies on), offsets from 0 in int64.
        assert s["layout"] == {"encoded_chunks": None, "offsets_start": 0}
        assert s["dtypes"]["encoded"] == np.uint8 and s["dtypes"]["offsets"] == np.int64
        for key, data, label, shape in zip(s["keys"], s["images"], s["labels"], s["shapes"]):
            # The original bytes, with restart markers where cropjpeg is built: same pixels.
            assert data == decode.with_restarts(expected[key][0], restart_interval(None))
            assert label == expected[key][1]
            assert np.array_equal(np.asarray(Image.open(io.BytesIO(data))),
                                  np.asarray(Image.open(io.BytesIO(expected[key][0]))))
            img = Image.open(io.BytesIO(data))
            assert shape == [img.height, img.width, 3]
            seen[key] = label
    assert seen.keys() == expected.keys()
    assert not list(split.glob("*.tmp-*"))
    report = json.loads((split / "report.json").read_text())
    assert report["num_skipped"] == 0 and report["skipped"] == []
    out = capsys.readouterr().out
    assert "writer 0/1: 3 shards written, 0 already done" in out and "manifest:" in out


def test_h5ls_reads_a_shard(folders, tmp_path):
    if shutil.which("h5ls") is None:
        pytest.skip("h5ls not installed (apt package hdf5-tools)")
    src, _ = folders
    shard("--src", src, "--out", tmp_path / "out")
    listing = subprocess.run(["h5ls", "-r", tmp_path / "out/train/shard-00000.h5"],
                             capture_output=True, text=True, check=True).stdout
    assert all(name in listing for name in ("encoded", "offsets", "labels", "keys", "shapes"))


LABEL_FILES = {
    "txt-ext-synset": ("val.txt", "{f} {syn}\n"),
    "txt-stem-int": ("val.txt", "{stem} {idx}\n"),
    "kaggle-csv": ("LOC_val_solution.csv", "{stem},{syn} 1 2 3 4 {syn} 5 6 7 8\n"),
    "plain-csv-noheader": ("labels.csv", "{f},{syn}\n"),
}


@pytest.mark.parametrize("style", sorted(LABEL_FILES))
def test_flat_folder_with_labels_file(style, tmp_path, capsys):
    src = tmp_path / "val"
    src.mkdir()
    name, line = LABEL_FILES[style]
    lines = ["ImageId,PredictionString\n"] if style == "kaggle-csv" else []
    expected = {}
    for i in range(6):
        f = f"ILSVRC2012_val_{i + 1:08d}.{'png' if i == 5 else 'JPEG'}"
        (src / f).write_bytes(image_bytes(9, 9, seed=i, fmt="PNG" if i == 5 else "JPEG"))
        idx = i % 3
        if i < 5:  # the last file has no label line
            lines.append(line.format(f=f, stem=Path(f).stem, syn=CLASSES[idx], idx=idx))
            expected[f] = idx
    lines.append(line.format(f="gone.JPEG", stem="gone", syn=CLASSES[0], idx=0))  # no such file
    (tmp_path / name).write_text("".join(lines))
    assert shard("--src", src, "--labels", tmp_path / name, "--split", "val",
                 "--out", tmp_path / "out", "--shard-size", 4) == 0
    manifest = json.loads((tmp_path / "out/val/manifest.json").read_text())
    want_classes = ["0", "1", "2"] if style == "txt-stem-int" else CLASSES
    assert manifest["class_names"] == want_classes and manifest["num_samples"] == 5
    got = {}
    for entry in manifest["shards"]:
        s = read_shard(tmp_path / "out/val" / entry["file"])
        got.update(zip(s["keys"], s["labels"]))
    assert got == expected
    report = json.loads((tmp_path / "out/val/report.json").read_text())
    assert report["unlabeled"] == ["ILSVRC2012_val_00000006.png"] and report["num_missing"] == 1
    assert "1 files without a label line; 1 label lines without a file" in capsys.readouterr().out


def test_flat_folder_needs_labels_and_some_match(tmp_path, capsys):
    src = tmp_path / "flat"
    src.mkdir()
    (src / "a.jpg").write_bytes(image_bytes(8, 8, 0))
    assert shard("--src", src, "--out", tmp_path / "out") == 6
    assert "--labels" in capsys.readouterr().err
    (tmp_path / "l.txt").write_text("zzz n01\n")
    assert shard("--src", src, "--labels", tmp_path / "l.txt", "--out", tmp_path / "out") == 6
    assert "no entry matches" in capsys.readouterr().err


def test_classes_file_fixes_indices_for_val(folders, tmp_path):
    src, _ = folders
    shard("--src", src, "--out", tmp_path / "out")
    val = tmp_path / "v"
    val.mkdir()
    (val / "x.JPEG").write_bytes(image_bytes(8, 8, 1))
    (tmp_path / "l.txt").write_text(f"x {CLASSES[2]}\n")
    shard("--src", val, "--labels", tmp_path / "l.txt", "--split", "val", "--out", tmp_path / "out",
          "--classes", tmp_path / "out/train/manifest.json")
    m = json.loads((tmp_path / "out/val/manifest.json").read_text())
    assert m["class_names"] == CLASSES
    assert read_shard(tmp_path / "out/val/shard-00000.h5")["labels"] == [2]


def test_reencode_png_grey_cmyk_and_max_side(tmp_path):
    src = tmp_path / "train"
    (src / "a").mkdir(parents=True)
    (src / "b").mkdir()
    files = {"a/big.jpg": image_bytes(40, 20, 1), "a/small.jpg": image_bytes(10, 12, 2),
             "a/p.PNG": image_bytes(10, 6, 3, fmt="PNG"), "b/grey.jpg": image_bytes(9, 7, 4, mode="L"),
             "b/cmyk.jpeg": image_bytes(8, 8, 5, mode="CMYK"), "b/pal.bmp": image_bytes(5, 5, 6, "BMP", "P")}
    for key, data in files.items():
        (src / key).write_bytes(data)
    shard("--src", src, "--out", tmp_path / "out", "--max-side", 16, "--quality", 80)
    s = read_shard(tmp_path / "out/train/shard-00000.h5")
    stored = dict(zip(s["keys"], zip(s["images"], s["shapes"])))
    # A small RGB JPEG: untouched, but for its restart markers (where cropjpeg is built).
    assert stored["a/small.jpg"][0] == decode.with_restarts(files["a/small.jpg"], restart_interval(None))
    assert stored["a/big.jpg"][1] == [8, 16, 3]                # longer side 40 -> 16
    for key, (data, shape) in stored.items():
        img = Image.open(io.BytesIO(data))
        assert img.format == "JPEG" and img.mode == "RGB" and shape == [img.height, img.width, 3]
        if key != "a/small.jpg":
            assert data != files[key]


@pytest.mark.skipif(decode._cropjpeg is None, reason="restart markers need the cropjpeg extension")
def test_restart_markers_by_default_none_with_zero(folders, tmp_path):
    from hpc_train.data import _cropjpeg

    src, expected = folders
    assert shard("--src", src, "--out", tmp_path / "marked") == 0
    assert shard("--src", src, "--out", tmp_path / "plain", "--restart-interval", "0") == 0
    marked = read_shard(tmp_path / "marked/train/shard-00000.h5")
    plain = read_shard(tmp_path / "plain/train/shard-00000.h5")
    assert all(_cropjpeg.intervals(data)["interval"] == 1 for data in marked["images"])
    assert plain["images"] == [expected[key][0] for key in plain["keys"]]
    sidecar = json.loads((tmp_path / "marked/train/shard-00000.h5.json").read_text())
    other = json.loads((tmp_path / "plain/train/shard-00000.h5.json").read_text())
    assert sidecar["fingerprint"] != other["fingerprint"]   # a rerun with the other setting refuses


def test_restart_markers_asked_without_cropjpeg_are_a_clear_error(folders, tmp_path, monkeypatch, capsys):
    src, _ = folders
    monkeypatch.setattr(decode, "_cropjpeg", None)
    assert restart_interval(None) == 0
    assert shard("--src", src, "--out", tmp_path / "out", "--restart-interval", "2") == 6   # a DataError
    err = capsys.readouterr().err
    assert "--restart-interval 2" in err and "cropjpeg_build" in err
    assert not (tmp_path / "out").exists()


def test_raw_encoding_is_square_rgb(folders, tmp_path):
    src, _ = folders
    shard("--src", src, "--out", tmp_path / "out", "--encoding", "raw", "--raw-size", 8)
    m = json.loads((tmp_path / "out/train/manifest.json").read_text())
    assert m["encoding"] == "raw" and m["raw_size"] == 8
    s = read_shard(tmp_path / "out/train/shard-00000.h5")
    assert s["images"].shape == (12, 8, 8, 3) and s["images"].dtype == np.uint8
    assert s["attrs"]["raw_size"] == 8 and s["shapes"] == [[8, 8, 3]] * 12
    with h5py.File(tmp_path / "out/train/shard-00000.h5") as f:
        assert f["images"].chunks == (1, 8, 8, 3)
    assert main(["data", "verify", str(tmp_path / "out")]) == 0


@pytest.mark.parametrize("encoding", ["jpeg", "raw"])
def test_shard_whose_images_were_all_skipped_is_valid_and_empty(tmp_path, encoding):
    src = tmp_path / "train"
    (src / "a").mkdir(parents=True)
    (src / "a/bad.jpg").write_bytes(b"junk")
    (src / "a/good.jpg").write_bytes(image_bytes(8, 8, 0))
    assert shard("--src", src, "--out", tmp_path / "out", "--shard-size", 1, "--encoding", encoding,
                 "--raw-size", 4) == 0
    m = json.loads((tmp_path / "out/train/manifest.json").read_text())
    assert sorted(s["num_samples"] for s in m["shards"]) == [0, 1]
    empty = next(s["file"] for s in m["shards"] if s["num_samples"] == 0)
    records = {"jpeg": ("encoded",), "raw": ("images",)}[encoding]
    with h5py.File(tmp_path / "out/train" / empty) as f:
        assert all(f[name].shape[0] == 0 for name in (*records, "labels", "keys", "shapes"))
        if encoding == "jpeg":
            assert f["offsets"][()].tolist() == [0]
    assert main(["data", "verify", str(tmp_path / "out")]) == 0


def test_unreadable_images_are_skipped_reported_or_fatal_with_strict(folders, tmp_path, python):
    src, _ = folders
    good = (src / CLASSES[1] / f"{CLASSES[1]}_0.JPEG").read_bytes()
    (src / CLASSES[1] / "truncated.JPEG").write_bytes(good[: len(good) // 2])
    (src / CLASSES[2] / "garbage.jpg").write_bytes(b"this is not a jpeg")
    assert shard("--src", src, "--out", tmp_path / "out", "--shard-size", 4) == 0
    split = tmp_path / "out/train"
    m = json.loads((split / "manifest.json").read_text())
    assert m["num_samples"] == 12 and m["num_skipped"] == 2
    assert sum(s["skipped"] for s in m["shards"]) == 2
    report = json.loads((split / "report.json").read_text())
    reasons = {item["key"]: item["reason"] for item in report["skipped"]}
    assert set(reasons) == {f"{CLASSES[1]}/truncated.JPEG", f"{CLASSES[2]}/garbage.jpg"}
    assert "truncated" in reasons[f"{CLASSES[1]}/truncated.JPEG"].lower()
    assert all(item["shard"].startswith("shard-") for item in report["skipped"])

    strict = run_cli(python, "data", "shard", "--src", src, "--out", tmp_path / "strict", "--strict")
    assert strict.returncode == 6, strict.stderr
    assert "error:" in strict.stderr and ("truncated.JPEG" in strict.stderr
                                          or "garbage.jpg" in strict.stderr)
    assert not (tmp_path / "strict/train/manifest.json").exists()


def test_resume_rewrites_only_missing_shards_and_cleans_stale_tmp(folders, tmp_path, capsys):
    src, _ = folders
    out = tmp_path / "out"
    shard("--src", src, "--out", out, "--shard-size", 4)
    split = out / "train"
    before = (split / "manifest.json").read_text()
    mtimes = {p.name: p.stat().st_mtime_ns for p in split.glob("shard-*.h5")}
    (split / "shard-00001.h5").unlink()
    (split / "shard-00001.h5.json").unlink()
    (split / "manifest.json").unlink()
    # A writer killed mid-shard leaves its temporary behind.
    (split / "shard-00001.h5.tmp-deadhost-4242").write_bytes(b"partial")
    (split / "shard-00002.h5.json.tmp-deadhost-4242").write_text("{")
    capsys.readouterr()
    shard("--src", src, "--out", out, "--shard-size", 4)
    assert "1 shards written, 2 already done" in capsys.readouterr().out
    assert (split / "manifest.json").read_text() == before  # same bytes, same checksums
    after = {p.name: p.stat().st_mtime_ns for p in split.glob("shard-*.h5")}
    assert after["shard-00000.h5"] == mtimes["shard-00000.h5"]
    assert after["shard-00002.h5"] == mtimes["shard-00002.h5"]
    assert not list(split.glob("*.tmp-*"))
    # Other settings into the same folder would mix two conversions: refused.
    assert shard("--src", src, "--out", out, "--shard-size", 4, "--seed", 7) == 6
    assert "different conversion" in capsys.readouterr().err


def test_array_tasks_write_the_manifest_after_both_and_match_one_process(folders, tmp_path, python):
    src, _ = folders
    (src / CLASSES[0] / "broken.jpg").write_bytes(b"\xff\xd8 not really")  # report must agree too
    shard("--src", src, "--out", tmp_path / "single", "--shard-size", 3)
    single = (tmp_path / "single/train/manifest.json").read_text()
    args = ["data", "shard", "--src", src, "--out", tmp_path / "array", "--shard-size", 3]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI"))}
    first = run_cli(python, *args, "--task-index", "0", "--task-count", "2", env=env)
    assert first.returncode == 0, first.stderr
    assert "writer 0/2: 3 shards written" in first.stdout  # shards 0, 2, 4 of 5
    assert not (tmp_path / "array/train/manifest.json").exists()
    # The second task finds its place from Slurm's variables; the array starts at 4, not 0.
    env2 = dict(env, SLURM_ARRAY_TASK_ID="5", SLURM_ARRAY_TASK_MIN="4", SLURM_ARRAY_TASK_COUNT="2")
    second = run_cli(python, *args, env=env2)
    assert second.returncode == 0, second.stderr
    assert "writer 1/2: 2 shards written" in second.stdout and "manifest:" in second.stdout
    assert (tmp_path / "array/train/manifest.json").read_text() == single
    assert json.loads(single)["num_skipped"] == 1
    assert (tmp_path / "array/train/report.json").read_text() == (
        tmp_path / "single/train/report.json").read_text()


@pytest.mark.mpi
@pytest.mark.slow
def test_mpirun_ranks_share_shards_and_match_one_process(folders, tmp_path, python, mpirun_argv):
    src, _ = folders
    shard("--src", src, "--out", tmp_path / "single", "--shard-size", 3)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    result = subprocess.run([*mpirun_argv(2), python, "-m", "hpc_train", "data", "shard",
                             "--src", str(src), "--out", str(tmp_path / "mpi"), "--shard-size", "3"],
                            capture_output=True, text=True, timeout=180, cwd=REPO, env=env,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "writer 0/2: 2 shards written" in result.stdout
    assert "writer 1/2: 2 shards written" in result.stdout
    assert (tmp_path / "mpi/train/manifest.json").read_text() == (
        tmp_path / "single/train/manifest.json").read_text()


def test_verify_clean_then_detects_a_flipped_byte(folders, tmp_path, capsys):
    src, _ = folders
    out = tmp_path / "out"
    shard("--src", src, "--out", out, "--shard-size", 5)
    assert main(["data", "verify", str(out)]) == 0
    assert "OK (3 shards, 12 samples checked)" in capsys.readouterr().out
    victim = out / "train/shard-00001.h5"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert main(["data", "verify", str(out), "--split", "train"]) == 6
    err = capsys.readouterr().err
    assert "shard-00001.h5: sha256 differs from the manifest" in err
    assert "shard-00000.h5" not in err and "shard-00002.h5" not in err


def test_info_json_and_plain(folders, tmp_path, capsys):
    src, _ = folders
    shard("--src", src, "--out", tmp_path / "out", "--shard-size", 5)
    capsys.readouterr()
    assert main(["data", "info", str(tmp_path / "out"), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    m = json.loads((tmp_path / "out/train/manifest.json").read_text())
    assert row == {"split": "train", "complete": True, "samples": 12, "classes": 3, "shards": 3,
                   "bytes": sum(s["bytes"] for s in m["shards"]), "encoding": "jpeg",
                   "skipped": 0, "shard_size": 5}
    assert main(["data", "info", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.startswith("train: 12 samples, 3 classes, 3 shards")


def test_cli_module_imports_nothing_heavy(python):
    code = ("import sys, hpc_train.data.cli, hpc_train.cli; hpc_train.cli.build_parser(); "
            "print([m for m in ('h5py', 'torch', 'PIL', 'numpy', 'mpi4py') if m in sys.modules])")
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=REPO,
                            timeout=60, check=False)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
