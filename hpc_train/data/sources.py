"""Finding the images of one split and their labels (pure, no image decoding).

Two layouts: class folders (`SRC/<class>/**/<image>`, ImageNet train, any ImageFolder tree) and a
flat folder plus a labels file (ImageNet validation: `SRC/<image>` and `filename label` lines or
Kaggle's `LOC_val_solution.csv`). Both end in the same `Listing`: (key, label index) pairs sorted
by key, the class names, and what did not match, so the converter never cares which one it was.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from hpc_train.errors import DataError

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp"})
# First cells of a header row in the CSVs we know (Kaggle: ImageId,PredictionString).
_HEADER_WORDS = frozenset({"imageid", "image_id", "image", "filename", "file", "name", "path",
                           "predictionstring", "label", "class", "synset"})


@dataclass(frozen=True)
class Listing:
    """The samples of one split: `items` are (key, label index), sorted by key."""

    layout: str                      # "folders" or "flat"
    class_names: list[str]
    items: list[tuple[str, int]]
    unlabeled: list[str] = field(default_factory=list)       # flat: files no label line names
    missing: list[str] = field(default_factory=list)         # flat: label lines without a file
    ignored: list[str] = field(default_factory=list)         # folders: loose files at the top
    empty_classes: list[str] = field(default_factory=list)   # folders: class dirs with no image


def is_image_name(name: str) -> bool:
    return not name.startswith(".") and PurePosixPath(name).suffix.lower() in IMAGE_EXTENSIONS


def _visible_dirs(src: Path) -> list[Path]:
    return sorted(p for p in src.iterdir() if p.is_dir() and not p.name.startswith("."))


def _images_under(folder: Path, root: Path) -> list[str]:
    """Image keys (posix paths relative to root) anywhere under folder, hidden entries skipped."""
    keys = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if is_image_name(name):
                keys.append(Path(dirpath, name).relative_to(root).as_posix())
    return keys


def detect_layout(src: Path) -> str:
    """'folders' when some subdirectory holds images, else 'flat' (which needs --labels)."""
    if not src.is_dir():
        raise DataError(f"--src {src}: not a directory")
    return "folders" if any(_images_under(sub, src) for sub in _visible_dirs(src)) else "flat"


def read_class_list(path: Path) -> list[str]:
    """Class names in index order from a text file (first token per line, so ImageNet's
    LOC_synset_mapping.txt works) or a manifest.json (its class_names: reuse train's order)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise DataError(f"--classes {path}: cannot read ({exc.strerror})") from exc
    if path.suffix == ".json":
        try:
            names = json.loads(text)["class_names"]
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"--classes {path}: not a manifest with class_names") from exc
    else:
        names = [line.split()[0] for line in text.splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
    if not names:
        raise DataError(f"--classes {path}: no class names")
    if len(set(names)) != len(names):
        raise DataError(f"--classes {path}: duplicate class names")
    return [str(n) for n in names]


def parse_labels_text(text: str, origin: str = "labels") -> list[tuple[str, str]]:
    """(file name or stem, label) pairs from a labels file.

    CSV when the first data line has a comma: `ImageId,PredictionString` (label = first token of
    the second cell, as in LOC_val_solution.csv) or `filename,label`, header row optional.
    Otherwise whitespace `filename label` lines; blank lines and `#` comments are skipped.
    """
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise DataError(f"{origin}: no label lines")
    pairs: list[tuple[str, str]] = []
    if "," in lines[0]:
        rows = list(csv.reader(io.StringIO("\n".join(lines))))
        if rows and rows[0] and rows[0][0].strip().lower() in _HEADER_WORDS:
            rows = rows[1:]
        for number, row in enumerate(rows, start=1):
            if len(row) < 2 or not row[0].strip() or not row[1].split():
                raise DataError(f"{origin}: CSV row {number} {row!r}: need 'file,label'")
            pairs.append((row[0].strip(), row[1].split()[0]))
    else:
        for number, line in enumerate(lines, start=1):
            parts = line.split()
            if len(parts) < 2:
                raise DataError(f"{origin}: line {number} {line.strip()!r}: need 'filename label'")
            pairs.append((parts[0], parts[1]))
    return pairs


def resolve_classes(labels: list[str], classes: list[str] | None,
                    origin: str = "labels") -> tuple[list[str], dict[str, int]]:
    """Class names and label -> index. Integer labels are 0-based indices (into --classes when
    given); names index the sorted distinct labels, or their position in --classes."""
    distinct = sorted(set(labels))
    if distinct and all(lab.lstrip("-").isdigit() for lab in distinct):
        values = {lab: int(lab) for lab in distinct}
        top = len(classes) if classes is not None else max(values.values()) + 1
        bad = [lab for lab, v in values.items() if not 0 <= v < top]
        if bad:
            raise DataError(f"{origin}: integer labels {bad[:5]} outside 0..{top - 1}"
                            + (" (the --classes list)" if classes is not None else ""))
        names = classes if classes is not None else [str(i) for i in range(top)]
        return names, values
    if classes is None:
        return distinct, {lab: i for i, lab in enumerate(distinct)}
    index = {name: i for i, name in enumerate(classes)}
    unknown = [lab for lab in distinct if lab not in index]
    if unknown:
        raise DataError(f"{origin}: labels not in --classes: {unknown[:5]}"
                        + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""))
    return classes, {lab: index[lab] for lab in distinct}


def match_labels(files: list[str], pairs: list[tuple[str, str]],
                 origin: str = "labels") -> tuple[dict[str, str], list[str], list[str]]:
    """Pair folder files with label lines: full name first, else stem (Kaggle ImageIds have no
    extension). Returns ({file: label}, files without a line, lines without a file)."""
    by_name = {f: f for f in files}
    by_stem: dict[str, list[str]] = {}
    for f in files:
        by_stem.setdefault(PurePosixPath(f).stem, []).append(f)
    matched: dict[str, str] = {}
    missing: list[str] = []
    for name, label in pairs:
        target = by_name.get(name)
        if target is None:
            candidates = by_stem.get(name) or by_stem.get(PurePosixPath(name).stem) or []
            if len(candidates) > 1:
                raise DataError(f"{origin}: {name!r} matches several files: {sorted(candidates)}")
            target = candidates[0] if candidates else None
        if target is None:
            missing.append(name)
        elif matched.get(target, label) != label:
            raise DataError(f"{origin}: {target} has two labels: {matched[target]!r}, {label!r}")
        else:
            matched[target] = label
    unlabeled = sorted(f for f in files if f not in matched)
    return matched, unlabeled, missing


def list_class_folders(src: Path, classes: list[str] | None = None) -> Listing:
    class_dirs = _visible_dirs(src)
    names = [d.name for d in class_dirs]
    if classes is not None:
        extra = sorted(set(names) - set(classes))
        if extra:
            raise DataError(f"--src {src}: class folders not in --classes: {extra[:5]}")
        names = classes
    index = {name: i for i, name in enumerate(names)}
    items: list[tuple[str, int]] = []
    empty = []
    for d in class_dirs:
        keys = _images_under(d, src)
        if not keys:
            empty.append(d.name)
        items.extend((key, index[d.name]) for key in keys)
    if not items:
        raise DataError(f"--src {src}: no images ({', '.join(sorted(IMAGE_EXTENSIONS))}) "
                        "in its class folders")
    ignored = sorted(p.name for p in src.iterdir() if p.is_file() and is_image_name(p.name))
    return Listing("folders", names, sorted(items), ignored=ignored, empty_classes=empty)


def list_flat(src: Path, labels_file: Path, classes: list[str] | None = None) -> Listing:
    try:
        text = labels_file.read_text()
    except OSError as exc:
        raise DataError(f"--labels {labels_file}: cannot read ({exc.strerror})") from exc
    pairs = parse_labels_text(text, origin=f"--labels {labels_file}")
    files = sorted(p.name for p in src.iterdir() if p.is_file() and is_image_name(p.name))
    matched, unlabeled, missing = match_labels(files, pairs, origin=f"--labels {labels_file}")
    if not matched:
        raise DataError(f"--labels {labels_file}: no entry matches an image in {src} "
                        f"({len(files)} images, {len(pairs)} label lines; e.g. "
                        f"{pairs[0][0]!r} vs {files[0] if files else 'no files'!r})")
    names, to_index = resolve_classes(list(matched.values()), classes,
                                      origin=f"--labels {labels_file}")
    items = sorted((key, to_index[label]) for key, label in matched.items())
    return Listing("flat", names, items, unlabeled=unlabeled, missing=missing)


def list_sources(src: Path, labels_file: Path | None = None,
                 classes_file: Path | None = None) -> Listing:
    """The split at src: flat with --labels, class folders when detected, else an error."""
    classes = read_class_list(classes_file) if classes_file is not None else None
    if labels_file is not None:
        if not src.is_dir():
            raise DataError(f"--src {src}: not a directory")
        return list_flat(src, labels_file, classes)
    if detect_layout(src) == "folders":
        return list_class_folders(src, classes)
    raise DataError(f"--src {src}: no class folders with images; a flat folder of images needs "
                    "--labels FILE ('filename label' lines or a CSV)")
