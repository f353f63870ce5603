"""Build the crop-region JPEG decoder (`_cropjpeg.c`) in place, against the system libjpeg-turbo.

    python -m hpc_train.data.cropjpeg_build [--force]

Why a script and not a setuptools Extension: the decoder is optional (the data pipeline falls
back to simplejpeg or Pillow), so `pip install` must not fail where libjpeg's headers are
missing. env/setup.sh runs this; it rebuilds only when the C sources or the interpreter changed
(a stamp beside the library), so a re-run costs a hash. Needs a C compiler and Debian's
`libjpeg62-turbo-dev` (jpeglib.h, libjpeg.so). Exit 0 when built or up to date, 1 when it
cannot build (the message says why); nothing else depends on it.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "_cropjpeg.c", HERE / "_jpeg_intervals.c", HERE / "_crop_draw.c")
HEADERS = (HERE / "_jpeg_intervals.h", HERE / "_crop_draw.h")
LIBRARY = HERE / ("_cropjpeg" + sysconfig.get_config_var("EXT_SUFFIX"))
STAMP = LIBRARY.with_name(LIBRARY.name + ".stamp")
# -ffp-contract=off: no fused multiply-adds, so _crop_draw.c's arithmetic rounds as numpy's
# does on every CPU (x86-64's baseline has no FMA; aarch64's has, and gcc would fuse there).
FLAGS = ("-O2", "-ffp-contract=off", "-shared", "-fPIC", "-Wall")
LIBRARIES = ("-ljpeg", "-lm")


def fingerprint() -> str:
    """What the library was built from: the C sources, the interpreter it links to and the
    compiler's command."""
    digest = hashlib.sha256()
    for path in (*SOURCES, *HEADERS):
        digest.update(path.read_bytes())
    digest.update(sys.version.encode())
    digest.update(" ".join(FLAGS + LIBRARIES).encode())   # a flag changed: rebuild
    return digest.hexdigest()


def up_to_date() -> bool:
    return LIBRARY.exists() and STAMP.exists() and STAMP.read_text().strip() == fingerprint()


def compile_command(output: Path) -> list[str]:
    """gcc (or the interpreter's CC) with FLAGS, Python's headers, -ljpeg -lm."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        compiler = "cc"
    return [compiler, *FLAGS, f"-I{sysconfig.get_paths()['include']}", *map(str, SOURCES), "-o",
            str(output), *LIBRARIES]


def build(force: bool = False) -> tuple[bool, str]:
    """(built or already up to date, what happened)."""
    if not force and up_to_date():
        return True, f"{LIBRARY.name} up to date"
    partial = LIBRARY.with_name(LIBRARY.name + ".partial")
    try:
        done = subprocess.run(compile_command(partial), capture_output=True, text=True)
    except OSError as exc:
        return False, f"no C compiler ({exc})"
    if done.returncode != 0:
        first = next((line for line in done.stderr.splitlines() if "error" in line),
                     done.stderr.strip()[:300])
        return False, f"compile failed: {first}"
    partial.replace(LIBRARY)          # atomic: a running process keeps the old mapping
    STAMP.write_text(fingerprint() + "\n")
    return True, f"{LIBRARY.name} built"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    ok, what = build(parser.parse_args(argv).force)
    print(what if ok else f"{what}; needs a C compiler and libjpeg-turbo's headers "
          "(Debian: libjpeg62-turbo-dev); JPEGs decode with simplejpeg or Pillow instead")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
