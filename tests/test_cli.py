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
        "hpc_train.launch.mpi; "
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
