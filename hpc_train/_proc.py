"""Run a command as an argv list (never through a shell) and never raise for the usual failures."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Result:
    returncode: int  # 127: not found, 124: timed out (as coreutils' timeout reports them)
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run(argv: list[str], timeout: float = 30.0, env: dict[str, str] | None = None) -> Result:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except FileNotFoundError as exc:
        return Result(127, "", str(exc))
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return Result(124, out, f"timed out after {timeout:g} s: {' '.join(argv)}")
    return Result(done.returncode, done.stdout, done.stderr)
