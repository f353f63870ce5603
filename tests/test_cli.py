import subprocess
import sys

from tests.conftest import REPO


def run_module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc_train", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO)


def test_help_lists_subcommands():
    out = run_module("--help")
    assert out.returncode == 0
    assert "doctor" in out.stdout


def test_unknown_subcommand_is_a_usage_error():
    out = run_module("no-such-command")
    assert out.returncode == 2
    assert "invalid choice" in out.stderr


def test_login_node_modules_do_not_import_heavy_libraries():
    code = (
        "import sys, hpc_train.cli, hpc_train.doctor.report, hpc_train.doctor.checks, "
        "hpc_train.launch.mpi, hpc_train.launch.argv, hpc_train.spec, hpc_train.spec.paths, "
        "hpc_train.slurm.submit, hpc_train.job.driver, hpc_train.slurm.standalone, hpc_train.rundir, "
        "hpc_train.events, hpc_train.scheduler, hpc_train.job.watchdog, hpc_train.slurm.resume, "
        "hpc_train.inspection.cli, hpc_train.inspection.summary, hpc_train.inspection.logs, "
        "hpc_train.inspection.diagnose, hpc_train.inspection.text, hpc_train.inspection.plot, "
        "hpc_train.bench.inspect, hpc_train.bench.pipeline, hpc_train.launch.local, "
        "hpc_train.spec.pipeline_rules, hpc_train.inspection.report, hpc_train.inspection.report_text, "
        "hpc_train.slurm.snapshot, hpc_train.slurm.run_code, hpc_train.runtime.environment, "
        "hpc_train.runtime.gpu_sampler, hpc_train.slurm.array, hpc_train.workflow.cli, "
        "hpc_train.workflow.run, hpc_train.workflow.status, hpc_train.workflow.resume, "
        "hpc_train.workflow.best, hpc_train.workflow.local; "
        "heavy = [m for m in ('torch', 'horovod', 'h5py', 'mpi4py') if m in sys.modules]; "
        "hpc_train.cli.build_parser(); print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_readme_test_command_is_what_ci_runs():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci/run").read_text()
    command = next(line.split("=", 1)[1].strip().strip("'\"") for line in ci.splitlines()
                   if line.startswith("TEST_COMMAND="))
    assert command in readme


def test_relative_spec_paths_resolve_against_the_submit_directory(tmp_path):
    from hpc_train.spec import load_spec
    from hpc_train.spec.paths import resolve_paths

    spec = load_spec(REPO / "jobs/smoke.yaml", ["run.root=runs", "slurm.site_profile=env/site.sh",
                                                 "data.path=/abs/shards"])
    resolved = resolve_paths(spec, tmp_path)
    assert resolved.run.root == str(tmp_path / "runs")
    assert resolved.slurm.site_profile == str(tmp_path / "env/site.sh")
    assert resolved.data.path == "/abs/shards"              # absolute paths stay as written
    assert resolved.optim == spec.optim
