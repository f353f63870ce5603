"""Typed, strictly validated job specs (login-node code: no torch, horovod or h5py here).

    spec = load_spec("jobs/smoke.yaml", overrides=["optim.base_lr=0.2"])
    spec, warnings = validate_spec_file(path, overrides)
    errors, warnings = check_spec(spec)
"""

from hpc_train.spec.load import build_spec, load_spec, spec_from_dict, validate_spec_file
from hpc_train.spec.problems import Problem, SpecInvalid
from hpc_train.spec.rules import check_spec
from hpc_train.spec.schema import (CheckpointSpec, DataSpec, JobSpec, LaunchSpec, LogSpec,
                                   ModelSpec, OptimSpec, ParallelSpec, PrecisionSpec, Resources,
                                   RunSpec, SlurmSpec)
from hpc_train.spec.serialize import describe_spec, dump_spec_yaml, spec_hash, spec_to_dict
from hpc_train.spec.values import slurm_time_seconds

__all__ = [
    "load_spec", "validate_spec_file", "spec_from_dict", "build_spec", "check_spec",
    "spec_to_dict", "spec_hash", "dump_spec_yaml", "describe_spec", "slurm_time_seconds", "Problem", "SpecInvalid",
    "JobSpec", "RunSpec", "SlurmSpec", "Resources", "LaunchSpec", "DataSpec", "ModelSpec", "OptimSpec",
    "PrecisionSpec", "ParallelSpec", "CheckpointSpec", "LogSpec",
]
