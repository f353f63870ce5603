# shellcheck shell=bash
# Shared helpers for env/slurm/start.sh and env/slurm/stop.sh. Sourced, never executed.
#
# Everything created at run time lives in one state dir:
#   etc/   slurm.conf, slurmdbd.conf (0600), db-password (0600)
#   log/   one log per daemon
#   run/   one PID file per daemon we started (munged, mariadbd, slurmdbd, slurmctld, slurmd)
#   mysql/ MariaDB datadir     spool/ SlurmdSpoolDir     ctld-state/ StateSaveLocation
# The multi-node cluster (--nodes N, N >= 2) adds, in its own state dir (default .slurm-state-nodes):
#   nodes  one "name address" line per compute node      net/  see netns.sh
#   tmp/<node>/ TmpFS per node; run/slurmd-<node>.pid, log/slurmd-<node>.log, spool/<node>/

# First line of every file we generate: tells our own scripts (and people) the file is ours.
SLURM_MARKER="# managed by hpc_train env/slurm/start.sh"
# Daemons in start order; stop.sh walks the list backwards.
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)
CLUSTER_NAME=hpctrain
DB_PORT=${HPC_TRAIN_SLURM_DB_PORT:-3307}
SLURMCTLD_PORT=6817
SLURMD_PORT=6818
SLURMDBD_PORT=6819
ETC_SLURM_CONF=/etc/slurm/slurm.conf
APT_HINT="apt-get install --no-install-recommends munge slurmctld slurmd slurm-client slurmdbd mariadb-server-core mariadb-client-core"
# The multi-node cluster runs next to the single-node one, so every name and port differs.
NODES_CLUSTER_NAME=hpctrainnodes
NODES_DB_PORT=${HPC_TRAIN_SLURM_NODES_DB_PORT:-3308}
NODES_SLURMCTLD_PORT=6827
NODES_SLURMD_PORT=6828
NODES_SLURMDBD_PORT=6829
NODES_MAX=16

say() { printf '[slurm] %s\n' "$*"; }
die() { printf '[slurm] ERROR: %s\n' "$*" >&2; exit 1; }

require_root() {
    if [[ $(id -u) -ne 0 ]]; then
        die "must run as root (the daemons run as root/munge and it writes /etc/slurm, /etc/hosts, /run/munge); try: sudo bash $0"
    fi
}

# parse_args "$@": sets STATE (absolute), PURGE, PREEMPTION and NODES (MULTI=1 when NODES >= 2).
# Precedence for the state dir: --state-dir, then $HPC_TRAIN_SLURM_STATE (single node) or
# $HPC_TRAIN_SLURM_NODES_STATE (--nodes N >= 2), then <repo root>/.slurm-state or
# <repo root>/.slurm-state-nodes (repo root = two levels above env/slurm). Without --nodes, a state
# dir holding a `nodes` file is a multi-node one: `stop.sh --state-dir DIR` needs no --nodes.
parse_args() {
    local repo_root state="" nodes=""
    PURGE=0
    PREEMPTION=1
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --state-dir) [[ $# -ge 2 ]] || die "--state-dir needs a value"; state=$2; shift 2 ;;
            --state-dir=*) state=${1#*=}; shift ;;
            --nodes) [[ $# -ge 2 ]] || die "--nodes needs a value"; nodes=$2; shift 2 ;;
            --nodes=*) nodes=${1#*=}; shift ;;
            --purge) PURGE=1; shift ;;
            --no-preemption) PREEMPTION=0; shift ;;
            -h|--help) usage; exit 0 ;;
            *) die "unknown argument: $1 (see --help)" ;;
        esac
    done
    if [[ -n $nodes ]] && { [[ ! $nodes =~ ^[0-9]+$ ]] || ((10#$nodes < 1 || 10#$nodes > NODES_MAX)); }; then
        die "--nodes must be a whole number from 1 to $NODES_MAX (got '$nodes')"
    fi
    [[ -z $nodes ]] || nodes=$((10#$nodes))
    repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    if [[ ${nodes:-1} -ge 2 ]]; then
        state=${state:-${HPC_TRAIN_SLURM_NODES_STATE:-$repo_root/.slurm-state-nodes}}
    else
        state=${state:-${HPC_TRAIN_SLURM_STATE:-$repo_root/.slurm-state}}
    fi
    # Absolute path even if it does not exist yet: PID-file ownership checks compare against it.
    STATE=$(realpath -m -- "$state")
    NODES_FILE=$STATE/nodes
    if [[ -z $nodes && -s $NODES_FILE ]]; then
        nodes=$(grep -c . -- "$NODES_FILE")
        ((nodes >= 2)) || die "$NODES_FILE lists $nodes node(s); pass --nodes N"
    elif [[ $nodes == 1 && -s $NODES_FILE ]]; then
        die "$STATE holds a multi-node cluster ($NODES_FILE); use --nodes N (N >= 2) or another --state-dir"
    fi
    NODES=${nodes:-1}
    MULTI=$((NODES >= 2 ? 1 : 0))
    ETC=$STATE/etc
    LOG=$STATE/log
    RUN=$STATE/run
    DB_DIR=$STATE/mysql
    SPOOL=$STATE/spool
    CTLD_STATE=$STATE/ctld-state
    CONF=$ETC/slurm.conf
    DBD_CONF=$ETC/slurmdbd.conf
    DB_PASS_FILE=$ETC/db-password
    DB_SOCK=$RUN/mariadbd.sock
    NODE=$(hostname -s)
    # Every client and daemon we run reads our config, whatever /etc/slurm holds. slurmdbd finds
    # slurmdbd.conf next to $SLURM_CONF, and the daemons inherit this variable, which is how
    # pid_is_ours() recognises them later.
    export SLURM_CONF=$CONF
    if ((MULTI)); then
        CLUSTER_NAME=$NODES_CLUSTER_NAME
        DB_PORT=$NODES_DB_PORT
        SLURMCTLD_PORT=$NODES_SLURMCTLD_PORT
        SLURMD_PORT=$NODES_SLURMD_PORT
        SLURMDBD_PORT=$NODES_SLURMDBD_PORT
        NODE_TMP=$STATE/tmp
        net_vars
        # One slurmd per node, each with its own PID file (run/slurmd-<node>.pid); also any left
        # from an earlier run with more nodes, so that they are stopped too.
        local f n extra=()
        for f in "$RUN"/slurmd-*.pid; do
            [[ -e $f ]] || continue
            n=${f##*/slurmd-}; n=${n%.pid}
            [[ " ${NODE_NAMES[*]} " == *" $n "* ]] || extra+=("slurmd-$n")
        done
        DAEMONS=(munged mariadbd slurmdbd slurmctld "${NODE_NAMES[@]/#/slurmd-}" "${extra[@]}")
    fi
}

pid_file() { printf '%s/%s.pid' "$RUN" "$1"; }

# read_pid NAME: prints the PID from our PID file (nothing if missing or garbage).
read_pid() {
    local f pid
    f=$(pid_file "$1")
    [[ -r $f ]] || return 1
    read -r pid <"$f" || true
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    printf '%s' "$pid"
}

# alive PID: process exists and is not a zombie.
alive() {
    local stat st
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    st=${stat##*) }    # the state field follows "(comm) ", and comm may contain spaces
    st=${st%% *}
    # Zombies count as dead: PID 1 here (process_api) reaps them only after a while.
    [[ -n $st && $st != Z && $st != X ]]
}

# pid_is_ours NAME PID: PID is alive, runs program NAME, and belongs to THIS state dir
# (its command line mentions the state dir, or it inherited SLURM_CONF=<our conf>).
# A recycled PID or somebody else's daemon fails this check and is never killed.
# NAME may carry a node suffix (slurmd-hpcn1): the program is the part before the first '-'.
pid_is_ours() {
    local name=${1%%-*} pid=$2 comm
    alive "$pid" || return 1
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
    [[ $comm == "$name" ]] || return 1
    if tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "$STATE/"; then
        return 0
    fi
    tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qxF -- "SLURM_CONF=$CONF"
}

# running NAME: our daemon NAME is running (prints its PID).
running() {
    local pid
    pid=$(read_pid "$1") || return 1
    pid_is_ours "$1" "$pid" || return 1
    printf '%s' "$pid"
}

# munge_works: a munged (ours or the system's) answers on the default socket.
munge_works() {
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1
}

# stop_daemon NAME [GRACE_S]: SIGTERM our NAME, wait, SIGKILL if needed, remove its PID file.
# Returns 1 only if our process is still alive afterwards.
stop_daemon() {
    local name=$1 grace=${2:-10} f pid i
    f=$(pid_file "$name")
    if [[ ! -e $f ]]; then
        say "$name: no PID file, nothing of ours to stop"
        return 0
    fi
    if ! pid=$(read_pid "$name"); then
        say "$name: unreadable PID file, removed"
        rm -f -- "$f"; return 0
    fi
    if ! pid_is_ours "$name" "$pid"; then
        if alive "$pid"; then
            say "$name: PID $pid is not our $name (comm=$(cat "/proc/$pid/comm" 2>/dev/null)), not touching it; removed stale PID file"
        else
            say "$name: not running (stale PID file $pid removed)"
        fi
        rm -f -- "$f"; return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < grace * 5; i++)); do
        alive "$pid" || break
        sleep 0.2
    done
    if alive "$pid" && pid_is_ours "$name" "$pid"; then
        say "$name: PID $pid ignored SIGTERM for ${grace}s, sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 25; i++)); do alive "$pid" || break; sleep 0.2; done
    fi
    if alive "$pid"; then
        say "$name: PID $pid is STILL running"
        return 1
    fi
    rm -f -- "$f"
    say "$name: stopped (PID $pid)"
}

# our_stepds: PIDs of slurmstepd processes spawned by our slurmd (they inherit SLURM_CONF).
our_stepds() {
    local pid
    for pid in $(pgrep -x slurmstepd 2>/dev/null); do
        if tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qxF -- "SLURM_CONF=$CONF"; then
            printf '%s\n' "$pid"
        fi
    done
}

# other_slurm_daemons: Slurm daemons alive here that are not ours (the other cluster of
# start.sh --nodes, or a site's); they need munged.
other_slurm_daemons() {
    local name pid
    for name in slurmctld slurmd slurmdbd; do
        for pid in $(pgrep -x "$name" 2>/dev/null); do
            if ! pid_is_ours "$name" "$pid" && alive "$pid"; then printf '%s ' "$pid"; fi
        done
    done
}

# stop_all_daemons: stop every daemon from our PID files in reverse start order, then any
# slurmstepd left behind by our slurmd. Returns 1 if anything of ours survived.
# Our munged is left running (MUNGED_KEPT=1, PID file kept) while another cluster's daemons use
# it: the single-node and the multi-node cluster share the machine's munged, whoever started it.
MUNGED_KEPT=0
stop_all_daemons() {
    local i rc=0 pids others
    for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
        case ${DAEMONS[i]} in
            munged)
                others=$(other_slurm_daemons)
                if [[ -n $others ]] && pids=$(running munged); then
                    say "munged: ours (PID $pids) but still used by other Slurm daemons (PIDs ${others% }); left running, a later stop.sh stops it"
                    MUNGED_KEPT=1
                else
                    stop_daemon munged 10 || rc=1
                fi ;;
            mariadbd) stop_daemon mariadbd 30 || rc=1 ;;  # InnoDB shutdown can take a while
            *) stop_daemon "${DAEMONS[i]}" 10 || rc=1 ;;
        esac
    done
    pids=$(our_stepds)
    if [[ -n $pids ]]; then
        say "slurmstepd: leftover step daemons $(echo "$pids" | tr '\n' ' ')- terminating"
        # shellcheck disable=SC2086  # word splitting of the PID list is intended
        kill -TERM $pids 2>/dev/null || true
        sleep 3
        pids=$(our_stepds)
        # shellcheck disable=SC2086
        [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
        sleep 0.5
        [[ -z $(our_stepds) ]] || { say "slurmstepd: some step daemons survive: $(our_stepds | tr '\n' ' ')"; rc=1; }
    fi
    return "$rc"
}

# etc_conf_is_ours: /etc/slurm/slurm.conf is a symlink we may replace: it points at some
# */etc/slurm.conf carrying our marker, or it dangles (a purged state dir).
etc_conf_is_ours() {
    local target
    [[ -L $ETC_SLURM_CONF ]] || return 1
    target=$(readlink -- "$ETC_SLURM_CONF")
    [[ $target == */etc/slurm.conf ]] || return 1
    [[ ! -e $target ]] && return 0
    head -n 3 -- "$target" 2>/dev/null | grep -qxF -- "$SLURM_MARKER"
}

# shellcheck source=env/slurm/netns.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns.sh"
