"""Submitting a planned workflow to Slurm: every stage at once, each waiting for the ones before
it through Slurm's own dependencies; then `workflow run` returns and Slurm carries it on.

A stage's jobs wait with `--dependency=afterok:<ids>` (every task of an array for an array id),
`afterany` for `after_any`, and `--kill-on-invalid-dep=yes`, so a failure cancels everything
after it. Train stages go through the project's own submit path (slurm/submit.py, a sweep as one
array: slurm/array.py), so requeue and resume work as for a plain `submit`, and a requeued job
keeps its id: the dependencies hold. If a submission fails midway, the jobs already submitted are
cancelled and recorded; `workflow resume` submits the workflow again from where it stands.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpc_train import scheduler
from hpc_train.errors import HpcTrainError, SpecError, SubmitError
from hpc_train.rundir import RunPaths
from hpc_train.slurm.array import member_job, submit_array
from hpc_train.slurm.resume import prepare_resume, resume_run
from hpc_train.slurm.submit import submit
from hpc_train.spec import dump_spec_yaml
from hpc_train.workflow import events
from hpc_train.workflow.paths import WorkflowPaths, link
from hpc_train.workflow.plan import Plan, StagePlan
from hpc_train.workflow.script import dependency, dependency_options, render


@dataclass
class Submitted:
    jobs: dict[str, str]                       # part -> job id
    members: dict[int, str] = field(default_factory=dict)

    @property
    def last(self) -> str:
        """The job later stages wait for: the stage's last (a manifest job, a sweep's array)."""
        return list(self.jobs.values())[-1]


@dataclass
class Again:
    """What a resubmission (resume) of a stage needs: job spec overrides for its runs, consent to
    a changed spec, and the sweep members to run again."""
    overrides: list[str] = field(default_factory=list)
    allow_spec_change: bool = False
    members: list[int] | None = None


def stage_dependency(plan: Plan, name: str, waiting_on: dict[str, str]) -> str | None:
    """The --dependency of a stage: the last job of every stage it needs that is still to run
    (`waiting_on`); stages already complete need no waiting."""
    stage = plan.workflow.stages[name]
    return dependency([waiting_on[s] for s in stage.after if s in waiting_on],
                      [waiting_on[s] for s in stage.after_any if s in waiting_on])


def _script_jobs(plan: Plan, stage: StagePlan, first_dependency: str | None) -> Submitted:
    paths = plan.paths
    paths.stage_dir(stage.name).mkdir(parents=True, exist_ok=True)
    for old in paths.stage_dir(stage.name).glob("COMPLETE*"):
        old.unlink()                   # a rerun's outputs count only once it succeeds again
    jobs: dict[str, str] = {}
    value = first_dependency
    for job in stage.jobs:
        script = paths.script(stage.name, None if job.part == "main" else job.part)
        script.write_text(render(job, value))
        jobs[job.part] = scheduler.submit([str(script)], str(script))
        value = f"afterok:{jobs[job.part]}"      # the manifest job waits for the converters
    return Submitted(jobs)


def _train(plan: Plan, stage: StagePlan, value: str | None, again: Again | None) -> Submitted:
    train = stage.train
    options = dependency_options(value)
    if stage.sweep is None:
        paths = RunPaths(train.run_dirs[0])
        link(plan.paths.run_link(stage.name), paths.root)
        if again is None or not paths.spec.is_file():      # first submitted now
            paths.spec.write_text(dump_spec_yaml(train.specs[0]))
            result = submit(train.specs[0], use_slurm=True, paths=paths, options=options)
        else:
            result = resume_run(paths.root, again.overrides, again.allow_spec_change, use_slurm=True,
                                options=options)
        return Submitted({"train": result.job_id})
    chosen = sorted(train.specs) if again is None or again.members is None else again.members
    specs = {}
    for index in chosen:
        paths = RunPaths(train.run_dirs[index])
        link(plan.paths.member_link(stage.name, index), paths.root)
        if again is None or not paths.spec.is_file():
            paths.spec.write_text(dump_spec_yaml(train.specs[index]))
            specs[index] = train.specs[index]
        else:
            specs[index] = prepare_resume(paths, again.overrides, again.allow_spec_change)
    result = submit_array(specs, train.prefix, stage.sweep.parallelism, options=options,
                          again=again is not None)
    return Submitted({"sweep": result.job_id}, {i: member_job(result.job_id, i) for i in specs})


def submit_stage(plan: Plan, name: str, waiting_on: dict[str, str],
                 again: Again | None = None) -> Submitted:
    stage = plan.stages[name]
    value = stage_dependency(plan, name, waiting_on)
    done = _train(plan, stage, value, again) if stage.kind == "train" else \
        _script_jobs(plan, stage, value)
    events.record(plan.paths, events.stage_submitted(name, done.jobs, done.members, again is not None))
    return done


def submit_stages(plan: Plan, names: list[str], waiting_on: dict[str, str],
                  again: dict[str, Again] | None = None) -> dict[str, Submitted]:
    """Submit `names` in order; each waits for the stages in `waiting_on` (stage -> last job id,
    still to run) and for those submitted here. On a failure, cancels what this call submitted,
    records it, and raises SubmitError naming the stage."""
    waiting_on = dict(waiting_on)
    done: dict[str, Submitted] = {}
    for name in names:
        try:
            done[name] = submit_stage(plan, name, waiting_on, (again or {}).get(name))
        except KeyboardInterrupt:
            _failed(plan.paths, name, SubmitError("interrupted (Ctrl-C)"), done)
            raise
        except Exception as exc:  # noqa: BLE001 - sbatch, submitit, a full disk: all end here
            error = exc if isinstance(exc, HpcTrainError) else SubmitError(f"{type(exc).__name__}: {exc}")
            raise _failed(plan.paths, name, error, done) from exc
        waiting_on[name] = done[name].last
    return done


def _failed(paths: WorkflowPaths, name: str, exc: HpcTrainError,
            done: dict[str, Submitted]) -> HpcTrainError:
    submitted = [job for s in done.values() for job in s.jobs.values()]
    error = scheduler.cancel(submitted)
    events.record(paths, events.submission_failed(name, str(exc), submitted, error))
    if submitted and error is None:
        what = f"the jobs submitted before it were cancelled ({', '.join(submitted)})"
    elif submitted:
        what = (f"cancelling the jobs submitted before it failed too ({error}): cancel "
                f"{' '.join(submitted)} yourself (`scancel`)")
    else:
        what = "nothing had been submitted"
    # The same kind of error (a refused spec change stays exit 2), with what became of the rest.
    kind = SpecError if isinstance(exc, SpecError) else SubmitError
    return kind(f"stage {name}: {exc}\n{what}; the workflow directory {paths.root} records "
                f"it. Fix the cause, then `python -m hpc_train workflow resume {paths.root}`")
