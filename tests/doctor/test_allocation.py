"""doctor --allocation / --nodes: the pure parts (comparison, faults, plans, the batch job's
text) on made-up reports, then one probe run for real as a single process."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_train import cli
from hpc_train.doctor import nodes as doctor_nodes
from hpc_train.doctor.allocation import one_per_node, probe_plan, read_reports, run_launcher
from hpc_train.doctor.compare import LaunchResult, compare, describe, horovod_build, majority
from hpc_train.doctor.faults import DOCTOR_FAULT_ENV, VERSION_SUFFIX, faults_here, parse_doctor_faults
from hpc_train.doctor.node_probe import PACKAGES
from hpc_train.doctor.table import as_text, show
from hpc_train.errors import HpcTrainError
from hpc_train.launch.allocation import Allocation
from hpc_train.launch.argv import launch_argv, launcher_env
from hpc_train.launch.local import LocalMpirun, free_port
from hpc_train.launch.mpi import MpiFlavour, MpiInfo
from hpc_train.scheduler.parse import parse_duration
from tests.conftest import REPO

HOSTS = ["node1", "node2", "node3"]


def probe_report(rank: int, host: str, size: int) -> dict:
    """What a healthy probe writes (the shape node_probe.main gives)."""
    return {
        "rank": rank, "size": size, "host": host, "stage": "done", "python": "3.11.7",
        "versions": {name: "1.0" for name in PACKAGES},
        "gpus": 0, "horovod_build": {"mpi_built": True, "gloo_built": True, "nccl_built": False},
        "master": {"addr": HOSTS[0], "port": 29400, "ok": True, "detail": "connected"},
        "allreduce": {"ok": True, "expected": size * (size + 1) // 2, "got": size * (size + 1) // 2,
                      "wrong_elements": 0, "mpi_rank": rank, "mpi_size": size, "bytes": 4 * 2**20,
                      "repetitions": 5, "seconds_mean": 0.001 * (rank + 1)},
    }


def healthy(hosts: list[str]) -> dict[int, dict]:
    return {rank: probe_report(rank, host, len(hosts)) for rank, host in enumerate(hosts)}


def named(result: dict) -> set[str]:
    return {p["node"] for p in result["problems"]}


def test_agreeing_nodes_pass_with_every_node_in_the_verdict():
    result = compare(HOSTS, healthy(HOSTS), LaunchResult(["mpirun"], 0, 2.0))
    assert result["ok"] and result["problems"] == []
    assert result["verdict"].startswith("OK")
    assert all(host in result["verdict"] for host in HOSTS)
    assert [n["node"] for n in result["nodes"]] == HOSTS
    assert all(n["differs"] == [] for n in result["nodes"])
    assert show(result, json_output=True) == 0


def test_the_node_with_another_version_is_named_with_both_values():
    reports = healthy(HOSTS)
    reports[1]["versions"]["torch"] = "9.9"
    result = compare(HOSTS, reports)
    assert not result["ok"] and named(result) == {"node2"}
    [problem] = result["problems"]
    assert "torch" in problem["what"] and "9.9" in problem["what"] and "1.0" in problem["what"]
    assert result["majority"]["torch"] == "1.0"
    assert next(n for n in result["nodes"] if n["node"] == "node2")["differs"] == ["torch"]
    assert result["verdict"].startswith("FAIL") and "node2" in result["verdict"]
    assert show(result, json_output=True) == 1


def test_a_two_node_tie_names_the_node_that_is_not_rank_0s():
    hosts = HOSTS[:2]
    reports = healthy(hosts)
    reports[0]["horovod_build"]["nccl_built"] = True
    result = compare(hosts, reports)
    assert named(result) == {"node2"}
    what = result["problems"][0]["what"]
    assert "horovod build" in what and "MPI+Gloo+NCCL" in what and "node1" in what


def test_a_rank_without_a_report_is_named_with_its_planned_node():
    reports = healthy(HOSTS)
    del reports[2]
    result = compare(HOSTS, reports, LaunchResult(["srun"], 0, 1.0))
    assert named(result) == {"node3"}
    [problem] = result["problems"]
    assert problem["rank"] == 2 and "no report" in problem["what"]
    assert "node3" in as_text(result)


def test_a_wrong_allreduce_and_an_unreachable_master_are_named_with_their_node():
    reports = healthy(HOSTS)
    reports[1]["allreduce"].update(ok=False, got=7, wrong_elements=1)
    reports[2]["master"].update(ok=False, detail="no connection within 30 s: ConnectionRefusedError")
    result = compare(HOSTS, reports)
    by_node = {p["node"]: p for p in result["problems"]}
    assert set(by_node) == {"node2", "node3"}
    assert "allreduce wrong" in by_node["node2"]["what"] and "7" in by_node["node2"]["what"]
    assert "MASTER_ADDR" in by_node["node3"]["what"] and HOSTS[0] in by_node["node3"]["what"]
    # the versions still agree: no disagreement problems on top
    assert all(n["differs"] == [] for n in result["nodes"])


def test_a_rank_stuck_before_the_allreduce_and_a_failed_launcher_are_problems():
    reports = healthy(HOSTS[:2])
    del reports[1]["allreduce"]      # the report of a rank that never got through MPI
    result = compare(HOSTS[:2], reports, LaunchResult(["/usr/bin/mpirun", "-np", "2"], 124, 180.0,
                                                      "some\nlast line of mpirun\n"))
    texts = [describe(p) for p in result["problems"]]
    assert any(t.startswith("node2 rank 1: did not finish the allreduce") for t in texts)
    assert any(t.startswith("mpirun did not end within the timeout") and "last line of mpirun" in t for t in texts)


def test_helpers_of_the_comparison():
    assert majority(["a", "b", "b"]) == "b" and majority(["a", "b"]) == "a"
    assert horovod_build({"mpi_built": True, "gloo_built": False, "nccl_built": True}) == "MPI+NCCL"
    assert horovod_build({"error": "ImportError: x"}).startswith("error")


def test_text_report_marks_the_differing_cell():
    reports = healthy(HOSTS[:2])
    reports[1]["versions"]["hpc_train"] += VERSION_SUFFIX
    text = as_text(compare(HOSTS[:2], reports))
    row = next(line for line in text.splitlines() if line.startswith("hpc_train"))
    assert row.endswith(VERSION_SUFFIX + " !")
    assert text.splitlines()[-1].startswith("FAIL")


# ---------------------------------------------------------------- faults


def test_doctor_faults_parse_and_apply_by_short_host_name():
    assert parse_doctor_faults(None) == {}
    faults = parse_doctor_faults("version@hpcn2.cluster,noreport@hpcn1")
    assert faults == {"version": {"hpcn2"}, "noreport": {"hpcn1"}}
    env = {DOCTOR_FAULT_ENV: "version@hpcn2,allreduce@hpcn2"}
    assert faults_here(env, "hpcn2.cluster") == {"version", "allreduce"}
    assert faults_here(env, "hpcn1") == set()
    assert faults_here({}, "hpcn2") == set()
    for bad in ("version", "explode@hpcn1", "version@"):
        with pytest.raises(ValueError, match=DOCTOR_FAULT_ENV):
            parse_doctor_faults(bad)


# ---------------------------------------------------------------- the launch


def test_probe_plan_uses_the_launchers_of_jobs_one_rank_per_node(tmp_path):
    allocation = one_per_node(Allocation((("hpcn1", 4), ("hpcn2", 4))))
    assert allocation.hosts == (("hpcn1", 1), ("hpcn2", 1))
    environ = {"PATH": "/usr/bin", DOCTOR_FAULT_ENV: "version@hpcn2"}
    srun = probe_plan(allocation, "srun", tmp_path, environ, 29400, None, "/py", as_root=False)
    argv = launch_argv(srun)
    assert argv[0] == "srun" and "--ntasks=2" in argv and "--mpi=pmix" in argv
    assert argv[-4:] == ["/py", "-m", "hpc_train.doctor.node_probe", str(tmp_path)]
    env = launcher_env(srun, environ)
    assert env["MASTER_ADDR"] == "hpcn1" and env["MASTER_PORT"] == "29400"
    assert env[DOCTOR_FAULT_ENV] == "version@hpcn2"
    mpirun = LocalMpirun("/opt/bin/mpirun", MpiInfo(MpiFlavour.OPENMPI, "4.1.4"))
    argv = launch_argv(probe_plan(allocation, "mpirun", tmp_path, environ, 29400, mpirun, "/py", as_root=True))
    assert argv[:3] == ["/opt/bin/mpirun", "-np", "2"] and "--allow-run-as-root" in argv
    assert f"{DOCTOR_FAULT_ENV}=version@hpcn2" in argv and "MASTER_ADDR=hpcn1" in argv


def test_probe_plan_refuses_a_missing_or_unknown_mpirun(tmp_path):
    allocation = Allocation((("a", 1),))
    with pytest.raises(HpcTrainError, match="not on PATH"):
        probe_plan(allocation, "mpirun", tmp_path, {}, 1, None, "/py", as_root=False)
    unknown = LocalMpirun("/x/mpirun", MpiInfo(MpiFlavour.UNKNOWN, ""))
    with pytest.raises(HpcTrainError, match="--launcher srun"):
        probe_plan(allocation, "mpirun", tmp_path, {}, 1, unknown, "/py", as_root=False)


def test_run_launcher_is_bounded_and_keeps_the_output():
    # 124: ended at its bound, not waited for (the command would sleep 60 s, then exit 0). The
    # shell prints within milliseconds; a Python child printed nothing within 1.5 s under CI's load.
    result = run_launcher(["sh", "-c", "echo started; exec sleep 60"], dict(os.environ), timeout=5)
    assert result.returncode == 124 and "started" in result.output_tail
    missing = run_launcher(["/nonexistent/mpirun"], {}, timeout=5)
    assert missing.returncode == 127


def test_read_reports_skips_missing_and_half_written_files(tmp_path):
    (tmp_path / "rank-0.json").write_text(json.dumps({"rank": 0}))
    (tmp_path / "rank-2.json").write_text("{not json")
    assert read_reports(tmp_path, 3) == {0: {"rank": 0}}


# ---------------------------------------------------------------- --nodes: the batch job


def test_job_memory_stays_within_the_smallest_node():
    assert doctor_nodes.job_memory_mb(None) == doctor_nodes.DEFAULT_MEM_MB
    assert doctor_nodes.job_memory_mb(10244) == doctor_nodes.DEFAULT_MEM_MB
    assert doctor_nodes.job_memory_mb(1000) <= 1000


def test_inner_timeout_leaves_time_to_report():
    for limit in ("1", "5", "1:00:00"):
        assert 0 < doctor_nodes.inner_timeout(limit) < parse_duration(limit)
    with pytest.raises(HpcTrainError, match="--time"):
        doctor_nodes.inner_timeout("soon")


def test_batch_script_quotes_every_word(tmp_path):
    out = tmp_path / "dir with space; $(rm -rf x)"
    script = doctor_nodes.batch_script("/opt/py env/bin/python", "srun", out, 120)
    exec_line = script.splitlines()[-1]
    assert exec_line.startswith("exec ")
    words = shlex.split(exec_line)[1:]
    assert words[0] == "/opt/py env/bin/python" and words[words.index("--out") + 1] == str(out)
    assert words[words.index("--launcher") + 1] == "srun" and "--allocation" in words and "--json" in words
    args = doctor_nodes.sbatch_args(2, "5", 2048, out, out / "doctor.sbatch", "debug")
    assert "--nodes=2" in args and "--ntasks-per-node=1" in args
    assert "--partition=debug" in args and args[-1] == str(out / "doctor.sbatch")
    assert "--partition=debug" not in doctor_nodes.sbatch_args(2, "5", 2048, out, out / "s", None)


def test_parse_job_output_finds_the_report_after_other_output():
    report = compare(HOSTS[:1], healthy(HOSTS[:1]))
    text = "prologue says {hello}\n" + json.dumps(report, indent=2) + "\n"
    assert doctor_nodes.parse_job_output(text)["verdict"] == report["verdict"]
    assert doctor_nodes.parse_job_output("no json here {") is None
    failed = doctor_nodes.failure("job 7 ended FAILED without a report: boom")
    assert show(failed, json_output=False) == 1


# ---------------------------------------------------------------- the command line


def test_allocation_outside_a_job_says_where_it_runs(monkeypatch, capsys):
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    assert cli.main(["doctor", "--allocation"]) == 4
    assert "--nodes N" in capsys.readouterr().err


def test_doctor_options_need_a_mode(capsys):
    assert cli.main(["doctor", "--launcher", "srun"]) == 1
    assert "--allocation or --nodes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["doctor", "--allocation", "--nodes", "2"])


# ---------------------------------------------------------------- the probe, for real


@pytest.mark.slow
def test_probe_alone_reports_everything(tmp_path):
    """One probe without a launcher: MPI starts as a singleton, rank 0 listens and connects to
    itself, and the report holds what the comparison reads."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           DOCTOR_FAULT_ENV: "version@" + os.uname().nodename}
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK", "SLURM_STEP_ID", "HPC_TRAIN_LAUNCHER"):
        env.pop(name, None)
    run = subprocess.run([sys.executable, "-m", "hpc_train.doctor.node_probe", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert run.returncode == 0, run.stderr
    report = json.loads(Path(tmp_path / "rank-0.json").read_text())
    assert report["stage"] == "done" and report["host"] == os.uname().nodename
    assert report["master"]["ok"], report["master"]
    assert report["allreduce"]["ok"] and report["allreduce"]["mpi_size"] == 1
    assert report["versions"]["hpc_train"].endswith(VERSION_SUFFIX)
    assert set(report["versions"]) == set(PACKAGES)
    assert compare([report["host"]], {0: report})["ok"]
