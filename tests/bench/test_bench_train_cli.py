"""bench train's command line: wrong input refused in one line before anything is created or
submitted; the batch script of --submit quotes every word."""

from __future__ import annotations

import os
import shlex

from hpc_train.slurm import batch
from tests.runs import cli, path_without


def test_a_pipeline_spec_is_sent_to_bench_pipeline(tmp_path):
    out = cli("bench", "train", "jobs/transformer_pipeline_cpu.yaml", "--set", f"run.root={tmp_path}")
    assert out.returncode == 1 and "use `python -m hpc_train bench pipeline`" in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_matrix_values_are_checked(tmp_path):
    out = cli("bench", "train", "--backends", "ddp,nccl", "--set", f"run.root={tmp_path}")
    assert out.returncode == 1 and "--backends 'ddp,nccl'" in out.stderr and "ddp, horovod" in out.stderr
    out = cli("bench", "train", "--ranks", "3", "--set", f"run.root={tmp_path}")
    assert out.returncode == 1 and "more than the spec's 2 ranks" in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_bad_spec_value_exits_2(tmp_path):
    out = cli("bench", "train", "--set", "parallel.horovod.cycle_time_ms=-2", "--set", f"run.root={tmp_path}")
    assert out.returncode == 2 and out.stderr.startswith("error: parallel.horovod.cycle_time_ms")
    assert list(tmp_path.iterdir()) == []


def test_submit_without_sbatch_leaves_nothing_behind(tmp_path):
    env_path = path_without(tmp_path / "bin")
    out = cli("bench", "train", "--submit", "--set", f"run.root={tmp_path / 'runs'}",
              env={**os.environ, "PATH": env_path})
    assert out.returncode != 0 and "sbatch" in out.stderr
    assert not any((tmp_path / "runs").glob("bench-*"))


def test_the_batch_script_quotes_every_word_after_the_setup_lines(tmp_path):
    odd = tmp_path / "dir with space; $(touch x)"
    text = batch.script_text(["/opt/py env/python", "-m", "hpc_train", "bench", "train", "--in-run", str(odd)],
                             ["module load cuda/12.1"], "comment")
    lines = text.splitlines()
    assert lines[:4] == ["#!/bin/bash", "# comment", "set -euo pipefail", "module load cuda/12.1"]
    assert shlex.split(lines[-1])[1:] == ["/opt/py env/python", "-m", "hpc_train", "bench", "train",
                                          "--in-run", str(odd)]
    args = batch.sbatch_args({"job-name": "b", "exclusive": True, "time": "30"}, tmp_path / "s")
    assert args == ["--job-name=b", "--exclusive", "--time=30", str(tmp_path / "s")]
