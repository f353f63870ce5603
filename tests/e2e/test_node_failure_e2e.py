"""A node that dies under a 2-node job, on the 8-node Slurm (env/slurm/start.sh --nodes 8).

`jobs/smoke.yaml` as shipped, one rank on each of two nodes; once it has saved a checkpoint, the
second node is crashed for real (env/slurm/node.sh crash: its slurmd, slurmstepds, mpirun's
daemon and the rank there SIGKILLed; slurmctld learns of it only by its pings):
- with `slurm.spare_nodes: 1` the job goes on in its allocation on the spare;
- with `slurm.nodes: 1-2` it goes on in its allocation on the survivor, one rank;
- with neither it is requeued off the dead node and runs on an idle one.
Each completes with every sample of every epoch trained once (the sample ledger, from where each
start resumed), without spending checkpoint.retries_on_failure; `status` names the dead node
while it is dead and `diagnose` says that a node died. The scenarios run one after another (the
spare one takes three nodes), each node revived after its scenario.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from hpc_train import run_state
from hpc_train.spec import load_spec
from tests.conftest import FEWEST_NODES, REPO, heavy_params
from tests.ledger import assert_every_sample_once_in_order, kept_history, read_ledger
from tests.runs import NO_WORKERS, cli, describe_failure, events, submit, wait_for

pytestmark = [pytest.mark.multinode, pytest.mark.slurm, pytest.mark.mpi, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
# The job must still train when slurmctld marks the node down (SlurmdTimeout=20 there, plus its
# ping cycle): the test-only pace (0.25 s in every step) sets how long it trains after the crash
# on any machine, instead of twelve epochs of CPU: about 37 s on the survivor (2 epochs at one
# rank, ~147 steps left) and about 40 s on the spare (4 epochs at two ranks, ~164 steps left).
JOB = ["slurm.tasks_per_node=1", "checkpoint.every_steps=20", "log.every_steps=5",
       "launch.env.HPC_TRAIN_FAULT=pace:0.25", NO_WORKERS]
SHAPES = {"spare": ["slurm.nodes=2", "slurm.spare_nodes=1", "optim.epochs=4"],
          "survivor": ["slurm.nodes=1-2", "optim.epochs=2"],
          "requeued": ["slurm.nodes=2", "optim.epochs=2"]}


def _node(action: str, node: str) -> None:
    out = subprocess.run(["bash", str(REPO / "env/slurm/node.sh"), action, node],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"node.sh {action} {node}:\n{out.stdout}\n{out.stderr}"


def _status_names(paths, node: str, env) -> str | None:
    out = cli("status", str(paths.root), env=env, timeout=60).stdout
    return out if f"nodes:      {node} not responding or down" in out else None


def _enough_idle(cluster) -> bool:
    """Three nodes idle: the spare scenario's three, and two free for a `1-2` range."""
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True,
                         timeout=30, env=cluster.env).stdout.split()
    return out.count("idle") >= FEWEST_NODES


def _crash_under(cluster, root, name: str) -> dict:
    """Submit, crash the job's second node after its first checkpoint, wait for the end; the
    node is revived whatever happens."""
    # Slurm starts a node range on the nodes free at that moment: at least two, not one left
    # beside nodes still completing the previous scenario's job, so that `1-2` starts on 2.
    wait_for(lambda: _enough_idle(cluster), 180, f"{FEWEST_NODES} nodes idle")
    ledger = root / f"{name}.ledger"
    job_id, paths = submit("jobs/smoke.yaml", root, f"run.name={name}", *JOB, *SHAPES[name],
                           f"launch.env.HPC_TRAIN_SAMPLE_LEDGER={ledger}", env=cluster.env)
    cluster.job_ids.append(job_id)
    wait_for(lambda: events(paths, "checkpoint_saved"), 600, f"{name}'s first checkpoint")
    first = events(paths, "started")[0]["hosts"]
    victim = first[1]
    _node("crash", victim)
    try:
        crashed = time.time()
        said = wait_for(lambda: _status_names(paths, victim, cluster.env), 120,
                        f"status to name {victim} while it is dead")
        state = cluster.wait_state(job_id, ENDED, timeout=900)
    finally:
        _node("revive", victim)
    segments = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", job_id, "-o", "State"],
                              capture_output=True, text=True, timeout=30, env=cluster.env).stdout
    return {"paths": paths, "ledger": ledger, "state": state, "first": first, "victim": victim,
            "crashed": crashed, "status": said, "segments": segments.split()}


@pytest.fixture(scope="module")
def runs(slurm_nodes, tmp_path_factory):
    """name -> the scenario's outcome, each run when a test first asks for it (one after another:
    the heavy ones are not run at all without --heavy)."""
    root = tmp_path_factory.mktemp("node-failure")
    done: dict[str, dict] = {}

    def run(name: str) -> dict:
        if name not in done:
            done[name] = _crash_under(slurm_nodes, root, name)
        return done[name]
    return run


def _starts(paths) -> list[dict]:
    return events(paths, "started")


# CI runs the survivor: going on in the allocation at another world size covers the most; the
# spare and the requeue off the dead node run with --heavy.
@pytest.mark.parametrize("name", heavy_params(SHAPES, {"spare", "requeued"}))
def test_a_dead_node_is_left_behind_and_the_job_completes_exactly(runs, name, slurm_nodes):
    run = runs(name)
    paths, victim, first = run["paths"], run["victim"], run["first"]
    assert run["state"] == "COMPLETED", describe_failure(paths)
    assert [e["nodes"] for e in events(paths, "node_lost")] == [[victim]]
    state = run_state.read(paths)
    assert not {"failure", "stall"} & set(state.retries), state   # retries_on_failure untouched
    after = _starts(paths)[-1]
    assert victim not in after["hosts"]
    # The node it goes on with: the spare Slurm gave, or any idle one (of 8, not one named here).
    third = next(host for host in after["hosts"] if host not in first) if len(after["hosts"]) > 1 else None
    assert third is None or third in slurm_nodes.nodes
    if name in ("spare", "survivor"):
        # No requeue: Slurm's records are the allocation before its shrink (once slurmctld
        # marks the node down, --no-kill keeps the job and resizes it) and the job after it.
        assert run["segments"][-1] == "COMPLETED", run["segments"]
        assert set(run["segments"][:-1]) <= {"RESIZING"}, run["segments"]
        assert [e["cause"] for e in events(paths, "restarted")] == ["node_failure"]
    if name == "spare":
        assert after["hosts"] == [first[0], third] and after["restart"] == 0
        assert state.restarts_in_job == {"node_failure": 1}
    elif name == "survivor":
        assert after["hosts"] == [first[0]] and after["ranks"] == 1
        assert events(paths, "training_started")[-1]["world_size"] == 1
    else:
        # Slurm's own record of the requeue varies: the first run's record (REQUEUED) is
        # missing when the job was requeued while a node of it was not responding (seen here);
        # the restart count in the events is Slurm's SLURM_RESTART_COUNT.
        assert run["segments"][-1] == "COMPLETED", run["segments"]
        assert set(run["segments"][:-1]) <= {"REQUEUED"}, run["segments"]
        assert [e["cause"] for e in events(paths, "requeued")] == ["node_failure"]
        # Requeued off the dead node onto any two that are free (of 8: not necessarily first[0]).
        assert len(set(after["hosts"])) == 2 and after["restart"] == 1, after
        assert state.retries == {"node_failure": 1}
        assert not events(paths, "restarted")

    spec = load_spec(paths.spec)
    resumed = events(paths, "resumed")
    assert len(resumed) == 1 and resumed[0]["samples"] > 0, resumed
    rows = kept_history(read_ledger(run["ledger"]), [e["samples"] for e in resumed])
    size = events(paths, "training_started")[-1]["epoch_samples"]
    trained = assert_every_sample_once_in_order(rows, spec, size)

    diagnosis = cli("diagnose", str(paths.root), "--run", "0", env=slurm_nodes.env).stdout
    assert "a node of the job died [node_failure]" in diagnosis, diagnosis
    assert "mpirun could not start the ranks" not in diagnosis, diagnosis
    lost = events(paths, "node_lost")[0]
    again = (events(paths, "training_started")[-1]["time"] - run["crashed"])
    print(f"[node failure] {name}: {victim} crashed; driver saw it after "
          f"{lost['time'] - run['crashed']:.1f} s, training again after {again:.1f} s on "
          f"{', '.join(after['hosts'])}; samples per epoch {trained}")
