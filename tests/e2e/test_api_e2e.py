"""README's "Python API" example, run as written against the real Slurm (its run root in tmp).

It submits jobs/smoke.yaml, waits for it (bounded), reads its metrics and logs, finds it again
by job id, and cancels a second submission. Then Run.resume of its run on the real Slurm.
"""

from __future__ import annotations

import contextlib
import io
import os
import re

import pytest

from hpc_train.api.run import open_run
from tests.conftest import REPO
from tests.runs import describe_failure, run_dirs

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]

ROOT_LINE = 'root = "runs"'


def readme_example() -> str:
    """The fenced python block of README.md's "## Python API" section."""
    section = (REPO / "README.md").read_text().split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, re.M | re.S)
    assert len(blocks) == 1, "the Python API section has one python block"
    return blocks[0]


@pytest.fixture(scope="module")
def readme(slurm_cluster, tmp_path_factory):
    """The README's example run as written, from the repository's root as a user runs it: its
    namespace (run, final, other, ...) and what it printed."""
    code = readme_example()
    assert code.count(ROOT_LINE) == 1, f"the example sets its run root in one line: {ROOT_LINE}"
    root = tmp_path_factory.mktemp("api") / "runs"
    namespace: dict = {"__name__": "readme"}
    printed = io.StringIO()
    here = os.getcwd()
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code.replace(ROOT_LINE, f"root = {str(root)!r}"), "README.md", "exec"), namespace)
    finally:
        os.chdir(here)
        for run_dir in run_dirs(root) if root.is_dir() else []:
            if job_id := open_run(run_dir).job_id:
                slurm_cluster.job_ids.append(job_id)      # cancelled at the end, whatever happened
    return namespace, printed.getvalue().splitlines(), root


def test_readme_python_example_runs_against_slurm(readme):
    namespace, printed, root = readme
    run, final, other = namespace["run"], namespace["final"], namespace["other"]
    print("\n".join(printed))       # shown on failure
    assert final.state == "COMPLETED", describe_failure(run.paths)
    assert run.executor == "slurm" and printed[0] == repr(run) and f"job {run.job_id} (slurm)" in printed[0]
    assert printed[1].startswith(f"COMPLETED {final.step} ") and 0 < final.step <= final.total_steps
    losses = namespace["losses"]
    assert len(losses) >= 2 and losses[-1] < losses[0]
    assert printed[2] and printed[2] in run.logs(0)
    assert namespace["same"] == run and run.path.parent == root
    assert printed[3] == "CANCELLED" and other.job_id != run.job_id
    assert other.status().state == "CANCELLED"


def test_run_resume_goes_on_from_the_checkpoint_in_the_same_directory(readme, slurm_cluster, monkeypatch):
    """The README's run (one epoch, COMPLETED) resumed to two: the same Run follows the new job.
    (Its own one-epoch run before; the README's serves, a job start less.)"""
    run, first = readme[0]["run"], readme[0]["final"]
    assert first.state == "COMPLETED", describe_failure(run.paths)
    monkeypatch.chdir(REPO)
    again = run.resume(["optim.epochs=2"], allow_spec_change=True)
    slurm_cluster.job_ids.append(again.job_id)
    assert again == run and again.job_id != first.job_id and run.job_id == again.job_id   # this Run follows
    final = again.wait(timeout=600)
    assert final.state == "COMPLETED", describe_failure(run.paths)
    assert final.step > first.step and final.checkpoint_step >= final.step
    steps = [m["step"] for m in run.metrics("train")]
    assert steps == sorted(set(steps))          # one curve, each logged step once
