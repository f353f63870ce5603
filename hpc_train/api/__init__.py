"""The Python API: submit a job spec, follow its run, cancel or resume it (login-node code).

    import hpc_train
    run = hpc_train.submit("jobs/smoke.yaml", ["optim.epochs=1"])
    final = run.wait(timeout=600)            # a RunStatus; WaitTimeout past the bound
    run.metrics(), run.logs(0), run.cancel(), run.resume()
    hpc_train.open_run("runs/smoke-...") or hpc_train.open_run("123", root="runs")

Light on import, like every login-node module: nothing here imports torch, horovod or h5py.
"""

from hpc_train.api.run import Run, open_run
from hpc_train.api.submission import resume, submit
from hpc_train.errors import WaitTimeout
from hpc_train.inspection.summary import RunStatus

__all__ = ["submit", "resume", "open_run", "Run", "RunStatus", "WaitTimeout"]
