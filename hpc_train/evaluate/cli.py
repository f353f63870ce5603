"""`python -m hpc_train evaluate RUN_DIR ...` (light imports: torch loads in the handler)."""

from __future__ import annotations

import argparse
import json

from hpc_train.argtypes import add_command, positive_int


def _evaluate(args: argparse.Namespace) -> int:
    from hpc_train.evaluate.report import render_text
    from hpc_train.evaluate.run import Request, evaluate_run

    done = evaluate_run(Request(args.run_dir, args.checkpoint, args.data, args.split, args.backend))
    if done is not None:             # rank 0 reports; the other ranks stay quiet
        report, path = done
        print(json.dumps(report, indent=1) if args.json else render_text(report, path))
    return 0


def register(commands) -> None:
    parser = add_command(
        commands, "evaluate", _evaluate, help="evaluate a run's checkpoint: top-1/top-5, loss, per class, images/s",
        description="Load RUN_DIR's checkpoint (default: the latest complete one) with the run's "
                    "own spec and evaluate it on a split of its data, in one process or over the "
                    "ranks of mpirun/srun. On the checkpoint that the trainer evaluated last it "
                    "gives the trainer's val accuracy. Writes RUN_DIR/eval-<split>-<step>.json. "
                    "Image models only (gpt runs are refused).")
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument("--checkpoint", type=positive_int, metavar="STEP",
                        help="the checkpoint's step (default: the latest complete)")
    parser.add_argument("--data", metavar="SHARDS",
                        help="another shard directory (as `data shard --out`) with the run's "
                        "classes (default: the run's data.path)")
    parser.add_argument("--split", default="val", help="split to evaluate (default val)")
    parser.add_argument("--backend", choices=("horovod", "ddp"),
                        help="collectives between ranks (default: the run's parallel.backend)")
    parser.add_argument("--json", action="store_true", help="print the document, not the summary")
