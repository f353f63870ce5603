"""`data shard`: one split of images -> HDF5 shards, by one writer of N (docs/shard-format.md).

Writers are MPI ranks (`mpirun -np N`), Slurm array tasks (`--task-index/--task-count`), or both
(writer = task * ranks + rank). Each lists and orders the sources the same way (pure functions
below), writes only its own shards, skips the ones already finished, and the writer that sees
every sidecar writes report.json and then manifest.json.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpc_train.data import manifest as mf
from hpc_train.errors import DataError


@dataclass(frozen=True)
class ConvertOptions:
    src: Path
    out: Path
    split: str = "train"
    labels: Path | None = None
    classes: Path | None = None
    shard_size: int = 1024
    encoding: str = "jpeg"
    max_side: int | None = None
    quality: int = 90
    raw_size: int = 256
    restart_interval: int | None = None   # None: 1 where cropjpeg is built, else 0
    seed: int = 0
    strict: bool = False
    task_index: int | None = None
    task_count: int | None = None
    progress_interval: float = 30.0


@dataclass
class WriterSummary:
    writer: int
    writers: int
    shards_written: int = 0
    shards_skipped: int = 0
    images: int = 0
    skipped_images: int = 0
    seconds: float = 0.0


# ---- pure planning -------------------------------------------------------------------------

def sample_order(items: list[tuple[str, int]], seed: int) -> list[tuple[str, int]]:
    """Sorted by key, then one fixed shuffle, so every shard mixes classes."""
    order = sorted(items)
    random.Random(seed).shuffle(order)
    return order


def split_into_shards(order: list, shard_size: int) -> list[list]:
    return [order[i:i + shard_size] for i in range(0, len(order), shard_size)]


def shards_for_writer(num_shards: int, writer: int, writers: int) -> list[int]:
    return list(range(writer, num_shards, writers))


def array_task_from_env(env: Mapping[str, str]) -> tuple[int, int] | None:
    """(index, count) of a Slurm array task, 0-based even when the array starts elsewhere
    (`--array=1-4` has SLURM_ARRAY_TASK_MIN=1) or steps (`--array=0-8:2`)."""
    if "SLURM_ARRAY_TASK_ID" not in env:
        return None
    try:
        task_id = int(env["SLURM_ARRAY_TASK_ID"])
        low = int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
        step = int(env.get("SLURM_ARRAY_TASK_STEP", "1") or 1)
        count = int(env["SLURM_ARRAY_TASK_COUNT"])
    except (KeyError, ValueError) as exc:
        raise DataError(f"Slurm array variables are incomplete or not integers ({exc}); "
                        "pass --task-index and --task-count") from exc
    index, rest = divmod(task_id - low, max(step, 1))
    if rest or not 0 <= index < count:
        raise DataError(f"Slurm array task {task_id} (min {low}, step {step}, count {count}) has no "
                        "place in 0..count-1 (an irregular --array list?); pass --task-index "
                        "and --task-count")
    return index, count


def mpi_world_size(env: Mapping[str, str]) -> int:
    """Ranks in the launching mpirun, read from the environment so a plain run never inits MPI."""
    sizes = (env.get(name, "") for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"))
    return next((int(size) for size in sizes if size.isdigit()), 1)


def resolve_task(task_index: int | None, task_count: int | None,
                 env: Mapping[str, str]) -> tuple[int, int]:
    if (task_index is None) != (task_count is None):
        raise DataError("--task-index and --task-count go together")
    if task_index is None:
        return array_task_from_env(env) or (0, 1)
    if task_count < 1 or not 0 <= task_index < task_count:
        raise DataError(f"--task-index {task_index} must be in 0..{task_count - 1} (--task-count)")
    return task_index, task_count


# ---- execution -------------------------------------------------------------------------

def _clean_stale_tmp(split_dir: Path, name: str) -> None:
    """A killed writer leaves `NAME.tmp-HOST-PID`; the shard's current owner removes it."""
    for stale in split_dir.glob(f"{name}.tmp-*"):
        stale.unlink(missing_ok=True)
    for stale in split_dir.glob(f"{name}.json.tmp-*"):
        stale.unlink(missing_ok=True)


def _read_source(path: Path):
    """The file's bytes, or a BadImage (write_shard records it like an undecodable image)."""
    from hpc_train.data.shard_writer import BadImage

    try:
        return path.read_bytes()
    except OSError as exc:
        return BadImage(f"cannot read: {exc.strerror or exc}")


def _write_own_shards(opts: ConvertOptions, split_dir: Path, listing, shards: list[list],
                      writer: int, writers: int, summary: WriterSummary, label: str) -> None:
    from hpc_train.data.progress import Progress
    from hpc_train.data.shard_writer import EncodeSettings, shard_name, write_shard

    settings = EncodeSettings(opts.encoding, opts.max_side, opts.quality, opts.raw_size,
                              restart_interval(opts.restart_interval))
    mine = shards_for_writer(len(shards), writer, writers)
    todo = []
    for i in mine:
        name = shard_name(i)
        _clean_stale_tmp(split_dir, name)
        fingerprint = mf.shard_fingerprint(opts.split, listing.class_names, settings.describe(),
                                           shards[i])
        sidecar = mf.read_sidecar(split_dir / f"{name}.json")
        if sidecar is not None and (split_dir / name).exists():
            if sidecar.get("fingerprint") != fingerprint:
                raise DataError(f"{split_dir / name}: written by a different conversion (other "
                                "sources or settings); use a new --out or delete that split")
            summary.shards_skipped += 1
            continue
        todo.append((i, fingerprint))

    if todo:
        # A manifest beside missing shards would tell readers the split is complete; it comes
        # back (identical) once the last shard is written.
        (split_dir / mf.MANIFEST).unlink(missing_ok=True)

    def strict_error(key: str, reason: str) -> None:
        raise DataError(f"{opts.src / key}: unreadable image ({reason}); --strict stops here")

    progress = Progress(label, sum(len(shards[i]) for i, _ in todo), len(todo),
                        use_bar=None if writers == 1 else False, interval=opts.progress_interval)
    try:
        for i, fingerprint in todo:
            samples = [(key, lab, _read_source(opts.src / key)) for key, lab in shards[i]]
            result = write_shard(split_dir, i, opts.split, listing.class_names, samples, settings,
                                 strict_error if opts.strict else None, fingerprint)
            summary.shards_written += 1
            summary.images += result.entry["num_samples"]
            summary.skipped_images += result.entry["skipped"]
            progress.advance(len(samples), result.entry["skipped"], shard_done=True)
    finally:
        progress.close()


def try_write_manifest(opts: ConvertOptions, split_dir: Path, listing, num_shards: int) -> dict | None:
    """Write report.json then manifest.json when every shard's sidecar exists; else None."""
    import json

    from hpc_train.data.shard_writer import shard_name, write_text_atomic

    sidecars = []
    for i in range(num_shards):
        sidecar = mf.read_sidecar(split_dir / f"{shard_name(i)}.json")
        if sidecar is None or not (split_dir / shard_name(i)).exists():
            return None
        sidecars.append(sidecar)
    report = mf.build_report(mf.listing_notes(listing), sidecars)
    manifest = mf.build_manifest(opts.split, opts.encoding, listing.class_names, opts.shard_size,
                                 opts.seed, sidecars, opts.raw_size if opts.encoding == "raw" else None)
    write_text_atomic(split_dir / mf.REPORT, json.dumps(report, indent=1) + "\n")
    write_text_atomic(split_dir / mf.MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return manifest


def restart_interval(asked: int | None) -> int:
    """The MCUs between restart markers written into JPEG shards: as asked, else 1 (the fastest
    crop decode, measured in docs/benchmarks.md) where cropjpeg can write them, else 0."""
    from hpc_train.data.decode import installed_decoders

    built = "cropjpeg" in installed_decoders()
    if asked is None:
        return 1 if built else 0
    if asked > 0 and not built:
        raise DataError(f"--restart-interval {asked}: restart markers are written by the cropjpeg "
                        "extension, which is not built here; build it (python -m "
                        "hpc_train.data.cropjpeg_build) or pass --restart-interval 0")
    return asked


def _check_options(opts: ConvertOptions) -> None:
    if opts.shard_size < 1:
        raise DataError(f"--shard-size {opts.shard_size}: must be at least 1")
    if opts.encoding not in ("jpeg", "raw"):
        raise DataError(f"--encoding {opts.encoding!r}: choose jpeg or raw")
    if opts.max_side is not None and opts.max_side < 1:
        raise DataError(f"--max-side {opts.max_side}: must be positive")
    if not 1 <= opts.quality <= 100:
        raise DataError(f"--quality {opts.quality}: must be in 1..100")
    if opts.raw_size < 1:
        raise DataError(f"--raw-size {opts.raw_size}: must be positive")
    if opts.restart_interval is not None and not 0 <= opts.restart_interval <= 65535:
        raise DataError(f"--restart-interval {opts.restart_interval}: must be in 0..65535 MCUs")
    restart_interval(opts.restart_interval)
    if not opts.split or "/" in opts.split or opts.split.startswith("."):
        raise DataError(f"--split {opts.split!r}: must be a plain folder name")


def convert(opts: ConvertOptions) -> WriterSummary:
    """Run this process's share of the conversion (its place from the environment: mpirun's
    ranks, a Slurm array task); print its summary."""
    from hpc_train.data.sources import list_sources

    _check_options(opts)
    task, tasks = resolve_task(opts.task_index, opts.task_count, os.environ)
    comm, rank, ranks = None, 0, mpi_world_size(os.environ)
    if ranks > 1:
        from mpi4py import MPI  # only under mpirun: a plain run must not need MPI init

        comm = MPI.COMM_WORLD
        rank, ranks = comm.Get_rank(), comm.Get_size()
    writer, writers = task * ranks + rank, tasks * ranks
    summary = WriterSummary(writer, writers)
    label = f"writer {writer}/{writers}"
    start = time.monotonic()

    error: BaseException | None = None
    listing = shards = split_dir = None
    try:
        listing = list_sources(opts.src, opts.labels, opts.classes)
        shards = split_into_shards(sample_order(listing.items, opts.seed), opts.shard_size)
        split_dir = opts.out / opts.split
        split_dir.mkdir(parents=True, exist_ok=True)
        _write_own_shards(opts, split_dir, listing, shards, writer, writers, summary, label)
    except BaseException as exc:  # noqa: BLE001 - re-raised below, after the collective
        error = exc
    # Every rank reaches this collective, even one that failed, so nobody waits forever.
    if comm is not None and comm.allreduce(0 if error is None else 1) and error is None:
        error = DataError(f"{label}: another rank failed; no manifest written")
    if error is not None:
        raise error
    summary.seconds = time.monotonic() - start

    _print_summary(summary, listing)
    if rank == 0:
        manifest = try_write_manifest(opts, split_dir, listing, len(shards))
        if manifest is not None:
            print(f"manifest: {split_dir / mf.MANIFEST} ({manifest['num_samples']} samples in "
                  f"{len(shards)} shards, {manifest['num_skipped']} skipped)")
        else:
            done = sum((split_dir / f"shard-{i:05d}.h5.json").exists() for i in range(len(shards)))
            print(f"{label}: {done}/{len(shards)} shards done; the writer that finishes last "
                  "writes the manifest")
    return summary


def _print_summary(s: WriterSummary, listing) -> None:
    rate = s.images / s.seconds if s.seconds > 0 else 0.0
    print(f"writer {s.writer}/{s.writers}: {s.shards_written} shards written, "
          f"{s.shards_skipped} already done; {s.images} images in {s.seconds:.1f} s "
          f"({rate:.0f} img/s); {s.skipped_images} unreadable skipped", flush=True)
    if s.writer == 0:
        left_out = {"files without a label line": listing.unlabeled,
                    "label lines without a file": listing.missing,
                    "loose images outside class folders": listing.ignored,
                    "empty class folders": listing.empty_classes}
        shown = [f"{len(names)} {what}" for what, names in left_out.items() if names]
        if shown:
            print(f"note: {'; '.join(shown)} (listed in report.json)", flush=True)
