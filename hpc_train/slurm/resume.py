"""`resume RUN_DIR`: submit a finished, failed or stopped run again; it continues from its latest
complete checkpoint (the ranks find it), in the same run directory.

It imports the code the run was submitted with (its `code` link, slurm/snapshot.py) unless told
otherwise: the checkpoints were written by that code, and a fix picked up by accident is as
much a change of the run as an edit of its spec. `--new-snapshot` takes the current source on
purpose, `--no-snapshot` runs the installed package; a run submitted without a snapshot keeps
running the installed package.

One writer per run directory: a run whose job Slurm still holds (pending, running, requeued)
is refused, since a second job would train into the same checkpoints and logs.

Another world size is a change of spec like any other (`--allow-spec-change`), but for another
node count within slurm.nodes' range (which the job may start on anyway); the ranks go on from
the checkpoint's position in samples. `resume` says what it does to the global batch, and
keeps it where `parallel.keep_global_batch` asks (spec/global_batch.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from hpc_train import events, run_state, scheduler
from hpc_train.errors import SpecError, SubmitError
from hpc_train.rundir import RunPaths
from hpc_train.slurm.options import Options
from hpc_train.slurm.run_code import CODE_KEEP
from hpc_train.slurm.submit import Submission, submit
from hpc_train.spec import JobSpec, dump_spec_yaml, load_spec, spec_hash, spec_to_dict
from hpc_train.spec.diff import changed_keys
from hpc_train.spec.global_batch import GlobalBatch, describe_change, keeping, refits


def resume_run(run_dir: str | Path, overrides: list[str], allow_spec_change: bool,
               use_slurm: bool | None = None, code: str = CODE_KEEP,
               options: Options | None = None) -> Submission:
    """code: which code the job imports (slurm/run_code.py); options: sbatch options of this
    submission only (a workflow's --dependency)."""
    paths = RunPaths(Path(run_dir).resolve())
    spec = prepare_resume(paths, overrides, allow_spec_change)
    result = submit(spec, use_slurm=use_slurm, paths=paths, code=code, options=options)
    events.record(paths, events.resubmitted(result.job_id, result.executor))
    return result


def prepare_resume(paths: RunPaths, overrides: list[str], allow_spec_change: bool) -> JobSpec:
    """The spec to submit `paths` again with: refused while its job is active; a spec changed by
    `overrides` needs `allow_spec_change` (but another node count of its range: `refits`), and
    is then saved with its record of consent. A sweep member is resubmitted this way too, in an
    array of its own (slurm/array.py)."""
    if not paths.spec.is_file():
        raise SpecError(f"{paths.root} is not a run directory: it has no {paths.spec.name}")
    refuse_if_active(paths)
    saved = load_spec(paths.spec)
    spec = load_spec(paths.spec, overrides)
    last = last_global_batch(paths, saved)
    if kept := keeping(spec, last):
        spec = load_spec(paths.spec, [*overrides, *kept])
    if change := describe_change(last, spec):
        print(f"resume: {change}", file=sys.stderr)
    changed = changed_keys(spec_to_dict(saved), spec_to_dict(spec))
    if changed:
        if not allow_spec_change and not refits(saved, spec):
            raise SpecError(f"--set changes {', '.join(changed)} of {paths.root}; the checkpoints "
                            "were made under the old values. Fix: add --allow-spec-change to accept")
        # The ranks accept a checkpoint of another spec only with this consent, so it is written
        # first; the event also serves the ranks of a code snapshot older than the run state.
        run_state.update(paths, lambda state: state.with_consent(spec_hash(saved), spec_hash(spec)))
        paths.spec.write_text(dump_spec_yaml(spec))
        events.record(paths, events.spec_change_allowed(spec_hash(saved), spec_hash(spec), changed))
    return spec


def last_global_batch(paths: RunPaths, saved: JobSpec) -> GlobalBatch:
    """The ranks and samples per step of the last checkpoint (the run state's record of it), or
    of the saved spec for a run without that record."""
    save = run_state.read(paths).last_save or {}
    if save.get("samples_per_step"):
        return GlobalBatch(save["world_size"], save["samples_per_step"])
    return GlobalBatch(saved.world_size, saved.samples_per_step)


def refuse_if_active(paths: RunPaths) -> None:
    """Raise when the run's last Slurm job is still queued or running, or when that cannot be
    told (Slurm does not answer): starting a second writer is the one thing not to risk."""
    submission = events.last_submission(events.read(paths))
    if submission is None or submission[1] != "slurm":
        return
    job_id = submission[0]
    jobs = scheduler.queue([job_id])
    if jobs is None:
        raise SubmitError(f"cannot tell whether job {job_id} of {paths.root} is still in the queue "
                          "(squeue did not answer); resume refused so that two jobs never train "
                          "one run. Fix: retry when Slurm answers")
    if jobs and jobs[0].state is scheduler.JobState.COMPLETING:
        # Ending, but its processes may still write (a checkpoint, the events) for KillWait.
        raise SubmitError(f"job {job_id} of {paths.root} is COMPLETING: its processes are still "
                          "ending. Resume refused (two jobs would write one run). Fix: resume once "
                          f"it has left the queue (`squeue -j {job_id}`), seconds from now")
    if jobs and (jobs[0].state.active or jobs[0].state is scheduler.JobState.UNKNOWN):
        raise SubmitError(f"job {job_id} of {paths.root} is {jobs[0].label}: it will continue the run "
                          f"itself. Resume refused (two jobs would write one run). Fix: wait for "
                          f"it, or `scancel {job_id}` first, then resume")
