"""`data verify` and `data info`: check converted shards against their manifest; summarise them.

verify collects every problem (one line each, naming the file) instead of stopping at the first,
so one run tells the whole story of a damaged copy.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from hpc_train.data import manifest as mf
from hpc_train.errors import DataError


def _check_attrs(f, manifest: dict, index: int, entry: dict) -> list[str]:
    want = {"format_version": manifest["format_version"], "encoding": manifest["encoding"],
            "split": manifest["split"], "num_samples": entry["num_samples"], "shard_index": index}
    problems = []
    for name, value in want.items():
        got = f.attrs.get(name)
        got = got.item() if hasattr(got, "item") else got
        if got != value:
            problems.append(f"attr {name} is {got!r}, expected {value!r}")
    try:
        if json.loads(f.attrs.get("class_names", "null")) != manifest["class_names"]:
            problems.append("attr class_names differs from the manifest")
    except (TypeError, ValueError):
        problems.append("attr class_names is not a JSON list")
    return problems


def _record_datasets(manifest: dict) -> dict[str, int]:
    """The datasets that hold a shard's records -> rows more than the shard's samples."""
    if manifest["encoding"] == "jpeg" and manifest["format_version"] >= 2:
        return {"encoded": None, "offsets": 1}     # encoded: bytes, any length
    return {"images": 0}


def _check_datasets(f, path: Path, manifest: dict, n: int) -> list[str]:
    import numpy as np

    from hpc_train.data.shard_records import open_records

    problems = []
    for name, extra in {**_record_datasets(manifest), "labels": 0, "keys": 0, "shapes": 0}.items():
        if name not in f:
            problems.append(f"dataset {name} missing")
        elif extra is not None and f[name].shape[0] != n + extra:
            problems.append(f"dataset {name} has {f[name].shape[0]} rows, expected {n + extra}")
    if problems:
        return problems
    labels = f["labels"][()]
    if n and (labels.min() < 0 or labels.max() >= len(manifest["class_names"])):
        problems.append(f"labels outside 0..{len(manifest['class_names']) - 1}")
    shapes = f["shapes"][()]
    if manifest["encoding"] == "raw":
        images = f["images"]
        size = int(f.attrs.get("raw_size", -1))
        if images.shape[1:] != (size, size, 3) or images.dtype != np.uint8:
            problems.append(f"images shape {images.shape} {images.dtype}, expected "
                            f"(n, {size}, {size}, 3) uint8")
        return problems
    try:
        records = open_records(f, path, n)
    except DataError as exc:
        return [str(exc).removeprefix(f"{path}: ")]
    try:
        return problems + _check_images(f, records, shapes, n)
    finally:
        records.close()


def _check_images(f, records, shapes, n: int) -> list[str]:
    """Every JPEG record decodes (Pillow, every pixel) to the RGB size `shapes` gives."""
    import numpy as np
    from PIL import Image

    problems = []
    for i in range(n):
        try:
            [record] = records.read(np.array([i]))
            img = Image.open(io.BytesIO(record.tobytes()))
            img.load()
        except Exception as exc:  # noqa: BLE001 - any decoder failure is the finding
            problems.append(f"image {i} ({f['keys'][i].decode()}): does not decode ({exc})")
            continue
        if img.mode != "RGB" or (img.height, img.width, 3) != tuple(shapes[i]):
            problems.append(f"image {i}: decodes as {img.mode} {img.height}x{img.width}, "
                            f"shapes says {tuple(int(v) for v in shapes[i])}")
    return problems


def verify_split(split_dir: Path) -> tuple[dict | None, list[str]]:
    """(manifest, problems) for one split folder; each problem names its file."""
    import h5py

    try:
        manifest = mf.load_manifest(split_dir)
    except DataError as exc:
        return None, [str(exc)]
    problems = []
    for index, entry in enumerate(manifest["shards"]):
        path = split_dir / entry["file"]
        if not path.exists():
            problems.append(f"{path}: missing")
            continue
        size = path.stat().st_size
        if size != entry["bytes"]:
            problems.append(f"{path}: {size} bytes, manifest says {entry['bytes']}")
        if mf.sha256_file(path) != entry["sha256"]:
            problems.append(f"{path}: sha256 differs from the manifest")
        try:
            with h5py.File(path, "r") as f:
                found = _check_attrs(f, manifest, index, entry)
                found += _check_datasets(f, path, manifest, entry["num_samples"])
        except (OSError, KeyError, ValueError) as exc:
            found = [f"cannot read as HDF5 ({exc})"]
        problems += [f"{path}: {p}" for p in found]
    total = sum(entry["num_samples"] for entry in manifest["shards"])
    if total != manifest["num_samples"]:
        problems.append(f"{split_dir / mf.MANIFEST}: num_samples {manifest['num_samples']} but "
                        f"the shards hold {total}")
    listed = {entry["file"] for entry in manifest["shards"]}
    for stray in sorted(split_dir.glob("shard-*.h5")):
        if stray.name not in listed:
            problems.append(f"{stray}: not in the manifest (left from another conversion?)")
    return manifest, problems


def split_info(split_dir: Path) -> dict:
    """One row for `data info`: the manifest summary, or how far an unfinished split got."""
    try:
        m = mf.load_manifest(split_dir)
    except DataError:
        sidecars = len(list(split_dir.glob("shard-*.h5.json")))
        return {"split": split_dir.name, "complete": False, "shards_done": sidecars}
    return {"split": m["split"], "complete": True, "samples": m["num_samples"],
            "classes": len(m["class_names"]), "shards": len(m["shards"]),
            "bytes": sum(s["bytes"] for s in m["shards"]), "encoding": m["encoding"],
            "skipped": m["num_skipped"], "shard_size": m["shard_size"]}


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def render_info(rows: list[dict]) -> str:
    """Plain text for pipes (a terminal gets print_rich_info's table)."""
    lines = []
    for r in rows:
        if not r["complete"]:
            lines.append(f"{r['split']}: incomplete ({r['shards_done']} shards done, no manifest)")
        else:
            lines.append(f"{r['split']}: {r['samples']} samples, {r['classes']} classes, "
                         f"{r['shards']} shards, {_human_bytes(r['bytes'])}, {r['encoding']}, "
                         f"{r['skipped']} skipped")
    return "\n".join(lines)


def print_rich_info(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("split", "samples", "classes", "shards", "bytes", "encoding", "skipped"):
        table.add_column(col, justify="left" if col in ("split", "encoding") else "right")
    for r in rows:
        if not r["complete"]:
            table.add_row(r["split"], f"incomplete: {r['shards_done']} shards done", "", "", "", "", "")
        else:
            table.add_row(r["split"], str(r["samples"]), str(r["classes"]), str(r["shards"]),
                          _human_bytes(r["bytes"]), r["encoding"], str(r["skipped"]))
    Console().print(table)
