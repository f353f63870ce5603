"""Job spec: strict loading, overrides, round trip, derived values, cross-field rules, and a
corpus of wrong specs checked through the real CLI (exit 2, one line naming the key, no
traceback)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpc_train.cli import main as cli_main
from hpc_train.errors import SpecError
from hpc_train.scheduler.parse import parse_duration
from hpc_train.spec import (JobSpec, RunSpec, SpecInvalid, build_spec, check_spec, dump_spec_yaml,
                            load_spec, spec_from_dict, spec_hash, spec_to_dict,
                            validate_spec_file)
from tests.conftest import REPO
from tests.runs import BAD_SPECS



def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def spec(**sections) -> JobSpec:
    """A spec from sections given as dicts; run.name defaults to 't'."""
    sections.setdefault("run", {"name": "t"})
    return spec_from_dict(sections)


def problems_of(data: dict, overrides=()) -> list[str]:
    with pytest.raises(SpecInvalid) as info:
        spec_from_dict(data, overrides)
    return [str(p) for p in info.value.problems]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpc_train", *args], capture_output=True,
                          text=True, timeout=60, cwd=REPO)


# --- loading and conversion -------------------------------------------------------------------

def test_minimal_file_gets_every_default(tmp_path):
    loaded = load_spec(write(tmp_path, "run:\n  name: t\n"))
    assert loaded == JobSpec(run=RunSpec(name="t"))
    assert loaded.optim.base_lr == 0.1 and loaded.slurm.time == "00:30:00"
    assert loaded.optim.step_milestones == [30, 60, 80] and loaded.checkpoint.every_minutes == 30


def test_exponent_written_plainly_becomes_a_float(tmp_path):
    assert yaml.safe_load("x: 1e-4")["x"] == "1e-4"  # the PyYAML behaviour we guard against
    loaded = load_spec(write(tmp_path, "run: {name: t}\noptim:\n  weight_decay: 1e-4\n"))
    assert loaded.optim.weight_decay == pytest.approx(1e-4)
    assert isinstance(loaded.optim.weight_decay, float)


def test_unquoted_time_is_not_read_as_base_60(tmp_path):
    loaded = load_spec(write(tmp_path, "run: {name: t}\nslurm:\n  time: 1:30:00\n"))
    assert loaded.slurm.time == "1:30:00" and loaded.slurm.time_minutes == 90


@pytest.mark.parametrize("section, key, given, expected", [
    ("slurm", "nodes", "4", 4), ("slurm", "nodes", 2.0, 2), ("optim", "base_lr", 1, 1.0),
    ("slurm", "mem", 0, "0"), ("launch", "env", {"OMP_NUM_THREADS": 1}, {"OMP_NUM_THREADS": "1"}),
    ("precision", "loss_scale", "1024", 1024.0),
])
def test_values_users_plausibly_mean_are_converted(section, key, given, expected):
    loaded = spec(**{section: {key: given}})
    assert getattr(getattr(loaded, section), key) == expected


@pytest.mark.parametrize("section, key, given, words", [
    ("slurm", "nodes", True, "not a boolean"), ("data", "workers", False, "not a boolean"),
    ("slurm", "nodes", "5.5", "whole number"), ("slurm", "nodes", 2.5, "fractional"),
    ("optim", "base_lr", float("nan"), "must be a number"), ("optim", "nesterov", 1, "true or false"),
    ("run", "name", 3.5, "quote it"), ("model", "options", [1], "must be a mapping"),
])
def test_wrong_types_are_refused(section, key, given, words):
    data: dict = {"run": {"name": "t"}}
    data.setdefault(section, {})[key] = given
    (line,) = problems_of(data)
    assert line.startswith(f"{section}.{key}: ") and words in line and "Fix:" in line


def test_unknown_key_names_the_path_suggests_and_lists_valid_keys():
    (line,) = problems_of({"run": {"name": "t"}, "optim": {"lerning_rate": 0.1}})
    assert line.startswith("optim.lerning_rate: unknown key")
    assert "did you mean 'optim.base_lr'" in line and "valid keys in optim: name, options, base_lr" in line


def test_every_problem_in_a_file_is_reported_at_once(tmp_path):
    path = write(tmp_path, "run: {name: 'a b'}\nslurm: {nodes: 0, tim: 5}\noptim: {base_lr: x}\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    lines = str(info.value).splitlines()
    assert [line.split(":")[0] for line in lines] == ["run.name", "slurm.tim", "slurm.nodes",
                                                      "optim.base_lr"]


def test_python_tags_are_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    path = write(tmp_path, f'run:\n  name: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(SpecError, match="tags are not allowed"):
        load_spec(path)
    assert not marker.exists()


def test_missing_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="file not found"):
        load_spec(tmp_path / "nope.yaml")


# --- overrides --------------------------------------------------------------------------------

def test_command_line_beats_file_beats_defaults(tmp_path):
    path = write(tmp_path, "run: {name: t}\noptim: {base_lr: 0.3, epochs: 5}\n"
                           "slurm: {setup: [module load x]}\n")
    loaded = load_spec(path, ["optim.base_lr=0.2", "slurm.setup=[]", "launch.env.A=1"])
    assert loaded.optim.base_lr == 0.2          # command line
    assert loaded.optim.epochs == 5             # file
    assert loaded.optim.momentum == 0.9         # default
    assert loaded.slurm.setup == [] and loaded.launch.env == {"A": "1"}


def test_bad_overrides_are_reported_as_coming_from_set():
    lines = problems_of({"run": {"name": "t"}},
                        ["optim.lr=0.1", "slurm.nodes=many", "nodes", "run.name.x=1"])
    assert any(line.startswith("optim.lr (from --set): unknown key") and "optim.base_lr" in line
               for line in lines)
    assert any(line.startswith("slurm.nodes (from --set): 'many'") for line in lines)
    assert any(line.startswith("--set 'nodes': expected SECTION.KEY=VALUE") for line in lines)
    assert any(line.startswith("run.name.x (from --set): run.name is 't'") for line in lines)
    assert len(lines) == 4


# --- saving the resolved spec -----------------------------------------------------------------

def test_dump_reloads_to_an_equal_spec_with_the_same_hash(tmp_path):
    original = load_spec(REPO / "jobs" / "resnet.yaml",
                         ["slurm.time=1:30:00", "launch.env.X=010",
                          "model.options={zero_init_residual: true}"])
    reloaded = load_spec(write(tmp_path, dump_spec_yaml(original), "spec.yaml"))
    assert reloaded == original
    assert spec_hash(reloaded) == spec_hash(original)
    assert spec_to_dict(reloaded)["launch"]["env"]["X"] == "010"


def test_hash_is_stable_and_follows_the_resolved_values():
    first, again = spec(), spec()
    assert spec_hash(first) == spec_hash(again) and len(spec_hash(first)) == 64
    assert spec_hash(spec(optim={"base_lr": 0.2})) != spec_hash(first)
    assert spec_hash(spec(optim={"base_lr": "0.1"})) == spec_hash(first)  # same resolved value


# --- derived values ---------------------------------------------------------------------------

def test_derived_properties():
    s = spec(slurm={"nodes": 4, "tasks_per_node": 4, "gpus_per_node": 4, "time": "2-00:00:00"},
             data={"batch_size": 64}, parallel={"accumulation": 2}, optim={"base_lr": 0.1})
    assert s.world_size == 16 and s.samples_per_step == 64 * 16 * 2
    assert s.scaled_lr == pytest.approx(0.1 * 2048 / 256)
    assert s.slurm.time_minutes == 2 * 24 * 60 and s.uses_gpu
    assert not spec().uses_gpu


@pytest.mark.parametrize("text, seconds", [
    ("30", 1800), ("30:15", 1815), ("01:30:00", 5400), ("1-00", 86400), ("1-02:30", 95400),
    ("2-00:00:00", 172800), ("0", 0), ("1:60:00", None), ("1h", None), ("", None),
    ("1-24", None), ("1:2:3:4", None),
])
def test_slurm_time_formats(text, seconds):
    assert parse_duration(text) == seconds


# --- cross-field rules ------------------------------------------------------------------------

def _rules(s: JobSpec) -> tuple[str, str]:
    errors, warnings = check_spec(s)
    return "\n".join(map(str, errors)), "\n".join(map(str, warnings))


def _replace(s: JobSpec, section: str, **changes) -> JobSpec:
    """Bypass the loader so a rule can be tested on its own."""
    return dataclasses.replace(s, **{section: dataclasses.replace(getattr(s, section), **changes)})


@pytest.mark.parametrize("section, changes, expected", [
    ("data", {"kind": "hdf5"}, "data.path: null with data.kind 'hdf5'"),
    ("slurm", {"time": "00:02:00", "signal_seconds": 90}, "lower slurm.signal_seconds below 90"),
    ("checkpoint", {"every_minutes": None, "keep_every": 100}, "checkpoint.keep_every: 100"),
    ("slurm", {"gpus_per_node": 2, "tasks_per_node": 4}, "set slurm.tasks_per_node: 2"),
])
def test_error_rules(section, changes, expected):
    errors, _ = _rules(_replace(spec(data={"batch_size": 64}), section, **changes))
    assert expected in errors and "Fix:" in errors


def test_error_rules_stop_loading():
    (line,) = problems_of({"run": {"name": "t"}, "launch": {"env": {"HOROVOD_CYCLE_TIME": "5"}}},
                          ["parallel.horovod.cycle_time_ms=2"])
    assert line.startswith("launch.env.HOROVOD_CYCLE_TIME: '5' is not allowed: parallel.horovod "
                           "sets HOROVOD_CYCLE_TIME already. Fix: remove launch.env.HOROVOD_CYCLE_TIME")


def test_signal_just_inside_the_limit_is_fine():
    assert _rules(spec(slurm={"time": "00:02:00", "signal_seconds": 89})) == ("", "")


@pytest.mark.parametrize("sections, expected", [
    ({"slurm": {"gpus_per_node": 4, "tasks_per_node": 2}, "data": {"batch_size": 64}},
     "2 GPU(s) per node stay idle"),
    ({"slurm": {"gpus_per_node": 1}, "data": {"batch_size": 8}}, "data.batch_size: 8"),
    ({"precision": {"loss_scale": 128}}, "loss scaling only applies to fp16"),
    ({"optim": {"epochs": 2}}, "the warm-up never ends"),
    ({"data": {"path": "/x"}}, "the path is ignored"),
])
def test_warning_rules(sections, expected):
    errors, warnings = _rules(spec(**sections))
    assert errors == "" and expected in warnings and "Consider:" in warnings


def test_no_warnings_for_small_cpu_batch_fp16_on_cpu_or_fixed_fp16_scale():
    s = spec(data={"batch_size": 8}, precision={"mode": "fp16", "loss_scale": 1024})
    assert _rules(s) == ("", "")


@pytest.mark.parametrize("name", ["smoke.yaml", "resnet.yaml"])
def test_shipped_job_specs_validate_without_warnings(name):
    loaded, warnings = validate_spec_file(REPO / "jobs" / name)
    assert warnings == [] and loaded.run.name


def test_shipped_specs_say_what_the_brief_asks():
    smoke, resnet = load_spec(REPO / "jobs/smoke.yaml"), load_spec(REPO / "jobs/resnet.yaml")
    assert (smoke.model.name, smoke.world_size, smoke.uses_gpu) == ("resnet_tiny", 2, False)
    assert (resnet.world_size, resnet.samples_per_step, resnet.precision.mode) == (16, 1024, "fp16")


# --- model options, from the model catalog ----------------------------------------------------

def test_model_names_come_from_the_catalog():
    from typing import get_args, get_type_hints

    from hpc_train.models.catalog import MODEL_NAMES
    from hpc_train.spec import ModelSpec

    catalog, own = get_args(get_type_hints(ModelSpec)["name"])     # or a reference to the user's
    assert get_args(catalog) == MODEL_NAMES and own is str


def test_model_options_are_kept_as_given_and_converted():
    loaded = spec(model={"name": "resnet_tiny", "options": {"width": "8", "layers": [1, 2, 1, 1]}})
    assert loaded.model.options == {"width": 8, "layers": [1, 2, 1, 1]}   # defaults stay the catalog's
    assert spec(model={"name": "resnet_tiny"}).model.options == {}
    assert spec(model={"options": {"zero_init_residual": True}}).model.name == "resnet50"  # default


@pytest.mark.parametrize("options, words", [
    ({"widht": 8}, ["model.options.widht: unknown key", "did you mean 'model.options.width'",
                    "valid keys in model.options: zero_init_residual, width, layers"]),
    ({"width": "eight"}, ["model.options.width: 'eight' is not allowed: must be a whole number"]),
    ({"width": 0}, ["model.options.width: 0 is not allowed: must be >= 1"]),
    ({"zero_init_residual": "yes"}, ["model.options.zero_init_residual: 'yes'", "true or false"]),
    ({"layers": [1, 1]}, ["model.options.layers: [1, 1]", "four stages"]),
])
def test_model_options_are_checked_against_the_catalog(options, words):
    (line,) = problems_of({"run": {"name": "t"}, "model": {"name": "resnet_tiny", "options": options}})
    assert all(word in line for word in words) and "Fix:" in line, line


def test_options_of_another_model_are_refused():
    (line,) = problems_of({"run": {"name": "t"}, "model": {"name": "gpt", "options": {"width": 8}}})
    assert line.startswith("model.options.width: unknown key") and "layers, dim, heads" in line


@pytest.mark.parametrize("options, words", [
    ("{widht: 8}", ["model.options.widht (from --set): unknown key", "'model.options.width'"]),
    ('{width: "eight"}', ["model.options.width (from --set): 'eight'", "a whole number"]),
])
def test_validate_refuses_a_misspelt_or_mistyped_model_option(options, words):
    out = run_cli("validate", "jobs/smoke.yaml", "--set", f"model.options={options}")
    assert out.returncode == 2 and out.stderr.startswith("error: ") and out.stdout == ""
    assert all(word in out.stderr for word in words), out.stderr


# --- data.vocab_size and its deprecated alias data.num_classes --------------------------------

TOKEN_SPEC = {"run": {"name": "t"}, "data": {"kind": "text"}, "model": {"name": "gpt"}}


def _token_spec(**data) -> dict:
    return {**TOKEN_SPEC, "data": {**TOKEN_SPEC["data"], **data}}


def test_num_classes_of_token_data_is_read_as_vocab_size_with_a_warning():
    loaded, errors, warnings = build_spec(_token_spec(num_classes=256))
    assert errors == [] and loaded == spec_from_dict(_token_spec(vocab_size=256))
    (warning,) = map(str, warnings)
    assert warning.startswith("data.num_classes: 256 with data.kind 'text': deprecated")
    assert "rename it to data.vocab_size" in warning


def test_a_dumped_token_spec_reloads_without_warnings(tmp_path):
    original = spec_from_dict(_token_spec(num_classes=256))
    reloaded, warnings = validate_spec_file(write(tmp_path, dump_spec_yaml(original)))
    assert reloaded == original and warnings == []


def test_stage_to_is_read_as_copy_to_with_a_warning_and_errors_name_both_keys():
    spec = {"run": {"name": "t"}, "data": {"kind": "hdf5", "path": "/d", "stage_to": "$SLURM_TMPDIR"}}
    loaded, errors, warnings = build_spec(spec)
    assert errors == [] and loaded.data.copy_to == "$SLURM_TMPDIR"
    (warning,) = map(str, warnings)
    assert warning.startswith("data.stage_to: ") and "rename it to data.copy_to" in warning
    _, errors, _ = build_spec({**spec, "data": {**spec["data"], "stage_to": "relative"}})
    assert [e.key for e in errors] == ["data.copy_to (written as data.stage_to)"]


def test_num_classes_of_image_data_is_no_alias():
    loaded, _, warnings = build_spec({"run": {"name": "t"}, "data": {"num_classes": 10}})
    assert (loaded.data.num_classes, loaded.data.vocab_size, warnings) == (10, 256, [])


def test_validate_warns_about_num_classes_of_token_data_and_passes(tmp_path):
    old_style = (REPO / "jobs/transformer_pipeline_cpu.yaml").read_text().replace(
        "  vocab_size: 256 ", "  num_classes: 256")
    out = run_cli("validate", str(write(tmp_path, old_style)))
    assert out.returncode == 0, out.stderr
    assert out.stderr.startswith("warning: data.num_classes: 256 with data.kind 'text'")


# --- the CLI and the corpus of wrong specs ----------------------------------------------------

def test_validate_prints_summary_and_warnings():
    out = run_cli("validate", "jobs/smoke.yaml", "--set", "optim.epochs=1")
    assert out.returncode == 0, out.stderr
    assert "world size:   2 = 1 node(s) x 2 task(s)" in out.stdout
    assert "samples/step: 64" in out.stdout and "scaled LR:    0.1" in out.stdout
    # No warning; where no Slurm answers, a note says the nodes went unchecked (not a warning).
    assert [line for line in out.stderr.splitlines() if not line.startswith("note: nodes ")] == []
    out = run_cli("validate", "jobs/smoke.yaml", "--set", "optim.warmup_epochs=3")
    assert out.returncode == 0 and out.stderr.startswith("warning: optim.warmup_epochs: 3")


def test_corpus_is_big_enough():
    assert len(BAD_SPECS) >= 25


# In process (cli.main, what `python -m hpc_train` calls): the same checks and exit status
# without an interpreter per spec; test_validate_prints_summary_and_warnings runs the real command.
@pytest.mark.parametrize("path", BAD_SPECS, ids=lambda p: p.stem)
def test_bad_spec_is_refused_with_a_precise_line(path, monkeypatch, capsys):
    first_line = path.read_text().splitlines()[0]
    assert first_line.startswith("# expect: "), "each bad spec starts with '# expect: ...'"
    expected = first_line.removeprefix("# expect: ")
    monkeypatch.chdir(REPO)
    code = cli_main(["validate", str(path.relative_to(REPO))])
    out = capsys.readouterr()
    assert code == 2, out.out + out.err
    assert expected in out.err
    assert out.err.startswith("error: ")
    assert all("Fix: " in line for line in out.err.splitlines())


# A value ending in a newline passed `re.match(...$)`, then broke an sbatch line or a path.
TRAILING_NEWLINE = {
    "run.name": 'run:\n  name: "smoke\\n"\n',
    "slurm.partition": 'run: {name: t}\nslurm:\n  partition: "gpu\\n"\n',
    "slurm.account": 'run: {name: t}\nslurm:\n  account: "proj\\n"\n',
    "slurm.qos": 'run: {name: t}\nslurm:\n  qos: "high\\n"\n',
    "slurm.constraint": 'run: {name: t}\nslurm:\n  constraint: "a100\\n"\n',
    "slurm.mem": 'run: {name: t}\nslurm:\n  mem: "2G\\n"\n',
    "slurm.time": 'run: {name: t}\nslurm:\n  time: "00:10:00\\n"\n',
    "slurm.extra.": 'run: {name: t}\nslurm:\n  extra:\n    "exclusive\\n": ""\n',
    "launch.env.": 'run: {name: t}\nlaunch:\n  env:\n    "OMP_NUM_THREADS\\n": "1"\n',
}


@pytest.mark.parametrize("key", list(TRAILING_NEWLINE))
def test_a_trailing_newline_is_refused(key, tmp_path, capsys):
    from hpc_train.cli import main

    path = write(tmp_path, TRAILING_NEWLINE[key])
    assert "\\n\"" in path.read_text()           # a quoted "\n" in the file, read by YAML as a newline
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {key}") and len(err.splitlines()) == 1 and "Fix: " in err, err


def test_spec_package_stays_light_and_assert_free():
    code = ("import sys, hpc_train.spec; "
            "print([m for m in ('torch', 'horovod', 'h5py') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stderr
    for source in (REPO / "hpc_train" / "spec").glob("*.py"):
        assert "assert " not in source.read_text(), f"{source.name}: never assert user input"


@pytest.mark.parametrize("job", sorted((REPO / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_job_spec_is_valid_without_warnings(job):
    from hpc_train.spec import validate_spec_file

    spec, warnings = validate_spec_file(job)
    assert spec.run.name and not warnings, [str(w) for w in warnings]
