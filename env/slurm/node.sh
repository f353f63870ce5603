#!/usr/bin/env bash
# Crash or revive one compute node of the multi-node cluster (start.sh --nodes N), to try what a
# job does when a node dies under it.
#
#   bash env/slurm/node.sh crash NODE [--state-dir DIR]    # SIGKILL every process of the node
#   bash env/slurm/node.sh revive NODE [--state-dir DIR]   # its slurmd again; wait until it serves
#
# A crash kills what a machine's death kills: the node's slurmd, its slurmstepds, the job's
# launcher daemons and ranks there (every process in the node's network namespace), at once and
# without a signal they could handle. slurmctld is not told: it notices as it would on a real
# cluster, when pings go unanswered (SlurmdTimeout in slurm.conf), and marks the node DOWN.
# A revive starts the node's slurmd in its namespaces again; ReturnToService=2 makes it usable
# as soon as it registers.
set -euo pipefail

usage() { sed -n '2,13s/^# \{0,1\}//p' "$0"; }

# shellcheck source=env/slurm/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=env/slurm/nodes.sh
source "$(dirname "${BASH_SOURCE[0]}")/nodes.sh"

WAIT_TIMEOUT=60

# node_pids NODE: every process in the node's network namespace (all of them are the node's).
node_pids() { ip netns pids "$1" 2>/dev/null || true; }

crash() {
    local n=$1 pids i
    pids=$(node_pids "$n" | tr '\n' ' ')
    [[ -n ${pids// /} ]] || die "node $n runs no process: nothing to crash (revive it with: bash $0 revive $n)"
    say "node $n: SIGKILL to every process in its namespace (PIDs ${pids% })"
    # shellcheck disable=SC2086  # one argument per PID
    kill -KILL $pids 2>/dev/null || true
    for ((i = 0; i < 20; i++)); do          # up to ~10 s for the kernel to reap them
        [[ -z $(node_pids "$n") ]] && { say "node $n: crashed"; return 0; }
        sleep 0.5
    done
    die "node $n: processes still alive after SIGKILL: $(node_pids "$n" | paste -sd' ')"
}

revive() {
    local n=$1 pid
    if pid=$(running "slurmd-$n"); then
        say "node $n: slurmd already running (PID $pid)"
    else
        rm -f -- "$(pid_file "slurmd-$n")"
        say "node $n: starting slurmd in its namespaces (log $LOG/slurmd-$n.log)"
        LAUNCHED[$n]=$(date +%s)
        node_argv "$n"
        setsid "${NODE_ARGV[@]}" slurmd -f "$CONF" -N "$n" </dev/null >>"$LOG/slurmd-$n.log" 2>&1 \
            || die "slurmd $n failed to start; see $LOG/slurmd-$n.log"
    fi
    NODE_NAMES=("$n")
    wait_nodes_ready
}

main() {
    local action=${1:-} node=${2:-}
    case $action in
        -h|--help|"") usage; exit 0 ;;
        crash|revive) ;;
        *) die "unknown action '$action': crash or revive (see --help)" ;;
    esac
    [[ -n $node ]] || die "$action needs a node name (see --help)"
    shift 2
    [[ $* == *--nodes* ]] && die "node.sh takes no --nodes: it reads the cluster's nodes file"
    # The multi-node cluster's state dir unless told otherwise (parse_args alone would take the
    # single-node one's).
    [[ $* == *--state-dir* ]] || set -- --state-dir "${HPC_TRAIN_SLURM_NODES_STATE:-$(dirname "${BASH_SOURCE[0]}")/../../.slurm-state-nodes}" "$@"
    parse_args "$@"
    require_root
    ((MULTI)) || die "$STATE holds no multi-node cluster (no $NODES_FILE): start one with start.sh --nodes N"
    [[ " ${NODE_NAMES[*]} " == *" $node "* ]] || die "no node '$node' in this cluster (nodes: ${NODE_NAMES[*]})"
    netns_exists "$node" || die "node $node has no network namespace: is the cluster up? (start.sh --nodes $NODES)"
    "$action" "$node"
}

main "$@"
