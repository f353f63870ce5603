"""manifest.json, report.json and per-shard sidecars (docs/shard-format.md).

Pure builders plus small readers. The manifest is a function of the plan and the sidecars only,
so whichever writer happens to see the last sidecar writes the same file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from hpc_train.errors import DataError
from hpc_train.rundir import parse_json

FORMAT_VERSION = 2   # what the converter writes
# 1: JPEG records as one variable-length `images` dataset (HDF5 reads each element through its
# global heap: ~90 us a record, against a view of the mapped file for version 2's `encoded`). Still read.
READABLE_VERSIONS = (1, 2)
MANIFEST = "manifest.json"
REPORT = "report.json"
# Manifest entry keys; the sidecar holds these plus skipped_items and fingerprint.
ENTRY_KEYS = ("file", "num_samples", "bytes", "sha256", "skipped")


def shard_fingerprint(split: str, class_names: list[str], settings: dict,
                      samples: list[tuple[str, int]]) -> str:
    """What a shard's bytes depend on. A rerun whose shard would differ (new files, other
    --shard-size, --seed, --encoding ...) finds a different fingerprint and refuses to mix."""
    text = json.dumps([FORMAT_VERSION, split, class_names, settings, samples], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


def read_sidecar(path: Path) -> dict | None:
    """The sidecar at path, or None when it is absent or half-written (treated as not done)."""
    try:
        data = parse_json(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or any(k not in data for k in ENTRY_KEYS):
        return None
    return data


def build_manifest(split: str, encoding: str, class_names: list[str], shard_size: int,
                   seed: int, sidecars: list[dict], raw_size: int | None = None) -> dict:
    entries = [{k: sc[k] for k in ENTRY_KEYS} for sc in sidecars]
    manifest = {
        "format_version": FORMAT_VERSION,
        "split": split,
        "encoding": encoding,
        "num_samples": sum(e["num_samples"] for e in entries),
        "num_skipped": sum(e["skipped"] for e in entries),
        "class_names": list(class_names),
        "class_to_index": {name: i for i, name in enumerate(class_names)},
        "shard_size": shard_size,
        "seed": seed,
    }
    if raw_size is not None:
        manifest["raw_size"] = raw_size
    manifest["shards"] = entries
    return manifest


def build_report(listing_notes: dict, sidecars: list[dict]) -> dict:
    """Skipped images with reasons, plus what the source listing left out (flat layout)."""
    skipped = [dict(item, shard=sc["file"]) for sc in sidecars for item in sc.get("skipped_items", [])]
    return {"num_skipped": len(skipped), "skipped": skipped, **listing_notes}


def listing_notes(listing) -> dict:
    """Counts and (capped) names of source files that never became samples."""
    notes = {}
    for name in ("unlabeled", "missing", "ignored", "empty_classes"):
        values = getattr(listing, name)
        notes[f"num_{name}"] = len(values)
        notes[name] = values[:1000]  # ImageNet-sized mismatches would bloat the report
    return notes


def train_class_names(shard_root) -> list[str] | None:
    """The class names of the train split under `shard_root`; None when its manifest cannot be
    read from here."""
    try:
        return list(parse_json((Path(shard_root) / "train" / MANIFEST).read_text())["class_names"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def find_split_dirs(root: Path, split: str | None = None) -> list[Path]:
    """Split folders under root (those with a manifest or sidecars); root itself if it is one."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: not a directory")
    if (root / MANIFEST).exists() or any(root.glob("shard-*.h5.json")):
        dirs = [root]
    else:
        dirs = sorted(p for p in root.iterdir() if p.is_dir() and
                      ((p / MANIFEST).exists() or any(p.glob("shard-*.h5.json"))))
    if split is not None:
        dirs = [d for d in dirs if d.name == split]
        if not dirs:
            raise DataError(f"{root}: no split {split!r} (no {root / split / MANIFEST})")
    if not dirs:
        raise DataError(f"{root}: no converted split (no */{MANIFEST} or shard sidecars)")
    return dirs


def load_manifest(split_dir: Path) -> dict:
    """The split's manifest.json, of the format this code reads."""
    path = split_dir / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        done = len(list(split_dir.glob("shard-*.h5.json")))
        raise DataError(f"{path} is missing: the split is incomplete (the converter writes the "
                        f"manifest last; {done} shard sidecars present: rerun `data shard` with the "
                        "same arguments to finish it) or the path is wrong") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} is unreadable: {exc}") from None
    version = manifest.get("format_version")
    if version not in READABLE_VERSIONS:
        readable = " and ".join(map(str, READABLE_VERSIONS))
        raise DataError(f"{path}: format_version {version!r} is not supported (this reader "
                        f"reads versions {readable}); convert again with this version of "
                        "hpc_train or upgrade it")
    return manifest


def token_windows(manifest: dict, seq_len: int) -> list[int]:
    """Training windows (seq_len + 1 tokens: inputs and the next-token targets) in each shard
    of a token split's manifest; raises KeyError/TypeError/ValueError on a damaged one."""
    return [max(0, (int(s["tokens"]) - 1) // seq_len) for s in manifest["shards"]]
