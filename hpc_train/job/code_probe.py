"""`validate --import`: import the user's code a spec names and build it, in a process of its own.

The login-node check (spec/code_refs.py) only finds the modules by file name. This one imports
them, as a rank will: the model is built on the meta device (no memory, no weights: its
parameter count only), the dataset's splits are built and their lengths read, the optimizer's
callable is fetched. It runs in a subprocess (`probe` below) so that the user's imports and
whatever they do cannot touch the validating process, and is bounded in time.
Usage: python -m hpc_train.job.code_probe SPEC_FILE [KEY=VALUE ...]; prints one line per
reference, or the failure with the user's traceback, and exits 1 on a failure.
"""

from __future__ import annotations

import subprocess
import sys
import traceback
from pathlib import Path

PROBE_TIMEOUT = 300.0    # seconds: a dataset that scans a large folder takes a while


def probe(spec_file: str, overrides: list[str], submit_dir: Path,
          timeout: float = PROBE_TIMEOUT) -> tuple[bool, str]:
    """(all built, what the probe printed) from a subprocess run in `submit_dir`."""
    argv = [sys.executable, "-m", "hpc_train.job.code_probe", spec_file, *overrides]
    try:
        out = subprocess.run(argv, cwd=submit_dir, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"the import check did not finish within {timeout:.0f} s"
    return out.returncode == 0, (out.stdout + out.stderr).strip()


def _lines(spec) -> list[str]:
    import torch

    from hpc_train.models import build_model
    from hpc_train.models.blocks import block_list, describe
    from hpc_train.spec.code_refs import named_code
    from hpc_train.train.data import own_dataset
    from hpc_train.usercode import load, load_step

    lines = []
    model = None
    for key, text in named_code(spec):
        if key == "model.name":
            with torch.device("meta"):
                model = build_model(text, spec.data.num_classes, spec.model.options)
            count = sum(p.numel() for p in model.parameters())
            lines.append(f"{key} {text}: {type(model).__name__}, {count:,} parameters")
            if spec.uses_pipeline and spec.model.blocks is None:
                # The stages cut the model's own children: it must be an nn.Sequential.
                lines.append(f"pipeline: {describe(block_list(text, model, None))}")
        elif key == "model.blocks":
            lines.append(f"{key} {text}: {describe(block_list(spec.model.name, model, text))}")
        elif key == "data.dataset":
            sizes = []
            for split in ("train", "val"):
                dataset = own_dataset(spec, split)
                sizes.append(f"{split} {len(dataset):,} samples" if dataset is not None
                             else f"no {split} split")
            lines.append(f"{key} {text}: {', '.join(sizes)}")
        elif key.startswith("task."):
            lines.append(f"{key} {text}: {load_step(text, key).__name__}(model, batch) imports")
        else:
            lines.append(f"{key} {text}: {load(text).__name__} imports")
    return lines


def main(argv: list[str]) -> int:
    from hpc_train.spec import load_spec
    from hpc_train.usercode import UserCodeError

    spec = load_spec(argv[0], argv[1:])
    sys.path[:0] = [str(Path.cwd()), *spec.run.code]      # as on a rank, without a snapshot
    try:
        lines = _lines(spec)
    except UserCodeError as exc:
        # Ours, about the user's code (a wrong signature, no blocks): one line; with the
        # user's own exception as its cause, their traceback first.
        if exc.__cause__ is not None:
            print(traceback.format_exc().rstrip(), file=sys.stderr)
        else:
            print(exc, file=sys.stderr)
        return 1
    except Exception:  # noqa: BLE001 - the user's failure, with their traceback, is the answer
        print(traceback.format_exc().rstrip(), file=sys.stderr)
        return 1
    print("\n".join(lines) or "the spec names none of your code")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
