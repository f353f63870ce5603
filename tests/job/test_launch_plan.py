"""What the driver hands the launcher: rendezvous address and port, method, network."""

import socket

import pytest

from hpc_train.errors import LaunchError
from hpc_train.job.driver import launch_plan, master_address, port_is_free, rendezvous_ports
from hpc_train.launch.allocation import Allocation
from hpc_train.launch.argv import launch_argv, launcher_env
from hpc_train.rundir import RunPaths
from hpc_train.spec import load_spec
from tests.conftest import REPO

TWO_NODES = Allocation((("hpcn1", 1), ("hpcn2", 1)))


def test_each_job_has_its_own_block_of_ports():
    first, second = rendezvous_ports("1234", 7), rendezvous_ports("1235", 7)
    assert len(set(first)) == len(first) == 10 and not set(first) & set(second)
    assert all(20000 <= p < 60000 for p in first + rendezvous_ports("99999999", 7))
    # Outside Slurm, each driver process its own: two local runs started together do not meet.
    assert not set(rendezvous_ports(None, 4242)) & set(rendezvous_ports(None, 4243))
    assert rendezvous_ports("1234", 1) == rendezvous_ports("1234", 2)


def test_a_taken_port_is_seen():
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        assert not port_is_free(held.getsockname()[1])


def test_master_is_the_first_node_and_its_address_on_the_chosen_network():
    addresses = [("lo", "127.0.0.1"), ("eth0", "192.168.0.9"), ("ib0", "10.1.0.1")]
    assert master_address(TWO_NODES, None, "hpcn1", addresses) == "hpcn1"
    assert master_address(TWO_NODES, "10.1.0.0/16", "hpcn1.cluster", addresses) == "10.1.0.1"
    # A driver elsewhere cannot know the first node's address: its name then.
    assert master_address(TWO_NODES, "10.1.0.0/16", "hpcn2", addresses) == "hpcn1"


def _spec(*overrides):
    return load_spec(REPO / "jobs/smoke.yaml", overrides=list(overrides))


def test_srun_plan_inside_slurm(tmp_path):
    spec = _spec("slurm.nodes=2", "slurm.tasks_per_node=1", "launch.method=srun")
    environ = {"SLURM_JOB_ID": "42", "PATH": "/usr/bin:/bin", "SLURM_JOB_NODELIST": "hpcn[1-2]"}
    plan = launch_plan(spec, RunPaths(tmp_path), TWO_NODES, environ)
    argv = launch_argv(plan)
    assert argv[:2] == ["srun", "--mpi=pmix"] and "--nodelist=hpcn1,hpcn2" in argv
    env = launcher_env(plan, environ)
    assert env["MASTER_ADDR"] == "hpcn1" and int(env["MASTER_PORT"]) in rendezvous_ports("42", 0)
    assert env["OMP_NUM_THREADS"] == "1" and env["HPC_TRAIN_LAUNCHER"] == "srun"


def test_srun_outside_slurm_is_refused_with_the_fix(tmp_path):
    spec = _spec("launch.method=srun")
    with pytest.raises(LaunchError, match="launch.method=mpirun"):
        launch_plan(spec, RunPaths(tmp_path), Allocation((("here", 2),)), {"PATH": "/usr/bin"})


@pytest.mark.parametrize("overrides, expected", [
    ([], {"HOROVOD_CYCLE_TIME": "2", "OMPI_MCA_mpi_yield_when_idle": "1"}),      # smoke: 1 core
    (["parallel.horovod.cycle_time_ms=2.5"], {"HOROVOD_CYCLE_TIME": "2.5",
                                             "OMPI_MCA_mpi_yield_when_idle": "1"}),
    (["launch.env.OMPI_MCA_mpi_yield_when_idle=0"], {"HOROVOD_CYCLE_TIME": "2",
                                                    "OMPI_MCA_mpi_yield_when_idle": "0"}),
    (["slurm.cpus_per_task=2", "data.workers=1"], {}),              # a core for Horovod's thread
    (["parallel.horovod.few_core_tuning=false"], {}),
    (["parallel.backend=ddp"], {}),
    (["launch.mpi=mpich"], {"HOROVOD_CYCLE_TIME": "2"}),          # Open MPI's variable only
])
def test_horovod_on_one_core_per_rank_is_tuned_unless_told_otherwise(tmp_path, overrides, expected):
    plan = launch_plan(_spec(*overrides), RunPaths(tmp_path), Allocation((("here", 2),)),
                       {"PATH": "/usr/bin:/bin"})
    given = {k: plan.env[k] for k in ("HOROVOD_CYCLE_TIME", "OMPI_MCA_mpi_yield_when_idle") if k in plan.env}
    assert given == expected
