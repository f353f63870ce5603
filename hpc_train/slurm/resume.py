"""`resume RUN_DIR`: submit a finished, failed or stopped run again; it continues from its latest
complete checkpoint (the ranks find it), in the same run directory.
"""

from __future__ import annotations

from pathlib import Path

from hpc_train.errors import SpecError
from hpc_train.rundir import RunPaths, record_event
from hpc_train.slurm.submit import Submission, submit
from hpc_train.spec import dump_spec_yaml, load_spec, spec_hash, spec_to_dict
from hpc_train.spec.diff import changed_keys


def resume_run(run_dir: str | Path, overrides: list[str], allow_spec_change: bool,
               use_slurm: bool | None = None) -> Submission:
    paths = RunPaths(Path(run_dir).resolve())
    if not paths.spec.is_file():
        raise SpecError(f"{paths.root} is not a run directory: it has no spec.yaml")
    saved = load_spec(paths.spec)
    spec = load_spec(paths.spec, overrides)
    changed = changed_keys(spec_to_dict(saved), spec_to_dict(spec))
    if changed:
        if not allow_spec_change:
            raise SpecError(f"--set changes {', '.join(changed)} of {paths.root}; the checkpoints "
                            "were made under the old values. Fix: add --allow-spec-change to accept")
        paths.spec.write_text(dump_spec_yaml(spec))
        # The ranks accept a checkpoint of another spec only with this record of consent.
        record_event(paths, "spec_change_allowed", from_hash=spec_hash(saved), to_hash=spec_hash(spec),
                     keys=changed)
    result = submit(spec, use_slurm=use_slurm, paths=paths)
    record_event(paths, "resubmitted", job_id=result.job_id)
    return result
