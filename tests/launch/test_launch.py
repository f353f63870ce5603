"""Allocation parsing and the launchers' argv (mpirun, srun), against golden files (tests/golden/)."""


import pytest

from hpc_train.launch.allocation import (Allocation, allocation_from_slurm, expand_tasks_per_node,
                                         training_hosts)
from hpc_train.launch.argv import LaunchPlan, launch_argv, launcher_env, mpirun_argv, srun_argv
from hpc_train.scheduler.parse import expand_hostlist
from tests.runs import check_golden

@pytest.mark.parametrize("nodelist, hosts", [
    ("vm", ["vm"]),
    ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
    ("a[1-2],b,c[9-10]", ["a1", "a2", "b", "c9", "c10"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
])
def test_expand_hostlist(nodelist, hosts):
    assert expand_hostlist(nodelist) == hosts


def test_expand_tasks_per_node():
    assert expand_tasks_per_node("4(x2),2") == [4, 4, 2]
    assert expand_tasks_per_node("1") == [1]
    with pytest.raises(ValueError, match="unrecognised"):
        expand_tasks_per_node("4x2")


def test_the_ranks_run_on_the_first_hosts_alive_and_the_rest_wait():
    job = Allocation((("n1", 2), ("n2", 2), ("n3", 2)))
    assert training_hosts(job, 2) == Allocation((("n1", 2), ("n2", 2)))
    assert training_hosts(job, 2, {"n2"}) == Allocation((("n1", 2), ("n3", 2)))     # a spare
    with pytest.raises(ValueError, match="2 nodes needed, 1 alive .*lost: n1, n3"):
        training_hosts(job, 2, {"n1", "n3"})


def test_allocation_from_slurm_and_mismatch():
    alloc = allocation_from_slurm({"SLURM_JOB_NODELIST": "gpu[1-2]", "SLURM_TASKS_PER_NODE": "4(x2)"})
    assert alloc.hosts == (("gpu1", 4), ("gpu2", 4)) and alloc.world_size == 8
    with pytest.raises(ValueError, match="2 hosts"):
        allocation_from_slurm({"SLURM_JOB_NODELIST": "gpu[1-2]", "SLURM_TASKS_PER_NODE": "4"})


PLAN = dict(
    allocation=Allocation((("gpu01", 4), ("gpu02", 4))),
    worker=["/venv/bin/python", "-m", "hpc_train.job.worker", "/runs/r n"],
    env={"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "1", "ODD": "a b;$(rm -rf ~)"},
    extra_args=["-mca", "btl", "^openib"],
)


@pytest.mark.parametrize("flavour", ["openmpi", "mpich", "intel"])
def test_mpirun_argv_golden(flavour):
    # One argument per line.
    check_golden(f"mpirun_{flavour}.txt", "\n".join(mpirun_argv(LaunchPlan(flavour=flavour, **PLAN))) + "\n")


def test_openmpi_as_root_and_values_stay_single_arguments():
    argv = mpirun_argv(LaunchPlan(flavour="openmpi", as_root=True, **PLAN))
    assert "--allow-run-as-root" in argv
    assert "ODD=a b;$(rm -rf ~)" in argv        # one argv element: no shell ever sees it
    assert argv[-4:] == PLAN["worker"]


def test_unknown_flavour_and_uneven_intel():
    with pytest.raises(ValueError, match="unknown MPI flavour"):
        mpirun_argv(LaunchPlan(flavour="lam", **PLAN))
    uneven = {**PLAN, "allocation": Allocation((("a", 4), ("b", 2)))}
    with pytest.raises(ValueError, match="same ranks on every host"):
        mpirun_argv(LaunchPlan(flavour="intel", **uneven))


def test_inherited_keeps_only_variables_that_are_set():
    from hpc_train.launch.argv import inherited

    assert inherited({"PATH": "/bin", "SLURM_JOB_ID": "7", "OTHER": "x"}) == ("PATH", "SLURM_JOB_ID")


def test_srun_argv_golden():
    plan = LaunchPlan(flavour="openmpi", method="srun", pmi="pmix", cpus_per_task=8, **PLAN)
    check_golden("srun.txt", "\n".join(launch_argv(plan)) + "\n")


def test_srun_places_uneven_slots_task_by_task():
    plan = LaunchPlan(flavour="openmpi", method="srun", **{**PLAN, "allocation": Allocation(
        (("a", 2), ("b", 2), ("c", 1)))})
    argv = srun_argv(plan)
    assert "--distribution=arbitrary" in argv and "--nodelist=a,a,b,b,c" in argv
    assert "--ntasks=5" in argv and not any(a.startswith("--ntasks-per-node") for a in argv)


def test_srun_variables_travel_in_its_environment_not_its_argv():
    plan = LaunchPlan(flavour="openmpi", method="srun", network_interface="10.1.0.0/16", **PLAN)
    env = launcher_env(plan, {"PATH": "/bin", "ODD": "driver's"})
    assert env["ODD"] == "a b;$(rm -rf ~)" and env["PATH"] == "/bin"   # the spec's value wins
    assert env["HPC_TRAIN_LAUNCHER"] == "srun"
    assert env["OMPI_MCA_btl_tcp_if_include"] == "10.1.0.0/16"
    assert not any("rm -rf" in a for a in srun_argv(plan))
    mpirun_plan = LaunchPlan(flavour="openmpi", **PLAN)
    assert launcher_env(mpirun_plan, {"PATH": "/bin"}) == {"PATH": "/bin"}


def test_network_interface_reaches_mpirun_and_hydra():
    plan = LaunchPlan(flavour="openmpi", network_interface="ib0", **PLAN)
    argv = mpirun_argv(plan)
    assert argv[argv.index("btl_tcp_if_include") + 1] == "ib0"
    assert argv[argv.index("oob_tcp_if_include") + 1] == "ib0"
    hydra = mpirun_argv(LaunchPlan(flavour="mpich", network_interface="ib0", **PLAN))
    assert hydra[hydra.index("-iface") + 1] == "ib0"


def test_unknown_method():
    with pytest.raises(ValueError, match="unknown launch method"):
        launch_argv(LaunchPlan(flavour="openmpi", method="ssh", **PLAN))
