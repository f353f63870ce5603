"""What environment a run was submitted and started in, as lines of `environment.jsonl`.

Two writers: `submit`, `render` and `resume` on the login node (installed packages, the git
state of the source, loaded modules, variables), and the driver at every start of the job (the
variables in effect there after the script's setup lines, and what the launcher adds for the
ranks). Only variables that shape MPI, NCCL, Horovod, Slurm, CUDA and threading are kept, and a
value whose name suggests a secret (SLURM_JWT, *_TOKEN, ...) is recorded as "<redacted>".

Reading the git state runs `git` (never anything from the source or the snapshot), with the
repository's own diff drivers, text conversions and fsmonitor turned off.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from hpc_train import _proc
from hpc_train.rundir import RunPaths, append_jsonl, read_jsonl

PREFIXES = ("OMPI_", "PMIX_", "PMI_", "I_MPI_", "MPICH_", "HYDRA_", "UCX_", "FI_", "NCCL_",
            "HOROVOD_", "GLOO_", "SLURM_", "SBATCH_", "SRUN_", "CUDA_", "TORCH_", "OMP_", "MKL_",
            "HPC_TRAIN_")
NAMES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSAFEPATH", "VIRTUAL_ENV", "CONDA_PREFIX",
         "MASTER_ADDR", "MASTER_PORT", "LOADEDMODULES", "MODULEPATH")
_SECRET = re.compile(r"TOKEN|SECRET|PASSW|JWT|CREDENTIAL|(^|_)KEY($|_)", re.IGNORECASE)
REDACTED = "<redacted>"
DIFF_LIMIT = 1_000_000          # characters of `git diff` kept; the rest is cut, and says so
UNTRACKED_LIMIT = 200
# No repository setting may run a program while we read: diff drivers and text conversions are
# off by flag, the fsmonitor hook by this override.
_GIT = ("git", "-c", "core.fsmonitor=false", "-c", "core.quotepath=off")


def variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that shape the launch and the libraries, sorted, secrets redacted."""
    kept = {name: value for name, value in environ.items()
            if name in NAMES or name.startswith(PREFIXES)}
    return {name: REDACTED if _SECRET.search(name) else kept[name] for name in sorted(kept)}


def loaded_modules(environ: Mapping[str, str]) -> list[str]:
    """Environment Modules and Lmod keep the loaded modules in LOADEDMODULES (a:b:c)."""
    return [name for name in environ.get("LOADEDMODULES", "").split(":") if name]


def packages() -> dict[str, str]:
    """Every installed distribution's version, by name (what `pip freeze` would list)."""
    from importlib import metadata

    found = {}
    for dist in metadata.distributions():
        name = dist.metadata.get("Name")
        if name:
            found.setdefault(name, dist.version)
    return dict(sorted(found.items(), key=lambda item: item[0].lower()))


def git_state(directory: Path, timeout: float = 20.0) -> dict | None:
    """Commit, branch and uncommitted changes of the checkout holding `directory`; None when it
    is not in a git work tree (an installed package); {"error": ...} when git cannot tell."""
    def git(*args: str) -> _proc.Result:
        return _proc.run([*_GIT, "-C", str(directory), *args], timeout=timeout)

    top = git("rev-parse", "--show-toplevel")
    if not top.ok:
        # Not a repository, or no git: nothing to record. Anything else is worth saying.
        quiet = top.returncode == 127 or "not a git repository" in top.stderr
        return None if quiet else {"error": top.stderr.strip()[:500]}
    directory = top.stdout.strip()     # the whole checkout, paths relative to its top
    commit = git("rev-parse", "HEAD")
    branch = git("rev-parse", "--abbrev-ref", "HEAD")
    diff = git("diff", "HEAD", "--no-color", "--no-ext-diff", "--no-textconv")
    untracked = git("ls-files", "--others", "--exclude-standard")
    names = untracked.stdout.splitlines() if untracked.ok else []
    return {
        "root": top.stdout.strip(),
        "commit": commit.stdout.strip() if commit.ok else None,
        "branch": branch.stdout.strip() if branch.ok else None,
        "dirty": bool(diff.stdout.strip() or names),
        "diff": diff.stdout[:DIFF_LIMIT] if diff.ok else None,
        "diff_truncated": len(diff.stdout) > DIFF_LIMIT,
        "untracked": names[:UNTRACKED_LIMIT],
        "untracked_count": len(names),
    }


def _common(where: str, environ: Mapping[str, str]) -> dict:
    return {"time": time.time(), "where": where, "host": socket.gethostname(),
            "python": sys.executable, "python_version": sys.version.split()[0],
            "modules": loaded_modules(environ), "variables": variables(environ)}


def login_record(where: str, environ: Mapping[str, str], package_dir: Path,
                 snapshot: dict | None) -> dict:
    """What `submit`, `render` or `resume` (`where`) ran under: the source of the package
    it submits, its git state, the installed packages, and the snapshot the job will import."""
    return {**_common(where, environ), "source": str(package_dir), "snapshot": snapshot,
            "git": git_state(package_dir), "packages": packages()}


def job_record(environ: Mapping[str, str], rank_env: Mapping[str, str], package_dir: Path) -> dict:
    """A start of the job, on the batch host: the driver's variables after the setup lines
    (what the launcher passes on), the variables it adds for every rank, and the code in use."""
    return {**_common("job", environ), "job_id": environ.get("SLURM_JOB_ID"),
            "restart": int(environ.get("SLURM_RESTART_COUNT") or 0), "code": str(package_dir),
            "rank_env": variables(rank_env)}


def record(paths: RunPaths, entry: dict) -> None:
    append_jsonl(paths.environment, entry)


def read(paths: RunPaths) -> list[dict]:
    return read_jsonl(paths.environment)


def code_problem(environ: Mapping[str, str], code_link: Path, imported: Path) -> str | None:
    """When a job was told to import the run's snapshot (PYTHONPATH starts with the run's `code`
    link) but `imported` (the package in use) is another copy, what to do; else None."""
    first = environ.get("PYTHONPATH", "").split(os.pathsep)[0]
    if not first or Path(first) != code_link:
        return None
    wanted = (code_link / "hpc_train").resolve()
    if imported.resolve() == wanted:
        return None
    return (f"hpc_train was imported from {imported}, not from the run's snapshot {wanted}: "
            "Python before 3.11 puts the current directory ahead of PYTHONPATH. Fix: submit "
            "from a directory without an hpc_train folder, use Python 3.11+, or --no-snapshot")
