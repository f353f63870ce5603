"""Turning a spec and an allocation into the mpirun command line (pure functions)."""
