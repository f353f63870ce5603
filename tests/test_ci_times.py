""".ci/times.py reads the CPU samples .ci/run takes while the tests run, and the daemons' CPU."""

from __future__ import annotations

import importlib.util

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("ci_times", REPO / ".ci/times.py")
times = importlib.util.module_from_spec(spec)
spec.loader.exec_module(times)


def test_cpu_samples_give_the_busy_share_whole_and_per_window(tmp_path):
    # user nice system idle iowait irq softirq steal: 300 busy of 400 jiffies, then 100 of 400.
    (tmp_path / "cpu.txt").write_text("0 cpu  0 0 0 0 0 0 0 0 0 0\n"
                                      "300 cpu  200 0 100 100 0 0 0 0 0 0\n"
                                      "not a sample\n"
                                      "600 cpu  250 0 150 400 0 0 0 0 0 0\n")
    samples = times.read_cpu(tmp_path / "cpu.txt")
    assert len(samples) == 3
    report = times.cpu_report(samples, cores=2, window=300)
    assert report.splitlines() == ["busy 50% of 2 cores over 10.0 min (600 core-seconds used)",
                                   "  minute   0.0-  5.0: 75%", "  minute   5.0- 10.0: 25%"]


def test_daemon_lines_are_summed_by_name_and_a_bad_line_is_skipped(tmp_path, capsys):
    (tmp_path / "daemons.txt").write_text("(slurmd) 1.5\n(slurmd) 2.5\n(slurmctld) 3\n(garbled)\n")
    assert times.read_daemons(tmp_path / "daemons.txt") == {"slurmd": 4.0, "slurmctld": 3.0}
    assert "skipped a daemon line" in capsys.readouterr().out
    assert times.read_daemons(tmp_path / "missing.txt") == {}


def test_slurm_jobs_cpu_is_summed_by_the_test_directory_their_sbatch_line_names(tmp_path, capsys):
    run = "/tmp/pytest-of-root/pytest-3/popen-gw1/test_requeue0/runs/smoke-1/.submitit"
    (tmp_path / "jobs.txt").write_text(
        f"12|01:02.500|sbatch {run}/submission.sh\n"             # requeued: two runs of one job
        f"12|1-00:00:01|sbatch {run}/submission.sh\n"
        "12.batch|1-00:00:01|\n"                                  # a step: in its job's line
        "13|00:03.000|sbatch --wrap 'sleep 1'\n"
        "15|00:04.000|sbatch /tmp/hpc_train-ci-slurm/popen-gw0/lifecycle0/a/submission.sh\n"
        "14|garbled\n")
    assert times.read_jobs(tmp_path / "jobs.txt") == {"test_requeue0": 62.5 + 86401, "(other)": 3.0,
                                                          "lifecycle0": 4.0}
    assert "skipped a sacct line" in capsys.readouterr().out


def test_a_case_reads_its_cpu_seconds_and_a_report_without_them_reads_zero(tmp_path):
    (tmp_path / "junit.xml").write_text(
        '<testsuites><testsuite><testcase classname="tests.e2e.test_x" name="test_a" time="3.5">'
        '<properties><property name="tier" value="slurm"/><property name="cpu_seconds" value="1.25"/>'
        '</properties></testcase><testcase classname="tests.test_y" name="test_b" time="1"/>'
        '</testsuite></testsuites>')
    cases = times.read_cases(tmp_path / "junit.xml")
    assert [(c["module"], c["tier"], c["cpu"]) for c in cases] == [
        ("tests/e2e/test_x.py", "slurm", 1.25), ("tests/test_y.py", "?", 0.0)]
