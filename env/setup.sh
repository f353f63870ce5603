#!/usr/bin/env bash
# One-command environment for hpc_train. Idempotent: every step checks before it acts, so a
# second run finishes in well under a minute.
#
#   bash env/setup.sh [--no-system] [--no-horovod] [--no-deepspeed] [--no-slurm]
#
# 1. System packages (root on Debian: installed with apt-get; otherwise: listed, with how to get them)
# 2. .venv with torch (CPU build without a GPU), then this project with its test extras and
#    DeepSpeed (extra `deepspeed`, for parallel.backend: deepspeed; pure Python, after torch);
#    simplejpeg and the crop-region JPEG decoder (hpc_train/data/_cropjpeg.c, built in place);
#    the optional extras: the trackers (wandb, mlflow) and transformers + datasets (examples/hf_lm)
# 3. Horovod 0.28.1 built against that torch (cached wheel; see env/install-horovod.sh)
# 4. Demo data (real JPEGs -> HDF5 shards under data/) for jobs/smoke.yaml, and text files
#    (data/demo-text) for jobs/hf_lm.yaml
# 5. As root, where no Slurm answers: the project's single-node Slurm, left running
#    (env/slurm/start.sh; stop it with env/slurm/stop.sh), so `submit jobs/smoke.yaml` works next
#
# Env: PYTHON (interpreter for the venv, default python3), HPC_TRAIN_TORCH (default torch==2.13.0),
#      HPC_TRAIN_TORCH_INDEX_URL (a pip index for a specific torch build, e.g. a CPU-only index).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv"
py="$venv/bin/python"
system=1
horovod=1
deepspeed=1
slurm=1
for arg in "$@"; do
    case "$arg" in
        --no-system) system=0 ;;
        --no-horovod) horovod=0 ;;
        --no-deepspeed) deepspeed=0 ;;
        --no-slurm) slurm=0 ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "unknown option: $arg (see --help)" >&2; exit 2 ;;
    esac
done

say() { printf '[setup] %s\n' "$*"; }
t0=$SECONDS
# What this run installed or built; a re-run on a ready machine says it changed nothing (.ci/run
# checks that line), and finds that out without importing torch or anything heavy.
changed=()

# ---------------------------------------------------------------- 1. system packages
# Debian package -> a command (or file) that shows it is present.
declare -A deb_probe=(
    [openmpi-bin]="mpirun" [libopenmpi-dev]="mpicc"
    [munge]="munged" [slurmctld]="slurmctld" [slurmd]="slurmd" [slurm-client]="sbatch"
    [slurmdbd]="slurmdbd" [mariadb-server-core]="mariadbd" [mariadb-client-core]="mariadb"
    [g++]="g++" [make]="make" [cmake]="cmake" [hdf5-tools]="h5ls"
    # the multi-node Slurm on one machine (env/slurm/start.sh --nodes 8): namespaces, bridge, veths
    [iproute2]="ip" [util-linux]="nsenter"
    # libjpeg-turbo's headers for the crop-region JPEG decoder (hpc_train/data/_cropjpeg.c)
    [libjpeg62-turbo-dev]="/usr/include/jpeglib.h"
)
missing=()
present() {   # a command on PATH (also the admin's sbin), or a file named by its path
    case "$1" in
        /*) [ -e "$1" ] ;;
        *) command -v "$1" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$1" >/dev/null 2>&1 ;;
    esac
}
for pkg in "${!deb_probe[@]}"; do
    present "${deb_probe[$pkg]}" || missing+=("$pkg")
done
if ! "${PYTHON:-python3}" -m venv --help >/dev/null 2>&1; then missing+=(python3-venv); fi

if [ "${#missing[@]}" -eq 0 ]; then
    say "system packages: all present (OpenMPI, Slurm, munge, slurmdbd, MariaDB, compilers, libjpeg-turbo headers)"
elif [ "$system" -eq 1 ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    say "system packages: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    say "system packages: installed"
    changed+=(system-packages)
else
    say "system packages missing: ${missing[*]}"
    say "  on Debian/Ubuntu (as root): apt-get install --no-install-recommends ${missing[*]}"
    say "  on an HPC site: load the equivalent modules; see env/site.example.sh"
    if ! command -v mpicc >/dev/null; then
        say "ERROR: Horovod needs an MPI compiler wrapper (mpicc); load MPI and re-run"
        [ "$horovod" -eq 1 ] && exit 1
    fi
fi

# ---------------------------------------------------------------- 2. venv, torch, project
if [ ! -x "$py" ]; then
    base_py="${PYTHON:-python3}"
    "$base_py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || { say "ERROR: $base_py is older than 3.10; set PYTHON=/path/to/python3.10+"; exit 1; }
    say "creating $venv with $("$base_py" --version)"
    "$base_py" -m venv "$venv"
    "$py" -m pip install -q --upgrade pip setuptools wheel
    changed+=(venv)
else
    say "venv: $venv exists ($("$py" --version))"
fi
pip() { "$py" -m pip "$@"; }

# The installed version of each distribution the steps below check, read from its metadata
# (importlib.metadata: no import of torch, DeepSpeed or the trackers, so a re-run takes seconds);
# "-" where it is not installed. Read again after each step that installs something.
declare -A have=()
read_versions() {
    local name version
    while read -r name version; do have[$name]=$version; done < <("$py" - <<'PY'
import importlib.metadata as metadata
for name in ("torch", "hpc_train", "submitit", "h5py", "mpi4py", "deepspeed", "simplejpeg", "wandb",
             "mlflow-skinny", "transformers", "datasets"):
    try:
        print(name, metadata.version(name))
    except metadata.PackageNotFoundError:
        print(name, "-")
PY
)
}
read_versions

if [ "${have[torch]}" != - ]; then
    say "torch: ${have[torch]} already installed"
else
    torch_req="${HPC_TRAIN_TORCH:-torch==2.13.0}"
    index=()
    [ -n "${HPC_TRAIN_TORCH_INDEX_URL:-}" ] && index=(--index-url "$HPC_TRAIN_TORCH_INDEX_URL")
    if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
        say "torch: GPU found, installing $torch_req (CUDA build)"
    else
        say "torch: no GPU, installing $torch_req (set HPC_TRAIN_TORCH_INDEX_URL to a CPU-only index if your pip would pick a CUDA build)"
    fi
    # torch first and on its own: the project's `torch>=2.1` must not pull a different build.
    pip install -q "${index[@]}" "$torch_req"
    changed+=(torch)
    read_versions
fi

# Reinstall the project only when its metadata changed (keeps a re-run fast). On a GPU machine
# also the NVML binding (extra `gpu`), with which ranks sample GPU use for `report`.
# DeepSpeed (extra `deepspeed`) comes after torch, so pip keeps that torch build.
extras=test
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then extras=test,gpu; fi
[ "$deepspeed" -eq 1 ] && extras="$extras,deepspeed"
stamp="$venv/.hpc_train-setup-stamp"
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $extras"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ "${have[hpc_train]}" != - ] \
    && [ "${have[submitit]}" != - ] && [ "${have[h5py]}" != - ] && [ "${have[mpi4py]}" != - ]; then
    say "project: hpc_train[$extras] up to date (editable install)"
else
    say "project: installing hpc_train[$extras] (editable) and its dependencies"
    pip install -q -e ".[$extras]"
    echo "$want" > "$stamp"
    changed+=(project)
    read_versions
fi
# DeepSpeed builds its CPU shared-memory collectives op just in time at every rank's first start
# (75-100 s on 2 cores, long enough to look stalled); built here once, a re-run finds it cached.
# The op lands where the ranks look for it: the venv's own extension folder (the default that
# hpc_train/parallel/deepspeed_engine.py sets: one per Python environment), or the user's
# TORCH_EXTENSIONS_DIR. (Built into torch's per-user default instead, every rank's first start
# rebuilt it: 500 s of CI's ZeRO-3 test.) A stamp in the venv names the versions it was built
# for, so a re-run need not import DeepSpeed.
ds_dir=${TORCH_EXTENSIONS_DIR:-$venv/torch-extensions}
ds_stamp="$venv/.deepspeed-op-stamp"
ds_want="deepspeed ${have[deepspeed]} torch ${have[torch]} in $ds_dir"
ds_op() { compgen -G "$ds_dir/deepspeed_shm_comm/*.so" >/dev/null; }
if [ "$deepspeed" -eq 1 ] && [ "$extras" = "${extras/gpu/}" ]; then
    if [ -f "$ds_stamp" ] && [ "$(cat "$ds_stamp")" = "$ds_want" ] && ds_op; then
        say "deepspeed: ${have[deepspeed]} already installed, its CPU op already built"
    elif TORCH_EXTENSIONS_DIR=$ds_dir DS_ACCELERATOR=cpu "$py" -c 'from deepspeed.accelerator import get_accelerator
get_accelerator().create_op_builder("ShareMemCommBuilder").load(verbose=False)' >/dev/null 2>&1; then
        echo "$ds_want" > "$ds_stamp"
        say "deepspeed: ${have[deepspeed]} installed, its CPU op built"
        changed+=(deepspeed-op)
    else
        say "deepspeed: its CPU op did not build (needs g++); each first start builds it or falls back to Gloo"
    fi
fi
# The fast-jpeg extra (simplejpeg) from a wheel only: where none exists for this platform the
# data pipeline decodes with Pillow instead, so a failure here is reported, not fatal.
if [ "${have[simplejpeg]}" != - ]; then
    say "simplejpeg: ${have[simplejpeg]} already installed"
elif pip install -q --only-binary=:all: "simplejpeg>=1.7"; then
    say "simplejpeg: installed (fast JPEG decode for the data pipeline)"
    changed+=(simplejpeg)
else
    say "simplejpeg: no wheel for this platform; JPEG decoding falls back to Pillow (slower)"
fi

# The experiment trackers of log.trackers (extras `wandb`, `mlflow`: mlflow-skinny, whose file
# store needs no database); checked with `pip install --dry-run` to change no installed package
# (torch, numpy, protobuf). A failure is reported, not fatal: those trackers are then skipped.
# The patch releases of the tested versions only: a segment's open reads W&B's offline files
# back through `wandb leet inspect --json`, and MLflow 3.17 changed what its file store allows.
if [ "${have[wandb]}" != - ] && [ "${have[mlflow-skinny]}" != - ]; then
    say "trackers: wandb ${have[wandb]}, mlflow-skinny ${have[mlflow-skinny]} already installed"
elif pip install -q "wandb~=0.31.0" "mlflow-skinny~=3.17.2"; then
    say "trackers: wandb and mlflow-skinny installed (log.trackers: wandb, mlflow)"
    changed+=(trackers)
else
    say "trackers: wandb or mlflow did not install; log.trackers wandb and mlflow log nothing"
fi

# Hugging Face transformers and datasets (extra `hf`): what examples/hf_lm, a user's causal LM
# (jobs/hf_lm.yaml), imports; hpc_train itself never does. Checked with `pip install --dry-run`
# to change no installed package (torch, numpy). A failure is reported, not fatal: every other
# job runs without them.
if [ "${have[transformers]}" != - ] && [ "${have[datasets]}" != - ]; then
    say "hugging face: transformers ${have[transformers]}, datasets ${have[datasets]} already installed"
elif pip install -q "transformers~=5.25.0" "datasets~=5.2.0"; then
    say "hugging face: transformers and datasets installed (examples/hf_lm, jobs/hf_lm.yaml)"
    changed+=(huggingface)
else
    say "hugging face: transformers or datasets did not install; jobs/hf_lm.yaml cannot run"
fi

# The crop-region JPEG decoder (a C extension against the system libjpeg-turbo): rebuilt only
# when its source or the interpreter changed; where it cannot build, simplejpeg or Pillow decode.
if cropjpeg="$("$py" -m hpc_train.data.cropjpeg_build 2>&1)"; then
    say "cropjpeg: $cropjpeg (crop-region JPEG decode for the data pipeline)"
    case "$cropjpeg" in *"up to date"*) ;; *) changed+=(cropjpeg) ;; esac
else
    say "cropjpeg: not built: $cropjpeg"
fi

# ---------------------------------------------------------------- 3. Horovod
if [ "$horovod" -eq 1 ]; then
    # Its lines as they come (a build takes minutes), kept to tell whether it installed anything.
    horovod_log="$(mktemp)"
    bash "$root/env/install-horovod.sh" "$py" | tee "$horovod_log"
    grep -q "already installed" "$horovod_log" || changed+=(horovod)
    rm -f "$horovod_log"
else
    say "horovod: skipped (--no-horovod)"
fi

# ---------------------------------------------------------------- 4. demo data for jobs/smoke.yaml
# Real JPEG files in an ImageNet layout, converted to HDF5 shards: what the smoke job trains on.
demo="$root/data/demo"
shards="$root/data/demo-shards"
if [ -f "$shards/train/manifest.json" ] && [ -f "$shards/val/manifest.json" ]; then
    say "demo data: $shards ready"
else
    say "demo data: writing JPEGs to $demo and shards to $shards"
    [ -d "$demo/train" ] || "$py" -m hpc_train data demo --out "$demo" --per-class 300 --val-per-class 30 >/dev/null
    "$py" -m hpc_train data shard --src "$demo/train" --out "$shards" --shard-size 500 >/dev/null
    "$py" -m hpc_train data shard --src "$demo/val" --labels "$demo/val_labels.txt" --split val \
        --classes "$shards/train/manifest.json" --out "$shards" --shard-size 500 >/dev/null
    changed+=(demo-data)
fi

# Text files of the generated corpus (data.kind text's sentences), for jobs that read text
# through a dataset of their own (jobs/hf_lm.yaml).
text="$root/data/demo-text"
if [ -f "$text/train.txt" ] && [ -f "$text/val.txt" ]; then
    say "demo text: $text ready"
else
    say "demo text: writing $text/train.txt and val.txt"
    "$py" -m hpc_train data text --out "$text" >/dev/null
    changed+=(demo-text)
fi

# ---------------------------------------------------------------- 5. a Slurm to submit to
# Only where this script may own one: as root, with Slurm's daemons installed, no controller
# answering, and /etc/slurm/slurm.conf absent or ours. A site's Slurm is never touched.
etc_conf=/etc/slurm/slurm.conf
if [ "$slurm" -eq 0 ]; then
    say "slurm: skipped (--no-slurm)"
elif timeout 10 sinfo -h >/dev/null 2>&1; then
    say "slurm: a controller answers (sinfo); nothing to start"
elif [ "$(id -u)" -ne 0 ] || ! PATH="$PATH:/usr/sbin" command -v slurmctld >/dev/null; then
    say "slurm: no controller answers; on a login node ask your site, or run jobs here with --local"
elif [ -e "$etc_conf" ] && ! grep -qs "managed by hpc_train env/slurm/start.sh" "$etc_conf"; then
    say "slurm: $etc_conf is a site file and its controller does not answer; not starting our own"
else
    say "slurm: starting the project's single-node Slurm (env/slurm/start.sh)"
    bash "$root/env/slurm/start.sh" | sed 's/^/  /'
    say "slurm: left running; stop it with: bash env/slurm/stop.sh"
fi

if [ "${#changed[@]}" -eq 0 ]; then
    say "changed nothing: everything was in place"
else
    say "installed or built: ${changed[*]}"
fi

say "done in $((SECONDS - t0)) s. Next:"
say "  .venv/bin/python -m hpc_train submit jobs/smoke.yaml   # the main job, on that Slurm"
say "  .venv/bin/python -m hpc_train doctor                   # everything OK?"
