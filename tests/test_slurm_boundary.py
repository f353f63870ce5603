"""No module outside hpc_train/scheduler/ runs a Slurm command or reads what one prints
(docs/architecture.md, "One owner per concept"): a change of Slurm's output is fixed in one place.

The scan reads every module's AST: an argv list whose first word is a Slurm command, a process
call (subprocess, os, _proc.run) given one, a `shutil.which` probe for one, and the marks of
reading Slurm's output formats (--parsable, `JobState=`). Docstrings, messages and labels that
name the commands are fine. srun and salloc are launchers (launch/), not queries.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

from tests.conftest import REPO

COMMANDS = {"sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo"}
RUNNERS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput",
           "system", "popen", "execv", "execvp", "execvpe", "execl", "execlp", "spawnv", "spawnvp",
           "create_subprocess_exec", "create_subprocess_shell"}
MARKERS = ("--parsable", "JobState=", "SLURM_TIME_FORMAT")
CLIENT = REPO / "hpc_train" / "scheduler"


def command_word(node: ast.AST | None) -> str | None:
    """The Slurm command a string constant starts with ('squeue -h', '/usr/bin/sbatch'), or None."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.split()):
        return None
    word = os.path.basename(node.value.split()[0])
    return word if word in COMMANDS else None


def _head(node: ast.AST | None) -> ast.AST | None:
    return node.elts[0] if isinstance(node, (ast.List, ast.Tuple)) and node.elts else node


def violations_in(source: str, name: str) -> list[str]:
    tree = ast.parse(source)
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.List) and (word := command_word(_head(node))):
            found.append(f"{name}:{node.lineno}: builds an argv for {word}")
        elif isinstance(node, ast.Call):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            first = node.args[0] if node.args else None
            if callee == "which" and (word := command_word(first)):
                found.append(f"{name}:{node.lineno}: probes for {word}")
            elif callee in RUNNERS and (word := command_word(_head(first))):
                found.append(f"{name}:{node.lineno}: runs {word}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                and (mark := next((m for m in MARKERS if m in node.value), None)):
            found.append(f"{name}:{node.lineno}: reads Slurm's output ({mark})")
    return found


def violations(root: Path = REPO / "hpc_train") -> list[str]:
    return [problem for path in sorted(root.rglob("*.py")) if CLIENT not in path.parents
            for problem in violations_in(path.read_text(), str(path.relative_to(REPO)))]


def test_no_module_outside_the_client_runs_or_reads_slurm():
    assert violations() == [], "speak to Slurm through hpc_train/scheduler"


def test_the_scan_catches_each_way_of_speaking_to_slurm():
    speaks = '''
import shutil, subprocess, os
from hpc_train import _proc
argv = ["squeue", "-h", "-j", job]
subprocess.run(("/usr/bin/sbatch", "x.sh"), check=True)
os.system("scancel 42")
if shutil.which("sinfo"):
    out = _proc.run(command, timeout=5)
state = dict(f.split("=") for f in text.split())["JobState"] if "JobState=" in text else None
'''
    assert [line.split(": ", 1)[1] for line in violations_in(speaks, "m.py")] == [
        "builds an argv for squeue", "runs sbatch", "runs scancel", "probes for sinfo",
        "reads Slurm's output (JobState=)"]
    quiet = '''
"""Submits with sbatch, asks squeue and sacct (the words are fine here)."""
def f(slurm):
    """`scontrol requeue` and `--parsable` in a docstring."""
    yield "sacct", f"State={slurm.label}"
    raise SystemExit("cancel it yourself: scancel 42")
'''
    assert violations_in(quiet, "m.py") == []
    client = (CLIENT / "__init__.py").read_text()
    assert {p.split(" ")[-1] for p in violations_in(client, "client")} >= COMMANDS   # it sees them
