# Example site profile for an HPC cluster: copy to env/site.sh and adapt.
#
# env/setup.sh installs system packages only as root on Debian. On a cluster login node you are
# not root: load the site's modules instead, before running setup, and in every job (the job spec's
# site setup lines can `source env/site.sh`). What hpc_train needs from the site:
#   - an MPI with its compiler wrapper (mpicc) and mpirun   -> Horovod build and launch
#   - the CUDA toolkit and NCCL on GPU nodes                 -> Horovod's NCCL allreduce
#   - a C++17 compiler and CMake >= 3.13                     -> Horovod build
#   - Python >= 3.10                                         -> the venv
#   - Slurm client commands (sbatch, squeue, sacct)          -> submit and inspect
#
# Module names differ by site; `module avail openmpi cuda gcc cmake python` shows yours.
module purge
module load gcc/12          # C++17 compiler for Horovod
module load cmake/3.27
module load openmpi/4.1     # provides mpirun and mpicc; match the MPI your site supports
module load cuda/12.4       # GPU nodes: Horovod is then built with NCCL
module load python/3.11

# Build Horovod for GPUs with NCCL (env/install-horovod.sh passes this through when CUDA torch is found)
export HOROVOD_NCCL_HOME="${NCCL_HOME:-$CUDA_HOME}"
# Pick the CUDA build of torch that matches the toolkit, e.g.:
# export HPC_TRAIN_TORCH="torch==2.13.0"
