"""GPipe-style pipeline parallelism composed with data parallelism.

Pure parts: `balance` (where to cut the block list); which rank is which stage of which replica
is `hpc_train.parallel.layout`. Torch parts: `stage` (a rank's slice of the model), `scaler` (a
loss scale all ranks agree on), `replicas` (gradient averaging across replicas), `engine` (one
pipeline step).
"""
