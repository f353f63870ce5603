"""Barrier + allreduce under mpirun; rank 0 prints one JSON line (run by the doctor).

Uses mpi4py, not Horovod: this checks the launcher and the MPI library on their own, so a failure
here points at MPI, and a failure only in the Horovod test points at Horovod.
"""

import json
import statistics
import time

from mpi4py import MPI

ITERATIONS = 200

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
comm.Barrier()
total = comm.allreduce(rank + 1, op=MPI.SUM)
correct = total == size * (size + 1) // 2
times = []
for _ in range(ITERATIONS):
    start = time.perf_counter()
    comm.allreduce(1.0, op=MPI.SUM)
    times.append(time.perf_counter() - start)
correct = comm.allreduce(int(correct), op=MPI.MIN) == 1
if rank == 0:
    print(json.dumps({"size": size, "allreduce_correct": correct,
                      "allreduce_us": statistics.median(times) * 1e6, "iterations": ITERATIONS}))
