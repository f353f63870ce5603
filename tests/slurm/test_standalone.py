"""sbatch text: the rendered standalone script, submitit's script and a workflow stage's, made
from one Resources value (against golden files), and the checks on a site's template."""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
from pathlib import Path

import pytest
import submitit

from hpc_train.cli import main
from hpc_train.errors import SpecError, SubmitError
from hpc_train.rundir import RunPaths
from hpc_train.slurm.standalone import fill_template, render_script
from hpc_train.slurm.script import run_options
from hpc_train.slurm.submit import planned_script
from hpc_train.slurm.submitit_private import PRIVATE, private_method
from hpc_train.spec import Resources, load_spec
from hpc_train.workflow import refs
from hpc_train.workflow.script import StageJob, render
from tests.conftest import REPO
from tests.runs import check_golden, cli, run_dirs

# A path with a space, a dollar and a command substitution: it must reach bash as one word.
ODD_RUN_DIR = Path("/scratch/my runs/$(touch pwned)/smoke-20260101-000000")
PYTHON = "/opt/venv/bin/python"
# One spec for the golden files: a site profile, setup lines, partition, account, GPUs and mail.
SITE = ("slurm.site_profile=/opt/my site/profile.sh",
        "slurm.setup=['module load openmpi/4.1', 'export OMP_PROC_BIND=close']",
        "slurm.partition=gpu", "slurm.account=proj-1", "slurm.gpus_per_node=2",
        "slurm.mail_type=END,FAIL", "slurm.mail_user=me@example.org")
RESOURCE_OPTIONS = ("cpus-per-task", "time", "gpus-per-node", "partition", "account", "mem",
                    "mail-type", "mail-user")
SETUP = ["source '/opt/my site/profile.sh'", "module load openmpi/4.1", "export OMP_PROC_BIND=close"]
VALUES = {"sbatch_directives": "#SBATCH --x=1", "setup": ":", "driver_command": "exec true",
          "run_dir": "/r", "job_name": "j"}


def smoke(*overrides: str):
    return load_spec(REPO / "jobs/smoke.yaml", overrides)


def section(text: str, header: str) -> list[str]:
    """The lines after `header` up to the next blank line."""
    lines = text.splitlines()
    start = lines.index(header) + 1
    end = lines.index("", start) if "" in lines[start:] else len(lines)
    return lines[start:end]


def resources_of(spec) -> Resources:
    """The Resources part of a job spec's slurm section: what a workflow stage is given."""
    return Resources(**{f.name: getattr(spec.slurm, f.name) for f in dataclasses.fields(Resources)})


def stage_script(resources: Resources) -> str:
    """An evaluate stage's script with `resources`, waiting for job 41."""
    stage_dir = ODD_RUN_DIR.parent / "smoke-chain-20260101-000000" / "stages" / "evaluate"
    line = [refs.literal(w) for w in (PYTHON, "-m", "hpc_train", "evaluate", str(ODD_RUN_DIR))]
    job = StageJob("smoke-chain", "evaluate", "evaluate", "main", resources,
                   str(stage_dir / "slurm-%j.out"), [line], refs.literal(str(stage_dir / "COMPLETE")))
    return render(job, "afterok:41")


def directives(text: str) -> dict[str, str]:
    """`#SBATCH --NAME=VALUE` lines -> {NAME: VALUE unquoted}."""
    return dict(shlex.split(line)[1][2:].partition("=")[::2] for line in text.splitlines()
                if line.startswith("#SBATCH --"))


def exec_line(text: str) -> list[str]:
    [line] = [line for line in text.splitlines() if line.startswith("exec ")]
    return shlex.split(line)


def test_rendered_script_golden():
    check_golden("smoke.sbatch", render_script(smoke(*SITE), RunPaths(ODD_RUN_DIR), PYTHON))


def test_submitit_script_golden():
    check_golden("smoke_submitit.sbatch", planned_script(smoke(*SITE), ODD_RUN_DIR, PYTHON))


def test_stage_script_golden():
    check_golden("stage.sbatch", stage_script(resources_of(smoke(*SITE))))


def test_one_resources_value_asks_the_same_of_a_run_and_a_stage():
    spec = smoke(*SITE)
    texts = [render_script(spec, RunPaths(ODD_RUN_DIR), PYTHON), planned_script(spec, ODD_RUN_DIR, PYTHON),
             stage_script(resources_of(spec))]
    rendered, planned, stage = (directives(text) for text in texts)
    for name in RESOURCE_OPTIONS:
        assert rendered[name] == planned[name] == stage[name], name
    assert stage["mail-type"] == "END,FAIL" and stage["gpus-per-node"] == "2"
    lines = texts[2].splitlines()
    after_strict = lines[lines.index("set -euo pipefail") + 1:]
    assert after_strict[:len(SETUP)] == SETUP                  # the site profile reaches the stage


def test_both_forms_share_setup_and_driver_line():
    spec = smoke(*SITE)
    rendered = render_script(spec, RunPaths(ODD_RUN_DIR), PYTHON)
    planned = planned_script(spec, ODD_RUN_DIR, PYTHON)
    assert section(rendered, "# site setup") == section(planned, "# setup") == SETUP
    assert exec_line(rendered) == exec_line(planned) == [
        "exec", PYTHON, "-m", "hpc_train.job.driver", str(ODD_RUN_DIR)]
    for script in (rendered, planned):
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_render_and_dry_run_commands_agree(tmp_path):
    profile = tmp_path / "my site" / "profile.sh"
    sets = [f"run.root={tmp_path}/runs", f"slurm.site_profile={profile}",
            "slurm.setup=['module load openmpi/4.1']"]
    args = [a for s in sets for a in ("--set", s)]
    script = tmp_path / "job.sbatch"
    rendered = cli("render", "jobs/smoke.yaml", "-o", str(script), *args)
    planned = cli("submit", "jobs/smoke.yaml", "--dry-run", *args)
    assert rendered.returncode == 0 and planned.returncode == 0, rendered.stderr + planned.stderr
    rendered_text, planned_text = script.read_text(), planned.stdout
    expected_setup = [f"source {shlex.quote(str(profile))}", "module load openmpi/4.1"]
    assert section(rendered_text, "# site setup") == section(planned_text, "# setup") == expected_setup
    # The same driver and code snapshot; only the run directory differs (the dry run names
    # none of its own).
    [run_dir] = run_dirs(tmp_path / "runs")
    planned_line = exec_line(planned_text)
    dry_dir = Path(planned_line[-1])
    assert dry_dir == run_dir.parent / "smoke-<timestamp>"
    assert exec_line(rendered_text) == [w.replace(str(dry_dir), str(run_dir)) for w in planned_line]
    assert planned_line[:3] == ["exec", "env", f"PYTHONPATH={dry_dir}/code${{PYTHONPATH:+:$PYTHONPATH}}"]


def test_submitit_private_methods_are_those_of_the_installed_release():
    # Fails with submitit's version and the fix when a release changes them.
    executor = submitit.SlurmExecutor(folder="/nonexistent")
    for name in PRIVATE:
        private_method(executor, name)


def test_a_changed_private_method_is_named_with_the_fix():
    class Changed:
        def _submit_command(self, command, account):
            raise AssertionError("never called")

    with pytest.raises(SubmitError, match=r"Changed\._submit_command\(command\).*submitit==1\.5\.4"):
        private_method(Changed(), "_submit_command")
    with pytest.raises(SubmitError, match="_make_submission_file_text"):
        private_method(Changed(), "_make_submission_file_text")


def test_rendered_script_is_valid_bash_and_quotes_the_run_dir():
    text = render_script(smoke(), RunPaths(ODD_RUN_DIR), PYTHON)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    assert exec_line(text) == ["exec", PYTHON, "-m", "hpc_train.job.driver", str(ODD_RUN_DIR)]
    assert section(text, "# site setup") == [":"]          # no setup: still a valid line


def test_options_one_driver_pattern_and_extras():
    options = run_options(smoke("slurm.extra={exclusive: '', mail-type: END}", "slurm.gpus_per_node=2"), "o")
    assert options["ntasks-per-node"] == "2" and options["signal"] == "B:USR2@60"
    assert options["requeue"] is True and options["open-mode"] == "append"
    assert options["exclusive"] is True and options["mail-type"] == "END"
    assert options["gpus-per-node"] == "2" and options["time"] == "10"


def test_hot_spares_are_asked_for_with_no_kill():
    assert "no-kill" not in run_options(smoke(), "o") and run_options(smoke(), "o")["nodes"] == "1"
    options = run_options(smoke("slurm.nodes=2", "slurm.spare_nodes=1"), "o")
    assert (options["nodes"], options["no-kill"]) == ("3", True)


def test_a_node_range_is_asked_for_as_slurms_own_with_no_kill_starting_on_the_most():
    assert run_options(smoke("slurm.nodes=2-2"), "o")["nodes"] == "2"     # one count: no range
    assert "no-kill" not in run_options(smoke("slurm.nodes=2-2"), "o")
    options = run_options(smoke("slurm.nodes=1-2"), "o")
    assert (options["nodes"], options["no-kill"]) == ("1-2", True)
    # every node's tasks: Slurm would otherwise start the job on 1 node however many are idle
    assert (options["ntasks"], options["ntasks-per-node"]) == ("4", "2")
    spares = run_options(smoke("slurm.nodes=1-2", "slurm.spare_nodes=1"), "o")
    assert (spares["nodes"], spares["ntasks"]) == ("2-3", "6")
    assert "ntasks" not in run_options(smoke("slurm.nodes=2", "slurm.spare_nodes=1"), "o")
    spec = smoke("slurm.nodes=1-2")
    rendered = render_script(spec, RunPaths(ODD_RUN_DIR), PYTHON).splitlines()
    submitted = planned_script(spec, ODD_RUN_DIR, PYTHON).splitlines()
    for text in (rendered, submitted):
        assert "#SBATCH --nodes=1-2" in text and "#SBATCH --no-kill" in text
        assert not any(line.startswith("#SBATCH --nodes=2") for line in text)


def test_site_template_placeholders_and_bash_braces():
    template = ("#!/bin/bash\n{sbatch_directives}\n{setup}\nf() { :; }\necho ${HOME} ${job_name} {a,b} "
                "{job_name}\nawk '{ print }' /dev/null\n{driver_command}\n")
    assert fill_template(template, VALUES) == (
        "#!/bin/bash\n#SBATCH --x=1\n:\nf() { :; }\necho ${HOME} ${job_name} {a,b} j\n"
        "awk '{ print }' /dev/null\nexec true\n")


def test_a_value_holding_a_placeholder_is_inserted_as_it_is():
    filled = fill_template("{sbatch_directives}\n{setup}\n{driver_command}\n",
                           {**VALUES, "setup": "echo {driver_command}"})
    assert filled == "#SBATCH --x=1\necho {driver_command}\nexec true\n"


BAD_TEMPLATES = {   # case -> (template, words its error line must hold)
    "unknown placeholder": (
        "#!/bin/bash\n{sbatch_directives}\n{setup}\n#SBATCH --partition={partition}\n{driver_command}\n",
        ["line 4: unknown placeholder {partition}", "Fix:", "${partition}"]),
    "missing placeholder": (
        "#!/bin/bash\n{sbatch_directives}\nmodule load mpi\n{driver_command}\n",
        ["no {setup}", "Fix: add each"]),
    "unclosed brace": (
        "#!/bin/bash\n{sbatch_directives}\n{setup}\necho {job_name\n{driver_command}\n",
        ["line 4: {job_name is not closed", "Fix: write {job_name} exactly"]),
    "format spec": (
        "#!/bin/bash\n{sbatch_directives}\n{setup}\necho {job_name!r}\n{driver_command}\n",
        ["{job_name is not closed", "no format specs"]),
}


def render_with_template(tmp_path, template: Path, capsys) -> tuple[int, list[str]]:
    code = main(["render", "jobs/smoke.yaml", "-o", str(tmp_path / "job.sbatch"), "--template", str(template),
                 "--set", f"run.root={tmp_path}/runs"])
    return code, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("case", list(BAD_TEMPLATES))
def test_bad_template_is_one_line_exit_2_and_no_run_directory(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    text, words = BAD_TEMPLATES[case]
    template = tmp_path / "site.sbatch"
    template.write_text(text)
    code, err = render_with_template(tmp_path, template, capsys)
    assert code == 2
    [line] = [e for e in err if not e.startswith("warning: ")]
    assert line.startswith(f"error: render --template {template}: ")
    for word in words:
        assert word in line
    assert not (tmp_path / "runs").exists() and not (tmp_path / "job.sbatch").exists()


def test_missing_template_file_is_one_line_exit_2_and_no_run_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    code, err = render_with_template(tmp_path, tmp_path / "nope.sbatch", capsys)
    assert code == 2
    [line] = [e for e in err if not e.startswith("warning: ")]
    assert "nope.sbatch: cannot read it (No such file or directory). Fix:" in line
    assert not (tmp_path / "runs").exists()


def test_good_site_template_renders(tmp_path, capsys, monkeypatch):
    # The negative cases above are not vacuous: a template with bash's own braces goes through.
    monkeypatch.chdir(REPO)
    template = tmp_path / "site.sbatch"
    template.write_text("#!/bin/bash\n{sbatch_directives}\nf() { echo ${SLURM_JOB_ID:-none}; }\n{setup}\n"
                        "cd {run_dir}\n{driver_command}\n")
    code, _ = render_with_template(tmp_path, template, capsys)
    assert code == 0
    text = (tmp_path / "job.sbatch").read_text()
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    [run_dir] = run_dirs(tmp_path / "runs")
    assert f"cd {run_dir}" in text.splitlines() and RunPaths(run_dir).sbatch.read_text() == text


def test_fill_template_refuses_a_bad_template():
    with pytest.raises(SpecError, match="no {setup}, {driver_command}"):
        fill_template("#!/bin/bash\n{sbatch_directives}\n", VALUES)
