"""`data demo`: the promised ImageNet-like layout, real image files, deterministic from the seed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from PIL import Image

from hpc_train.cli import main


def tree_digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def demo(out: Path, seed: int = 0) -> int:
    return main(["data", "demo", "--out", str(out), "--classes", "3", "--per-class", "9",
                 "--val-per-class", "2", "--size", "32", "--seed", str(seed)])


def test_demo_layout(tmp_path, capsys):
    assert demo(tmp_path / "d") == 0
    root = tmp_path / "d"
    classes = sorted(p.name for p in (root / "train").iterdir())
    assert classes == ["n00000000", "n00000001", "n00000002"]
    files = sorted((root / "train/n00000001").iterdir())
    assert len(files) == 9 and (root / "train/n00000001/n00000001_0.JPEG") in files
    pngs = sorted(p.name for p in (root / "train").rglob("*.png"))
    assert pngs == [f"n0000000{k}_7.png" for k in range(3)]
    with Image.open(root / "train/n00000000/n00000000_0.JPEG") as grey:
        assert grey.format == "JPEG" and grey.mode == "L"
    sizes = set()
    for path in (root / "train").rglob("*.*"):
        with Image.open(path) as img:
            img.load()
            sizes.add(img.size)
            assert all(24 <= side <= 48 for side in img.size)  # --size 32: 24..48 px
    assert len(sizes) > 5 and any(w != h for w, h in sizes)
    lines = (root / "val_labels.txt").read_text().splitlines()
    val_files = sorted(p.name for p in (root / "val").iterdir())
    assert [ln.split()[0] for ln in lines] == val_files == [
        f"ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 7)]
    assert sorted(ln.split()[1] for ln in lines) == sorted(classes * 2)
    assert "next: python -m hpc_train data shard" in capsys.readouterr().out


def test_demo_is_deterministic_and_seeded(tmp_path):
    demo(tmp_path / "a")
    demo(tmp_path / "b")
    demo(tmp_path / "c", seed=1)
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")
    assert tree_digest(tmp_path / "a") != tree_digest(tmp_path / "c")


def test_demo_refuses_a_used_folder(tmp_path, capsys):
    demo(tmp_path / "d")
    assert demo(tmp_path / "d") == 6
    assert "choose an empty --out" in capsys.readouterr().err


def test_demo_converts_cleanly_with_val_using_train_classes(tmp_path, capsys):
    demo(tmp_path / "d")
    out = tmp_path / "out"
    assert main(["data", "shard", "--src", str(tmp_path / "d/train"), "--out", str(out)]) == 0
    assert main(["data", "shard", "--src", str(tmp_path / "d/val"), "--labels",
                 str(tmp_path / "d/val_labels.txt"), "--split", "val", "--out", str(out),
                 "--classes", str(out / "train/manifest.json")]) == 0
    assert main(["data", "verify", str(out)]) == 0
    train = json.loads((out / "train/manifest.json").read_text())
    assert train["num_samples"] == 27 and train["num_skipped"] == 0


def test_photo_demo_is_shaped_like_imagenet_photos(tmp_path):
    assert main(["data", "demo", "--out", str(tmp_path / "p"), "--classes", "2", "--per-class", "12",
                 "--val-per-class", "1", "--size", "120", "--photo"]) == 0
    files = sorted((tmp_path / "p" / "train").rglob("*"))
    images = [Image.open(f) for f in files if f.is_file()]
    assert len(images) == 24 and {im.format for im in images} == {"JPEG"}
    assert {im.mode for im in images} == {"RGB"}
    shapes = [(im.width, im.height) for im in images]
    landscape = [w / h for w, h in shapes if w > h]
    assert landscape and all(abs(r - 4 / 3) < 0.02 for r in landscape)
    assert any(h > w for w, h in shapes)                       # some portraits
