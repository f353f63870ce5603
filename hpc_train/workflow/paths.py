"""The workflow directory contract: one object owns every name under it (like rundir.RunPaths).

    runs/<workflow>-<stamp>/
      workflow.yaml              the resolved workflow: file + --set, references resolved, run
                                 directories chosen, absolute paths
      events.jsonl               what happened: submissions with job ids, skips, the best member
      stages/<stage>/sbatch.sh   the script of a non-train stage's job (manifest.sbatch.sh: a
                                 shard stage's last job); slurm-<id>.out its output
      stages/<stage>/COMPLETE    written by the stage's last job when it succeeded
      stages/<stage>/run         -> the train stage's run directory
      stages/<stage>/members/K   -> sweep member K's run directory
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hpc_train.rundir import new_stamped_dir

RESOLVED = "workflow.yaml"
MARKER = "COMPLETE"


@dataclass(frozen=True)
class WorkflowPaths:
    root: Path

    @property
    def resolved(self) -> Path:
        return self.root / RESOLVED

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    def stage_dir(self, stage: str) -> Path:
        return self.root / "stages" / stage

    def script(self, stage: str, part: str | None = None) -> Path:
        return self.stage_dir(stage) / (f"{part}.sbatch.sh" if part else "sbatch.sh")

    def output(self, stage: str, array: bool) -> str:
        """sbatch's --output pattern for a stage's jobs (% in the path itself escaped)."""
        folder = str(self.stage_dir(stage)).replace("%", "%%")
        return f"{folder}/slurm-%A_%a.out" if array else f"{folder}/slurm-%j.out"

    def local_output(self, stage: str, part: str | None, task: int | None) -> Path:
        name = "slurm-local" + (f"-{part}" if part else "") + ("" if task is None else f"_{task}")
        return self.stage_dir(stage) / f"{name}.out"

    def marker(self, stage: str, task: int | None = None) -> Path:
        return self.stage_dir(stage) / (MARKER if task is None else f"{MARKER}.{task}")

    def run_link(self, stage: str) -> Path:
        return self.stage_dir(stage) / "run"

    def member_link(self, stage: str, index: int) -> Path:
        return self.stage_dir(stage) / "members" / str(index)

    def outputs(self, stage: str) -> list[Path]:
        return sorted(self.stage_dir(stage).glob("slurm-*.out"))

    @classmethod
    def new(cls, root: str | Path, name: str, now: datetime | None = None) -> WorkflowPaths:
        """A fresh `<root>/<name>-<YYYYmmdd-HHMMSS>[-N]`, created here."""
        return cls(new_stamped_dir(root, name, now=now))

    @classmethod
    def planned(cls, root: str | Path, name: str) -> WorkflowPaths:
        """The directory `new` would make, for a dry run (nothing is created)."""
        return cls(Path(root).resolve() / f"{name}-<timestamp>")


def link(path: Path, target: Path) -> None:
    """A symlink `path` -> `target`, replacing an older one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    path.symlink_to(target)
