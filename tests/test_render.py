"""sbatch text: the rendered standalone script and submitit's script, against golden files."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from hpc_train.rundir import RunPaths
from hpc_train.slurm.options import sbatch_options
from hpc_train.slurm.render import fill_template, render_script
from hpc_train.slurm.submit import planned_script
from hpc_train.spec import load_spec
from tests.conftest import REPO
from tests.test_launch import check_golden

# A path with a space, a dollar and a command substitution: it must reach bash as one word.
ODD_RUN_DIR = Path("/scratch/my runs/$(touch pwned)/smoke-20260101-000000")
PYTHON = "/opt/venv/bin/python"


def smoke(*overrides: str):
    return load_spec(REPO / "jobs/smoke.yaml", overrides)


def test_rendered_script_golden():
    text = render_script(smoke("slurm.setup=['module load openmpi/4.1']", "slurm.partition=gpu"),
                         RunPaths(ODD_RUN_DIR), PYTHON)
    check_golden("smoke.sbatch", text.splitlines())


def test_submitit_script_golden():
    text = planned_script(smoke("slurm.account=proj-1"), ODD_RUN_DIR, PYTHON)
    check_golden("smoke_submitit.sbatch", text.splitlines())


def test_rendered_script_is_valid_bash_and_quotes_the_run_dir():
    text = render_script(smoke(), RunPaths(ODD_RUN_DIR), PYTHON)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    exec_line = next(line for line in text.splitlines() if line.startswith("exec "))
    assert shlex.split(exec_line) == ["exec", PYTHON, "-m", "hpc_train.job.driver", str(ODD_RUN_DIR)]


def test_options_one_driver_pattern_and_extras():
    options = sbatch_options(smoke("slurm.extra={exclusive: '', mail-type: END}", "slurm.gpus_per_node=2"), "o")
    assert options["ntasks-per-node"] == "2" and options["signal"] == "B:USR2@60"
    assert options["requeue"] is True and options["open-mode"] == "append"
    assert options["exclusive"] is True and options["mail-type"] == "END"
    assert options["gpus-per-node"] == "2" and options["time"] == "10"


def test_site_template_placeholders_and_bash_braces(tmp_path):
    template = "#!/bin/bash\n{sbatch_directives}\necho ${HOME} {job_name}\n{driver_command}\n"
    text = fill_template(template, {"sbatch_directives": "#SBATCH --x=1", "setup": "",
                                    "driver_command": "exec true", "run_dir": "/r", "job_name": "j"})
    assert text == "#!/bin/bash\n#SBATCH --x=1\necho ${HOME} j\nexec true\n"
    with pytest.raises(ValueError, match="driver_command"):
        fill_template("#!/bin/bash\n{sbatch_directives}\n", {})
