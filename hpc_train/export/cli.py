"""`python -m hpc_train export RUN_DIR -o FILE ...` (light imports: torch loads in the handler)."""

from __future__ import annotations

import argparse

from hpc_train.argtypes import add_command, positive_int


def _export(args: argparse.Namespace) -> int:
    from hpc_train.export.write import export_run

    done = export_run(args.run_dir, args.output, args.checkpoint, args.format)
    meta = done.meta
    what = (f"{meta['num_classes']} classes, input {'x'.join(map(str, meta['input_size']))}"
            if meta["task"] == "classification" else f"task {meta['task']}")
    print(f"wrote {done.path}: {meta['model']} ({what}) from step {done.step}, {args.format}")
    return 0


def register(commands) -> None:
    parser = add_command(
        commands, "export", _export, help="write a run's weights (the model's own names) and metadata to one file",
        description="Write RUN_DIR's checkpoint (default: the latest complete one) as FILE: "
                    "{'state_dict': weights with the model's own names (torchvision's for "
                    "resnet*), 'meta': model (your reference for your own), options, task, class "
                    "names, input size, mean/std, spec hash, step}, readable with "
                    "torch.load(FILE, weights_only=True); or TorchScript (--format torchscript). "
                    "Rebuild it with hpc_train.export.load_exported(FILE). The image models and "
                    "your own (pipeline stages of it included); not gpt or DeepSpeed runs.")
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="file to write")
    parser.add_argument("--checkpoint", type=positive_int, metavar="STEP",
                        help="the checkpoint's step (default: the latest complete)")
    parser.add_argument("--format", choices=("state_dict", "torchscript"), default="state_dict",
                        help="state_dict (default) or torchscript")
