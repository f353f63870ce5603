"""Errors the CLI knows how to report: one line on stderr, a fixed exit status, no traceback."""


class HpcTrainError(Exception):
    """Base class; `exit_code` is what the CLI exits with."""

    exit_code = 1


class SpecError(HpcTrainError):
    """A job spec is wrong. Exit 2 and nothing is submitted."""

    exit_code = 2


class SlurmUnavailable(HpcTrainError):
    """sbatch exists but no controller answers: nothing is created or submitted."""

    exit_code = 2


class UsageError(HpcTrainError):
    """A command's argument names something that is not there or does not fit (a run directory,
    a checkpoint step, a data path). Exit 2 and nothing is written."""

    exit_code = 2


class SubmitError(HpcTrainError):
    exit_code = 3


class LaunchError(HpcTrainError):
    exit_code = 4


class CheckpointError(HpcTrainError):
    exit_code = 5


class CheckpointMismatch(CheckpointError):
    """A checkpoint that loads but was made for another job (spec, stage cut): every checkpoint
    of the run has the same mismatch, so resuming from an older one is no way out."""


class DataError(HpcTrainError):
    exit_code = 6


class InspectError(HpcTrainError):
    """An inspection command cannot answer: no such run directory, rank or run."""

    exit_code = 7


class WaitTimeout(HpcTrainError, TimeoutError):
    """A wait for a run to end ran past its bound; the run goes on. `status` is its last status
    (the API's Run.wait), so a caller can tell how far it got."""

    exit_code = 8

    def __init__(self, message: str, status=None):
        super().__init__(message)
        self.status = status
