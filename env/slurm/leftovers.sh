#!/usr/bin/env bash
# List what a stopped multi-node cluster must not leave behind; exit 1 if anything is there.
#
#   bash env/slurm/leftovers.sh [--state-dir DIR] [--nodes N]
#
# One "KIND NAME" line per leftover: a network namespace hpcnN, a link hpcnN-br, the bridge
# hpcnbr0 (netns.sh: our_leftovers), a /run/netns mount holding no namespace (what `ip netns
# add` mounts), a mount under the state dir, the network owner file, a live daemon of the state
# dir. Run it after `env/slurm/stop.sh --nodes N` (.ci/run does); while the cluster runs it
# lists the cluster itself (tests/env/test_leftovers.py relies on that). Reads only.
# HPC_TRAIN_NETNS_MOUNTED_BEFORE=1: /run/netns was a mount before the cluster started (a machine
# restored from a snapshot keeps its mounts; start.sh then records none): not reported.
set -euo pipefail

usage() { sed -n '2,10s/^# \{0,1\}//p' "$0"; }

# shellcheck source=env/slurm/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

leftovers() {
    local name pid
    our_leftovers
    if [[ ${HPC_TRAIN_NETNS_MOUNTED_BEFORE:-0} != 1 ]] && mountpoint -q "$NETNS_DIR" 2>/dev/null && [[ -z $(find "$NETNS_DIR" -mindepth 1 -maxdepth 1 2>/dev/null) ]]; then
        printf 'mount %s\n' "$NETNS_DIR"
    fi
    # The mount table of this namespace: the nodes' own mounts die with their namespaces.
    awk -v state="$STATE/" 'index($2 "/", state) == 1 {print "mount", $2}' /proc/self/mounts
    [[ -e $NET_OWNER_FILE ]] && printf 'file %s\n' "$NET_OWNER_FILE"
    for name in "${DAEMONS[@]}"; do
        if pid=$(running "$name"); then printf 'process %s (PID %s)\n' "$name" "$pid"; fi
    done
    return 0
}

main() {
    local left
    parse_args "$@"
    ((MULTI)) || die "leftovers.sh checks a multi-node cluster: pass --nodes N (N >= 2) or its --state-dir"
    left=$(leftovers)
    if [[ -n $left ]]; then
        say "left behind by the multi-node cluster ($STATE):"
        printf '%s\n' "$left"
        return 1
    fi
    say "nothing left behind: no namespace, link, bridge, mount or daemon of $STATE"
}

main "$@"
