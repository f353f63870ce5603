"""`python -m hpc_train export RUN_DIR -o model.pt`: a run's weights for use outside hpc_train.

meta.py describes the model (pure), write.py writes the file (a plain dict that
`torch.load(path, weights_only=True)` reads, or TorchScript), load.py rebuilds the model:

    from hpc_train.export import load_exported
    model, meta = load_exported("model.pt")
"""

from __future__ import annotations


def load_exported(path, map_location="cpu"):
    """(model in eval mode, metadata dict) of a file `export` wrote, either format."""
    from hpc_train.export.load import load_exported as load   # torch only when called

    return load(path, map_location)
