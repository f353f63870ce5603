#!/usr/bin/env bash
# Build (once) and install Horovod into the project's virtual environment.
#
# Horovod 0.28.1 is the last release and its CMake files force C++14, which torch >= 2.1 headers
# reject. We patch CMAKE_CXX_STANDARD to 17 in the sdist, build a wheel against the installed torch
# and cache it under a key of (horovod, python, torch, CUDA, MPI) versions, so a second setup
# installs the cached wheel in seconds instead of rebuilding for ~7 minutes.
#
# Usage: env/install-horovod.sh [PYTHON]      (default: .venv/bin/python)
# Env:   HPC_TRAIN_CACHE   cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/hpc_train)
#        HOROVOD_VERSION   default 0.28.1
#        HOROVOD_REBUILD=1 ignore the cached wheel
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
py="${1:-$root/.venv/bin/python}"
version="${HOROVOD_VERSION:-0.28.1}"
cache_root="${HPC_TRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpc_train}"

say() { printf '[install-horovod] %s\n' "$*"; }

# Already installed, for this torch, with the frameworks we need? A stamp in the environment
# names what the last install here checked (horovod and torch versions, by their metadata), so
# the answer needs no import of torch or Horovod (seconds instead of a minute on a slow machine).
stamp="$("$py" -c 'import sys; print(sys.prefix)')/.horovod-stamp"
installed() {   # "horovod V torch W" from the distributions' metadata, "none" without either
    "$py" - <<'PY'
import importlib.metadata as metadata
try:
    print(f"horovod {metadata.version('horovod')} torch {metadata.version('torch')}")
except metadata.PackageNotFoundError:
    print("none")
PY
}
now="$(installed)"
if [ -z "${HOROVOD_REBUILD:-}" ] && [ -f "$stamp" ] && [ "$now" = "$(cat "$stamp")" ] \
    && [ "$(echo "$now" | cut -d' ' -f2)" = "$version" ]; then
    say "horovod $version already installed in $(dirname "$stamp") (PyTorch, MPI, Gloo: checked when installed)"
    exit 0
fi

command -v mpicc >/dev/null || { say "ERROR: mpicc not found: install OpenMPI (Debian: openmpi-bin libopenmpi-dev)"; exit 1; }
command -v cmake >/dev/null || "$py" -m pip install -q cmake

# Versions that make a built wheel reusable, or not.
read -r py_tag torch_version cuda_version < <("$py" -c '
import sys, torch
print(f"cp{sys.version_info.major}{sys.version_info.minor}", torch.__version__.replace("+", "_"),
      torch.version.cuda or "cpu")')
mpi_version="$(mpirun --version 2>/dev/null | head -n1 | tr -cs 'A-Za-z0-9.' '_' | sed 's/_$//')"
key="horovod-${version}-${py_tag}-torch-${torch_version}-cuda-${cuda_version}-${mpi_version}"
wheel_dir="$cache_root/wheels/$key"

gpu_flags=()
if [ "$cuda_version" != "cpu" ] && command -v nvcc >/dev/null; then
    gpu_flags=(HOROVOD_GPU_OPERATIONS=NCCL)
    say "CUDA torch and toolkit found: building with NCCL"
fi

if [ -z "${HOROVOD_REBUILD:-}" ] && compgen -G "$wheel_dir/horovod-*.whl" >/dev/null; then
    say "using cached wheel $wheel_dir"
else
    say "building horovod $version ($key); this takes about 7 minutes on 2 cores"
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    "$py" -m pip download -q --no-deps --no-binary :all: "horovod==$version" -d "$work"
    tar -xzf "$work"/horovod-"$version".tar.gz -C "$work"
    src="$work/horovod-$version"
    # The one-line fix: torch >= 2.1 needs C++17.
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
        "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt" \
        || { say "ERROR: C++17 patch did not apply; the sdist layout changed"; exit 1; }
    # Horovod's setup.py needs these at build time and we build without isolation (to see torch).
    "$py" -m pip install -q setuptools wheel packaging pyyaml cloudpickle psutil
    mkdir -p "$wheel_dir.partial"
    env HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        MAKEFLAGS="-j$(nproc)" "${gpu_flags[@]}" \
        "$py" -m pip wheel -q --no-build-isolation --no-deps "$src" -w "$wheel_dir.partial"
    # Publish the cache entry only when the wheel is complete.
    rm -rf "$wheel_dir"
    mkdir -p "$(dirname "$wheel_dir")"
    mv "$wheel_dir.partial" "$wheel_dir"
fi

"$py" -m pip install -q --no-deps --force-reinstall "$wheel_dir"/horovod-*.whl
"$py" -m pip install -q cloudpickle psutil pyyaml packaging "cffi>=1.4.0"  # horovod's runtime requirements
# The check a re-run trusts through the stamp: this version, with the frameworks we need built in.
"$py" - "$version" <<'PY'
import sys
import horovod, horovod.torch as hvd
assert horovod.__version__ == sys.argv[1], horovod.__version__
assert hvd.mpi_built() and hvd.gloo_built(), "horovod was built without MPI or Gloo"
ops = [name for name, built in (("MPI", hvd.mpi_built()), ("Gloo", hvd.gloo_built()), ("NCCL", hvd.nccl_built())) if built]
print("[install-horovod] installed horovod", horovod.__version__, "with PyTorch +", " + ".join(ops))
PY
installed > "$stamp"
