"""`python -m hpc_train data ...`: shard, verify, info, demo (light imports only).

Handlers import h5py, Pillow and numpy themselves, so `--help` and the rest of the CLI start fast.
"""

from __future__ import annotations

import argparse
import sys

from hpc_train.argtypes import add_command, positive_int, print_result


def _shard(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hpc_train.data.convert import ConvertOptions, convert

    opts = ConvertOptions(
        src=Path(args.src), out=Path(args.out), split=args.split,
        labels=Path(args.labels) if args.labels else None,
        classes=Path(args.classes) if args.classes else None,
        shard_size=args.shard_size, encoding=args.encoding, max_side=args.max_side,
        quality=args.quality, raw_size=args.raw_size, restart_interval=args.restart_interval,
        seed=args.seed, strict=args.strict,
        task_index=args.task_index, task_count=args.task_count)
    convert(opts)
    return 0


def _verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hpc_train.data.manifest import find_split_dirs
    from hpc_train.data.verify import verify_split
    from hpc_train.errors import DataError

    all_problems = []
    for split_dir in find_split_dirs(Path(args.dir), args.split):
        manifest, problems = verify_split(split_dir)
        if problems:
            for problem in problems:
                print(f"problem: {problem}", file=sys.stderr)
        else:
            print(f"{split_dir}: OK ({len(manifest['shards'])} shards, "
                  f"{manifest['num_samples']} samples checked)")
        all_problems += problems
    if all_problems:
        raise DataError(f"verify found {len(all_problems)} problem(s) in {args.dir}; first: "
                        f"{all_problems[0]}")
    return 0


def _info(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from hpc_train.data.manifest import find_split_dirs
    from hpc_train.data.verify import print_rich_info, render_info, split_info

    rows = [split_info(d) for d in find_split_dirs(Path(args.dir), args.split)]
    print_result(args.json, json.dumps(rows, indent=1), lambda: print_rich_info(rows, title=str(args.dir)),
                 lambda: render_info(rows))
    return 0


def _demo(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from hpc_train.data.demo import write_demo

    start = time.monotonic()
    s = write_demo(Path(args.out), args.classes, args.per_class, args.val_per_class, args.size,
                   args.seed, args.photo)
    print(f"wrote {s.train_files} train images in {len(s.classes)} class folders under "
          f"{s.root / 'train'}, {s.val_files} val images in {s.root / 'val'} with labels in "
          f"{s.root / 'val_labels.txt'} ({time.monotonic() - start:.1f} s)")
    print(f"next: python -m hpc_train data shard --src {s.root / 'train'} --out OUT && "
          f"python -m hpc_train data shard --src {s.root / 'val'} --labels "
          f"{s.root / 'val_labels.txt'} --classes OUT/train/manifest.json --split val --out OUT")
    return 0


def _tokenize(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hpc_train.data.tokens import generate_corpus, tokenize_to_shards
    from hpc_train.errors import DataError

    if bool(args.files) == bool(args.generate):
        raise DataError("give text FILES to tokenize, or --generate BYTES for a generated corpus")
    if not 0 <= args.val_fraction < 1:
        raise DataError(f"--val-fraction {args.val_fraction} must be >= 0 and < 1 (e.g. 0.05)")
    if args.generate:
        data = generate_corpus(args.generate, args.seed)
    else:
        try:   # files are read as bytes, in the order given: byte tokens need no decoding
            data = b"".join(Path(f).read_bytes() for f in args.files)
        except OSError as exc:
            raise DataError(f"cannot read {exc.filename}: {exc.strerror}") from None
    splits = tokenize_to_shards(data, Path(args.out), args.val_fraction, args.shard_tokens)
    for name, manifest in splits.items():
        if manifest:
            print(f"{name}: {manifest['num_tokens']} tokens in {len(manifest['shards'])} shard(s) "
                  f"under {Path(args.out) / name}")
    print(f"train on it with data.kind: tokens, data.path: {args.out} (data.vocab_size: 256, bytes)")
    return 0


def _text(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hpc_train.data.tokens import write_text_splits

    written = write_text_splits(Path(args.out), args.bytes, args.val_bytes, args.seed)
    for path in written:
        print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    print(f"read them with your own dataset (data.kind: dataset), e.g. jobs/hf_lm.yaml's "
          f"data.options.root: {args.out}")
    return 0


def _add_text(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "text", _text, help="write the generated English-like corpus as text files",
                    description="OUT/train.txt and OUT/val.txt: the sentences data.kind text "
                                "generates in memory (validation from the next seed), as plain "
                                "files for a dataset of your own to read; deterministic from --seed.")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--bytes", type=positive_int, default=1 << 16, metavar="N",
                   help="bytes of train.txt (default 65536)")
    p.add_argument("--val-bytes", type=int, default=1 << 13, metavar="N",
                   help="bytes of val.txt; 0 writes none (default 8192)")
    p.add_argument("--seed", type=int, default=0, help="corpus seed (default 0)")


def _add_tokenize(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "tokenize", _tokenize, help="write byte-token HDF5 shards for the gpt model",
                    description="Bytes of the given text files (or a generated English-like "
                                   "corpus) into OUT/train and OUT/val token shards.")
    p.add_argument("files", nargs="*", metavar="FILE", help="text files, concatenated in order")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--generate", type=positive_int, default=None, metavar="BYTES",
                   help="instead of files: a generated corpus of this many bytes")
    p.add_argument("--val-fraction", type=float, default=0.05, metavar="F",
                   help="the last F of the bytes become the val split (default 0.05)")
    p.add_argument("--shard-tokens", type=positive_int, default=64 << 20, metavar="N",
                   help="tokens per shard file (default 64 Mi)")
    p.add_argument("--seed", type=int, default=0, help="--generate: corpus seed")


def _add_shard(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "shard", _shard, help="convert an image folder (ImageNet layout) into HDF5 shards",
        description="Convert one split into HDF5 shards (docs/shard-format.md). Class folders are "
                    "detected; a flat folder needs --labels. Under mpirun the ranks share the "
                    "shards; in a Slurm array each task takes its part (--task-index/--task-count, "
                    "default from SLURM_ARRAY_TASK_*). Rerunning skips finished shards.")
    p.add_argument("--src", required=True, metavar="DIR", help="the split's image folder")
    p.add_argument("--out", required=True, metavar="DIR", help="output root (shards go to OUT/SPLIT)")
    p.add_argument("--split", default="train", help="split name and output subfolder (default train)")
    p.add_argument("--labels", metavar="FILE",
                   help="flat folder: 'filename label' lines or a CSV (ImageId,PredictionString)")
    p.add_argument("--classes", metavar="FILE",
                   help="class names in index order: one per line (first token), or a "
                        "manifest.json (use train's for val)")
    p.add_argument("--shard-size", type=positive_int, default=1024, metavar="N",
                   help="samples per shard (default 1024)")
    p.add_argument("--encoding", choices=("jpeg", "raw"), default="jpeg",
                   help="jpeg: original bytes (default); raw: decoded RGB, square")
    p.add_argument("--max-side", type=positive_int, default=None, metavar="PX",
                   help="jpeg: re-encode images whose longer side exceeds PX (default: never)")
    p.add_argument("--quality", type=int, default=90, metavar="Q", help="JPEG re-encode quality")
    p.add_argument("--restart-interval", type=int, default=None, metavar="MCUS",
                   help="jpeg: rewrite each JPEG losslessly with a restart marker every MCUS "
                        "blocks, so a crop decodes only its own part (default 1 where the cropjpeg "
                        "extension is built, else 0: the bytes as they are)")
    p.add_argument("--raw-size", type=positive_int, default=256, metavar="PX",
                   help="raw: resize shorter side to PX, centre-crop PXxPX (default 256)")
    p.add_argument("--seed", type=int, default=0, help="sample order shuffle seed (default 0)")
    p.add_argument("--strict", action="store_true", help="stop at the first unreadable image")
    p.add_argument("--task-index", type=int, default=None, metavar="I")
    p.add_argument("--task-count", type=int, default=None, metavar="N")


def register(commands: argparse._SubParsersAction) -> None:
    data = commands.add_parser("data", help="convert, check and describe HDF5 image shards")
    sub = data.add_subparsers(dest="data_command", metavar="DATA_COMMAND", required=True)
    _add_shard(sub)
    _add_tokenize(sub)
    _add_text(sub)

    verify = add_command(sub, "verify", _verify, help="recheck checksums, attributes and every image",
                         description="Exit 0 when every shard matches its manifest and every "
                                        "image decodes; exit 6 listing each problem otherwise.")
    verify.add_argument("dir", metavar="DIR", help="the --out folder (or one split folder)")
    verify.add_argument("--split", default=None, help="only this split")

    info = add_command(sub, "info", _info, help="summary per split: samples, classes, shards, bytes",
                       description="A table on a terminal, plain lines when piped.")
    info.add_argument("dir", metavar="DIR", help="the --out folder (or one split folder)")
    info.add_argument("--split", default=None, help="only this split")
    info.add_argument("--json", action="store_true", help="machine-readable output")

    demo = add_command(sub, "demo", _demo, help="write a small learnable ImageNet-like image folder",
                       description="DIR/train/<synset>/*.JPEG, DIR/val/*.JPEG and "
                                      "DIR/val_labels.txt; deterministic from --seed.")
    demo.add_argument("--out", required=True, metavar="DIR")
    demo.add_argument("--classes", type=positive_int, default=10)
    demo.add_argument("--per-class", type=positive_int, default=60)
    demo.add_argument("--val-per-class", type=int, default=10)
    demo.add_argument("--size", type=positive_int, default=64, help="typical side (sizes vary +-)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--photo", action="store_true",
                      help="ImageNet-photo shapes: long side ~SIZE, 4:3, one in four portrait "
                           "(--size 500: 500x375, ~100-120 KB, as for bench data)")
