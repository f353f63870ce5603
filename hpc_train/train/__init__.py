"""Rank-side training pieces: LR schedule (pure), mixed precision, and the loop that uses them.

Submodules import torch; import them explicitly (`from hpc_train.train.schedule import ...`).
This file stays empty of imports so the login node never pays for torch by accident.
"""
