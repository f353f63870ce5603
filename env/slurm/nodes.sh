# shellcheck shell=bash
# The compute nodes of the multi-node cluster for start.sh (--nodes N): their slurm.conf, one
# slurmd per network namespace (netns.sh), and the wait until each has registered.
# Sourced by start.sh after lib.sh, never executed.

# The multi-node slurm.conf: the essentials of the single-node one, per-node paths (%n = node
# name), and the controller on the bridge address, which every namespace reaches.
write_nodes_conf() {
    local mem_mb i nodelines=""
    # Every slurmd sees the whole machine: 85% of MemTotal shared as if by at most 4 nodes. The
    # tests' jobs use 2-4 nodes at a time, and the shipped CPU specs ask 4G per node, which an
    # 8-way split (2.5 GB on 24 GB) would refuse; beyond 4 nodes the declared memory adds up to
    # more than the machine has (nothing enforces it here: no cgroup limits).
    local share=$((NODES < 4 ? NODES : 4))
    mem_mb=$(awk -v n="$share" '/^MemTotal:/ {printf "%d", $2 * 0.85 / 1024 / n}' /proc/meminfo)
    ((mem_mb >= 4096)) || say "config: WARNING: only ${mem_mb}M per node; the shipped CPU specs ask --mem=4G per node"
    for ((i = 0; i < NODES; i++)); do
        nodelines+="NodeName=${NODE_NAMES[i]} NodeAddr=${NODE_ADDRS[i]} CPUs=2 RealMemory=$mem_mb State=UNKNOWN"$'\n'
    done
    say "config: writing $CONF (nodes ${NODE_NAMES[*]}, CPUs=2, RealMemory=${mem_mb}M each)"
    cat >"$CONF.tmp" <<EOF
$SLURM_MARKER
# Regenerated on every start: edit env/slurm/start.sh, not this file.
# Multi-node cluster: one slurmd per network namespace, joined by bridge $BRIDGE ($NET_PREFIX.0/24).
ClusterName=$CLUSTER_NAME
# slurmctld runs in the host namespace and must find its own short name here.
SlurmctldHost=$NODE($CTL_ADDR)
SlurmdSpoolDir=$SPOOL/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
# All nodes share /tmp, and mpi/pmix creates the same /tmp/spmix_appdir_* on each: one TmpFS each.
TmpFS=$NODE_TMP/%n
# A crashed node (node.sh crash) is marked DOWN within about this long, not Slurm's 300 s: a job
# requeued off it waits that long for the dead node's part of the job to be given up. Sites keep
# minutes; the job's own recovery (hpc_train's driver) never waits for it.
SlurmdTimeout=20
$(conf_essentials)
${nodelines}$(partition_lines "${NODE_PREFIX}[1-$NODES]")
EOF
    mv -f -- "$CONF.tmp" "$CONF"
    chmod 644 -- "$CONF"
}

# start_node_slurmds: one slurmd per node inside its namespaces (node_exec), detached like the
# other daemons. LAUNCHED[node] = the second just before its launch (see wait_nodes_ready).
declare -A LAUNCHED=()
start_node_slurmds() {
    local n pid
    for n in "${NODE_NAMES[@]}"; do
        if pid=$(running "slurmd-$n"); then
            say "slurmd $n: already running (ours, PID $pid)"; continue
        fi
        rm -f -- "$(pid_file "slurmd-$n")"
        say "slurmd $n: starting in its namespaces (log $LOG/slurmd-$n.log)"
        LAUNCHED[$n]=$(date +%s)
        node_argv "$n"
        setsid "${NODE_ARGV[@]}" slurmd -f "$CONF" -N "$n" </dev/null >>"$LOG/slurmd-$n.log" 2>&1 \
            || { tail -n 20 -- "$LOG/slurmd-$n.log" | sed 's/^/[slurm]   /'; die "slurmd $n failed to start"; }
    done
}

# node_ready NODE STATE START: idle (or busy) and not drained/down/not responding, and if we just
# launched its slurmd, registered by THAT slurmd: a restarted slurmctld reports nodes IDLE from its
# saved state before any slurmd registered, so the state alone proves nothing.
node_ready() {
    local n=$1 state=$2 start=$3 t
    [[ $state =~ ^(IDLE|MIXED|ALLOCATED)(\+(COMPLETING|PLANNED|RESERVED))*$ ]] || return 1
    [[ -n ${LAUNCHED[$n]:-} ]] || return 0
    [[ $start == None || -z $start ]] && return 1
    t=$(date -d "$start" +%s 2>/dev/null) || return 1
    ((t >= LAUNCHED[$n]))
}

# Wait for every node to be ready; resume nodes left DOWN/DRAINED by an earlier run.
wait_nodes_ready() {
    local deadline n line state start pending f last_resume=-100 out
    deadline=$((SECONDS + WAIT_TIMEOUT))
    while :; do
        out=$(timeout 5 scontrol -o show node 2>/dev/null) || out=""
        pending=()
        for n in "${NODE_NAMES[@]}"; do
            line=$(grep -m1 "^NodeName=$n " <<<"$out") || line=""
            state=$(sed -n 's/.* State=\([^ ]*\).*/\1/p' <<<"$line")
            start=$(sed -n 's/.* SlurmdStartTime=\([^ ]*\).*/\1/p' <<<"$line")
            node_ready "$n" "$state" "$start" || pending+=("$n:${state:-no answer}")
            if [[ $state == *DRAIN* || $state == DOWN* || $state == *FAIL* ]] && ((SECONDS - last_resume >= 5)); then
                say "node $n is '$state': resuming it"
                timeout 5 scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true
                last_resume=$SECONDS
            fi
        done
        if [[ ${#pending[@]} -eq 0 ]]; then
            say "nodes ${NODE_NAMES[*]}: idle, registered by their slurmd"
            return 0
        fi
        if ((SECONDS >= deadline)); then
            say "timed out after ${WAIT_TIMEOUT}s: nodes not ready: ${pending[*]}"
            for n in "${NODE_NAMES[@]}"; do
                f=$LOG/slurmd-$n.log
                say "last lines of $f:"
                tail -n 12 -- "$f" 2>/dev/null | sed 's/^/[slurm]   /' || true
            done
            say "last lines of $LOG/slurmctld.log:"
            tail -n 20 -- "$LOG/slurmctld.log" 2>/dev/null | sed 's/^/[slurm]   /' || true
            exit 1
        fi
        sleep 0.5
    done
}

# mpi/pmix is what multi-node MPI jobs use (srun --mpi=pmix, and mpirun's orted through srun).
check_pmix() {
    if ! timeout 10 srun --mpi=list 2>&1 | grep -qw pmix; then
        say "WARNING: srun --mpi=list shows no pmix plugin; MPI jobs across nodes need it (apt-get install slurm-wlm-basic-plugins libpmix2)"
    fi
}
