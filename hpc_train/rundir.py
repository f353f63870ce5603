"""The run directory contract: one object owns every name under a run directory.

Everything that happens to a run is written here, so inspection works from files alone on any
login node, even with Slurm accounting off (the files and events: docs/run-directory.md).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def spec(self) -> Path:
        return self.root / "spec.yaml"

    @property
    def sbatch(self) -> Path:
        return self.root / "sbatch.sh"

    @property
    def submitit(self) -> Path:
        return self.root / "submitit"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def heartbeat(self) -> Path:
        return self.root / "heartbeat"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank-{rank:05d}.log"

    def rank_heartbeat(self, rank: int) -> Path:
        return self.heartbeat / f"rank-{rank:05d}"

    def make_dirs(self) -> None:
        for path in (self.root, self.logs, self.heartbeat, self.checkpoints, self.submitit):
            path.mkdir(parents=True, exist_ok=True)

    @classmethod
    def new(cls, run_root: str | Path, name: str, now: datetime | None = None) -> RunPaths:
        """A fresh `<root>/<name>-<YYYYmmdd-HHMMSS>[-N]` directory, created here."""
        stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
        base = Path(run_root).resolve() / f"{name}-{stamp}"
        candidate, n = base, 1
        while True:
            try:
                candidate.mkdir(parents=True)
                break
            except FileExistsError:
                n += 1
                candidate = base.with_name(f"{base.name}-{n}")
        paths = cls(candidate)
        paths.make_dirs()
        return paths


def append_jsonl(path: Path, record: dict) -> None:
    """Append one JSON line. A single O_APPEND write keeps lines whole across processes."""
    line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def record_event(paths: RunPaths, event: str, **fields) -> None:
    """One entry of events.jsonl: what happened, when, and in which Slurm job and restart."""
    record = {"time": time.time(), "event": event}
    if job_id := os.environ.get("SLURM_JOB_ID"):
        record["job_id"] = job_id
        record["restart"] = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    record.update(fields)
    append_jsonl(paths.events, record)


def read_jsonl(path: Path) -> list[dict]:
    """All complete lines; a torn last line (a killed writer) is skipped, not fatal."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
