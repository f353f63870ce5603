#!/usr/bin/env bash
# Stop the private single-node Slurm cluster started by env/slurm/start.sh.
#
#   bash env/slurm/stop.sh [--state-dir DIR] [--nodes N] [--purge]
#
# Cancels remaining jobs, then stops ONLY the daemons named in our PID files (slurmd, slurmctld,
# slurmdbd, mariadbd, munged), after checking each PID still is that program of this state dir.
# Data (DB, controller state) stay; --purge also removes the state dir and our /etc/slurm symlink.
# --nodes N (N >= 2), or a --state-dir of a multi-node cluster: also removes the namespaces, veths,
# bridge and /run/netns mount that start.sh created (listed in <state>/net/created), nothing else.
set -euo pipefail

usage() {
    sed -n '2,10s/^# \{0,1\}//p' "$0"
    echo "State dir: --state-dir DIR, else \$HPC_TRAIN_SLURM_STATE, else <repo root>/.slurm-state"
    echo "  (--nodes N >= 2: \$HPC_TRAIN_SLURM_NODES_STATE, else <repo root>/.slurm-state-nodes)."
}

# shellcheck source=env/slurm/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Cancel every job while slurmctld/slurmd still run, so their steps end cleanly; give the
# slurmstepd processes (children of slurmd) time to finish (KillWait=5).
cancel_jobs() {
    local ids i
    running slurmctld >/dev/null || return 0
    ids=$(timeout 5 squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ') || true
    if [[ -n ${ids// /} ]]; then
        say "jobs: cancelling $ids"
        # shellcheck disable=SC2086  # one argument per job id
        timeout 10 scancel --full $ids >/dev/null 2>&1 || true
        for ((i = 0; i < 40; i++)); do   # up to ~20 s for COMPLETING jobs to leave the queue
            [[ -z $(timeout 5 squeue -h -o %A 2>/dev/null) ]] && break
            sleep 0.5
        done
    else
        say "jobs: none to cancel"
    fi
    for ((i = 0; i < 20; i++)); do       # up to ~10 s for step daemons to exit
        [[ -z $(our_stepds) ]] && break
        sleep 0.5
    done
}

# Anything of ours still alive? Lists survivors with pgrep -a and returns 1 if any.
verify_stopped() {
    local name pid rc=0
    for name in slurmstepd slurmd slurmctld slurmdbd mariadbd munged; do
        [[ $name == munged ]] && ((MUNGED_KEPT)) && continue   # kept on purpose, said above
        for pid in $(pgrep -x "$name" 2>/dev/null); do
            if [[ $name == slurmstepd ]] && our_stepds | grep -qx "$pid"; then :
            elif [[ $name != slurmstepd ]] && pid_is_ours "$name" "$pid"; then :
            else continue
            fi
            say "still running: $(pgrep -a -x "$name" | grep "^$pid ")"
            rc=1
        done
    done
    return "$rc"
}

purge() {
    if [[ -L $ETC_SLURM_CONF && $(readlink -- "$ETC_SLURM_CONF") == "$CONF" ]]; then
        rm -f -- "$ETC_SLURM_CONF"
        say "purge: removed symlink $ETC_SLURM_CONF"
    fi
    [[ -d $STATE ]] || return 0
    # Never rm -rf a directory we did not create: require our marker in its slurm.conf.
    if ! head -n 3 -- "$CONF" 2>/dev/null | grep -qxF -- "$SLURM_MARKER"; then
        die "purge: $STATE does not hold our slurm.conf (marker missing); not deleting it"
    fi
    rm -rf -- "$STATE"
    say "purge: removed $STATE"
}

main() {
    parse_args "$@"
    require_root
    if [[ ! -d $RUN ]]; then
        say "nothing to stop: no $RUN"
    else
        cancel_jobs
        stop_all_daemons || true
    fi
    # After the slurmds: a namespace lives on while a process is in it, so removing it is only
    # final once they are gone (and harmless if one survived: verify_stopped reports it).
    if ((MULTI)); then
        net_down
    fi
    if ! verify_stopped; then
        die "some of our processes are still running (see above)"
    fi
    say "all our daemons are stopped (data kept in $STATE)"
    if ((PURGE)); then
        purge
    fi
}

main "$@"
