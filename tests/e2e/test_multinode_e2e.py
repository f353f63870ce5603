"""Jobs across two nodes of the 3-node Slurm (env/slurm/start.sh --nodes 3), as users submit them.

Every job is submitted at once by the module fixture (the cluster runs what fits: each takes one
CPU on each of two nodes, which Slurm picks) and judged by the tests:
- jobs/smoke.yaml with one rank per node trains to completion under Horovod and DDP, launched by
  mpirun and by srun --mpi=pmix: equal weights on both ranks, one rank on each node, loss falling;
- the CPU pipeline example with its two stages on the two nodes;
- a job stopped by USR2 and then by `scontrol requeue` resumes on both nodes and completes;
- a rank on the second node that raises, and one that freezes, under each launcher: the job ends
  as the lifecycle rules say (here no retries: FAILED) and `diagnose` names the rank and its node.
"""

from __future__ import annotations

import signal
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from hpc_train.inspection.logparse import rank_host, timed_lines
from hpc_train.rundir import RunPaths, read_jsonl
from tests.conftest import heavy_params, selected_plan
from tests.runs import (NO_WORKERS, ONE_EPOCH, SMOKE_EPOCH_STEPS, assert_trained, cli,
                        describe_failure, events, heartbeat_step, logged_step, submit, wait_for)

pytestmark = [pytest.mark.multinode, pytest.mark.slurm, pytest.mark.mpi, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
ACROSS = ["slurm.nodes=2", "slurm.tasks_per_node=1"]
# stall_seconds: above the start-up of these ten jobs at once on the 8-node cluster (their 20
# ranks and 20 data-worker servers importing torch on 2 cores: 33 to 49 s from the start to the
# first step, and one start was named stalled at 45 s; no data workers since), below the freeze
# tests' patience.
NO_RETRY = ["checkpoint.retries_on_failure=0", "launch.restarts_in_job=0", "launch.stall_seconds=90"]
SMOKE = "jobs/smoke.yaml"
# One epoch of the smoke job (46 steps): its loss has fallen to a quarter by then, and the stops
# below come at steps 10 and 30. (Two epochs before: 46 steps more per job that nothing read.)
TOTAL_STEPS = SMOKE_EPOCH_STEPS
SMOKE_RUN = [ONE_EPOCH, NO_WORKERS]
PIPELINE = "jobs/transformer_pipeline_cpu.yaml"

# name -> (spec, overrides, actor or None)
# Two of the four smoke jobs name the cluster's network by its subnet: every layer must use it.
SUBNET = "10.231.7.0/24"
ON_SUBNET = {"mpirun-ddp", "srun-horovod"}
PLAN: dict[str, tuple] = {
    **{f"{method}-{backend}": (SMOKE, [*SMOKE_RUN, f"launch.method={method}", f"parallel.backend={backend}",
                                       *([f"launch.network_interface={SUBNET}"]
                                         if f"{method}-{backend}" in ON_SUBNET else [])], None)
       for method in ("mpirun", "srun") for backend in ("horovod", "ddp")},
    "pipeline": (PIPELINE, ["parallel.pipeline.stages=2", "optim.max_steps=24", "log.every_steps=4"],
                 None),
    "stopped": (SMOKE, [*SMOKE_RUN, "launch.method=srun", "checkpoint.every_steps=20", "log.every_steps=2"],
                "stop_twice"),
    **{f"raise-{method}": (SMOKE, [*SMOKE_RUN, f"launch.method={method}", "launch.env.HPC_TRAIN_FAULT=raise:1:6",
                                   *NO_RETRY], None) for method in ("mpirun", "srun")},
    **{f"freeze-{method}": (SMOKE, [*SMOKE_RUN, f"launch.method={method}", "launch.env.HPC_TRAIN_FAULT=freeze:1:6",
                                    *NO_RETRY], None) for method in ("mpirun", "srun")},
}

# CI's reduced form (the rest with --heavy): one smoke job per launcher, the two together covering
# both backends and the subnet, and each fault under one launcher; the launcher-independence of
# the weights needs all four smoke jobs.
HEAVY = {"mpirun-horovod", "srun-ddp", "raise-mpirun", "freeze-srun"}


@dataclass
class Job:
    job_id: str
    paths: RunPaths
    acted: Future | None = None




def _stop_twice(cluster, job_id: str, paths: RunPaths) -> list[dict]:
    """USR2 to the batch shell at step 10, then `scontrol requeue` at step 30 of the next run."""
    stops, since = [], 0.0
    for kind, at_step in (("USR2", 10), ("scontrol requeue", 30)):
        wait_for(lambda: logged_step(paths, since) >= at_step, 600, f"step {at_step}")
        command = {"USR2": ["scancel", "--batch", "--signal=USR2", job_id],
                   "scontrol requeue": ["scontrol", "requeue", job_id]}[kind]
        sent = time.time()
        subprocess.run(command, check=True, timeout=30, env=cluster.env)
        resumed = wait_for(lambda: [e for e in events(paths, "resumed") if e["time"] > sent], 600,
                            f"the resume after {kind}")[0]
        stops.append({"kind": kind, "sent": sent, "resumed_from": resumed["from_checkpoint"]})
        since = resumed["time"]
    return stops


@pytest.fixture(scope="module")
def jobs(slurm_nodes, tmp_path_factory, request):
    root = tmp_path_factory.mktemp("multinode")
    submitted = {}
    with ThreadPoolExecutor(max_workers=2) as actors:
        for name, (spec, overrides, actor) in selected_plan(request.config, PLAN, HEAVY).items():
            job_id, paths = submit(spec, root, f"run.name={name}", *ACROSS, *overrides,
                                   env=slurm_nodes.env)
            slurm_nodes.job_ids.append(job_id)
            act = actors.submit(_stop_twice, slurm_nodes, job_id, paths) if actor else None
            submitted[name] = Job(job_id, paths, act)
        yield submitted


def _ended(cluster, job: Job, timeout: float = 900) -> str:
    return cluster.wait_state(job.job_id, ENDED, timeout=timeout)


def _hosts(paths: RunPaths) -> dict[int, str]:
    """Rank -> node, from each rank's first log line, as diagnose reads it."""
    found = {}
    for rank in (0, 1):
        found[rank] = rank_host(timed_lines(rank, paths.rank_log(rank).read_text().splitlines()))
    return found


def _two_nodes(paths: RunPaths, cluster) -> list[str]:
    """The two nodes Slurm gave the job (the first start's), after checking they are two of the
    cluster's and that rank r ran on the r-th."""
    hosts = events(paths, "started")[0]["hosts"]
    assert len(set(hosts)) == 2 and set(hosts) <= set(cluster.nodes), hosts
    assert _hosts(paths) == {0: hosts[0], 1: hosts[1]}
    return hosts


@pytest.mark.parametrize("name", heavy_params(["mpirun-horovod", "mpirun-ddp", "srun-horovod", "srun-ddp"],
                                              HEAVY))
def test_smoke_job_trains_across_two_nodes(name, jobs, slurm_nodes):
    job = jobs[name]
    method = name.split("-")[0]
    assert _ended(slurm_nodes, job) == "COMPLETED", describe_failure(job.paths)
    assert_trained(job.paths, ranks=2)
    _two_nodes(job.paths, slurm_nodes)
    started = events(job.paths, "started")[0]
    assert started["argv"][0].endswith(method)
    if name in ON_SUBNET:
        # Each rank found its own interface on the subnet (eth0 in each node's namespace), and
        # MPI was told the subnet: on mpirun's command line, or in srun's environment.
        for rank in (0, 1):
            assert f"network {SUBNET}: interface eth0" in job.paths.rank_log(rank).read_text()
        if method == "mpirun":
            assert started["argv"][started["argv"].index("btl_tcp_if_include") + 1] == SUBNET


@pytest.mark.heavy
def test_smoke_weights_do_not_depend_on_the_launcher(jobs, slurm_nodes):
    for backend in ("horovod", "ddp"):
        digests = set()
        for method in ("mpirun", "srun"):
            job = jobs[f"{method}-{backend}"]
            assert _ended(slurm_nodes, job) == "COMPLETED", describe_failure(job.paths)
            digests |= {e["params_sha256"] for e in events(job.paths, "rank_finished")}
        assert len(digests) == 1, f"{backend}: mpirun and srun runs ended with different weights"


def test_pipeline_stages_on_two_nodes(jobs, slurm_nodes):
    job = jobs["pipeline"]
    assert _ended(slurm_nodes, job) == "COMPLETED", describe_failure(job.paths)
    finished = {e["rank"]: e for e in events(job.paths, "rank_finished")}
    assert {r: finished[r]["stage"] for r in finished} == {0: 0, 1: 1}
    _two_nodes(job.paths, slurm_nodes)
    losses = [m["loss"] for m in read_jsonl(job.paths.metrics) if m.get("split") is None]
    assert len(losses) >= 3 and losses[-1] < losses[0], losses


def test_two_node_job_stopped_by_usr2_and_requeue_resumes_on_both_nodes(jobs, slurm_nodes):
    job = jobs["stopped"]
    stops = job.acted.result(timeout=900)
    assert _ended(slurm_nodes, job) == "COMPLETED", describe_failure(job.paths)
    assert_trained(job.paths, ranks=2)
    starts = events(job.paths, "started")
    _two_nodes(job.paths, slurm_nodes)
    assert len(starts) == 3 and all(len(set(s["hosts"])) == 2 for s in starts), starts
    # USR2: the ranks agreed on a step and saved it; the requeue resumed from a checkpoint.
    assert [s["kind"] for s in stops] == ["USR2", "scontrol requeue"]
    saved = events(job.paths, "stop_saved")
    assert saved and stops[0]["resumed_from"] == saved[0]["step"]
    assert stops[1]["resumed_from"] >= stops[0]["resumed_from"]
    sacct = subprocess.run(["sacct", "-n", "-X", "-D", "-P", "-j", job.job_id, "-o", "State,NNodes"],
                           capture_output=True, text=True, timeout=20, env=slurm_nodes.env).stdout
    assert [line.split("|")[1] for line in sacct.split()] == ["2"] * 3, sacct
    assert sacct.split()[-1].startswith("COMPLETED") and "REQUEUED" in sacct, sacct


@pytest.mark.parametrize("name", heavy_params(["raise-mpirun", "raise-srun"], HEAVY))
def test_a_rank_raising_on_the_second_node_is_named_with_its_node(name, jobs, slurm_nodes):
    job = jobs[name]
    assert _ended(slurm_nodes, job) == "FAILED", describe_failure(job.paths)
    assert events(job.paths, "finished")[-1]["status"] == "failed"
    out = cli("diagnose", str(job.paths.root), env=slurm_nodes.env)
    second = _two_nodes(job.paths, slurm_nodes)[1]
    assert f"first failed rank: 1 on {second} (first traceback" in out.stdout, out.stdout
    assert "InjectedFault" in out.stdout


@pytest.mark.parametrize("name", heavy_params(["freeze-mpirun", "freeze-srun"], HEAVY))
def test_a_rank_freezing_on_the_second_node_is_named_and_torn_down(name, jobs, slurm_nodes):
    job = jobs[name]
    assert _ended(slurm_nodes, job) == "FAILED", describe_failure(job.paths)
    stalled = events(job.paths, "ranks_stalled")
    second = _two_nodes(job.paths, slurm_nodes)[1]
    assert stalled and [(r["rank"], r["host"]) for r in stalled[0]["ranks"]] == [(1, second)]
    finished = events(job.paths, "finished")[-1]
    # The teardown reached the rank on the other node: the launcher's own teardown (mpirun's
    # SIGTERM, srun's step cancel) ended it, then the launcher ended itself. The driver never had
    # to SIGKILL the launcher (supervise._tear_down's last resort, for a launcher that outlived
    # its teardown: a rank on another node it could not end); the order of events, not a time.
    assert finished["status"] == "failed" and finished["time"] > stalled[0]["time"], finished
    assert finished["returncode"] != -signal.SIGKILL, finished
    assert heartbeat_step(job.paths, 1) < TOTAL_STEPS
    out = cli("diagnose", str(job.paths.root), env=slurm_nodes.env)
    assert f"rank 1 on {second}" in out.stdout, out.stdout
