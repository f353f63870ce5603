"""A rank program for tests/bench/test_bench_ranks.py: `serve`s run_here with what the settings ask."""

import os
import sys
import time
from pathlib import Path

from hpc_train.bench.ranks import serve


def measure(settings: dict, identity, heartbeat) -> dict:
    if settings["do"] == "fail" and identity.rank == 1:
        sys.exit(3)
    if settings["do"] == "hang":
        if "pids" in settings:         # where the test looks for ranks left running
            Path(settings["pids"], f"rank-{identity.rank}.pid").write_text(str(os.getpid()))
        time.sleep(120)
    return {"rank": identity.rank, "size": identity.size, "port": os.environ["MASTER_PORT"]}


if __name__ == "__main__":
    serve(measure)
