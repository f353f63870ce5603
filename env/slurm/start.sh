#!/usr/bin/env bash
# Start a private single-node Slurm 22.05 cluster (with accounting) without systemd.
#
#   bash env/slurm/start.sh [--state-dir DIR] [--nodes N] [--no-preemption]
#
# Order: munged -> private mariadbd -> slurmdbd -> slurmctld -i -> slurmd, then wait until the
# node is idle and sacct answers. Idempotent: if our daemons already run and sinfo answers it
# exits at once. Stop with env/slurm/stop.sh (same --state-dir).
#
# --nodes N (N >= 2): a second, independent cluster (hpctrainnodes) of N compute nodes hpcn1..N,
# each a slurmd in its own network/UTS/mount namespace on a private bridge (see netns.sh), with
# its own mariadbd/slurmdbd/slurmctld and ports. It can run next to the single-node one and never
# touches /etc/slurm: use it with the `export SLURM_CONF=...` line printed last.
#
# Preemption as many sites configure it (--no-preemption: none): partition priority tiers,
# PreemptMode=REQUEUE; the default partition `debug` (tier 1) has a 30 s GraceTime, and jobs of
# partition `urgent` (tier 2, same nodes) preempt its jobs. Nothing is preempted until a job is
# submitted to `urgent`: only the preemption tests do.
set -euo pipefail

usage() {
    sed -n '2,13s/^# \{0,1\}//p' "$0"
    cat <<EOF
State dir: --state-dir DIR, else \$HPC_TRAIN_SLURM_STATE, else <repo root>/.slurm-state
  (--nodes N >= 2: \$HPC_TRAIN_SLURM_NODES_STATE, else <repo root>/.slurm-state-nodes).
Env: HPC_TRAIN_SLURM_DB_PORT (MariaDB port, default 3307);
  --nodes N >= 2: HPC_TRAIN_SLURM_NODES_DB_PORT (default 3308), HPC_TRAIN_SLURM_NODES_NET
  (first three octets of the private /24, default 10.231.7).
EOF
}

# shellcheck source=env/slurm/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=env/slurm/accounting.sh
source "$(dirname "${BASH_SOURCE[0]}")/accounting.sh"
# shellcheck source=env/slurm/nodes.sh
source "$(dirname "${BASH_SOURCE[0]}")/nodes.sh"

WAIT_TIMEOUT=60   # seconds for the whole "node idle + sacct works" phase

check_binaries() {
    local b missing=()
    for b in munged munge unmunge mariadbd mariadb-install-db mariadb slurmdbd slurmctld slurmd \
             sinfo sacct sacctmgr scontrol squeue; do
        command -v "$b" >/dev/null 2>&1 || [[ -x /usr/sbin/$b ]] || missing+=("$b")
    done
    if ((MULTI)); then
        for b in ip ss nsenter unshare mountpoint hostname srun; do
            command -v "$b" >/dev/null 2>&1 || [[ -x /usr/sbin/$b ]] || missing+=("$b")
        done
    fi
    if [[ ${#missing[@]} -gt 0 ]]; then
        die "missing programs: ${missing[*]}. Install them with: $APT_HINT$( ((MULTI)) && echo " iproute2 util-linux")"
    fi
}

# wait_for DESC TIMEOUT LOGFILE CMD...: poll CMD every 0.5 s; on timeout show the log and exit 1.
wait_for() {
    local desc=$1 timeout=$2 logfile=$3 deadline
    shift 3
    deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            say "timed out after ${timeout}s waiting for $desc; last lines of $logfile:"
            tail -n 30 -- "$logfile" 2>/dev/null | sed 's/^/[slurm]   /' || true
            exit 1
        fi
        sleep 0.5
    done
}

# The node name must resolve or slurmctld/slurmd refuse to start.
ensure_hostname() {
    if ! getent hosts "$NODE" >/dev/null 2>&1; then
        say "hostname $NODE does not resolve: adding '127.0.0.1 $NODE' to /etc/hosts"
        printf '127.0.0.1 %s\n' "$NODE" >>/etc/hosts
    fi
}

make_dirs() {
    mkdir -p -- "$ETC" "$LOG" "$RUN" "$SPOOL" "$CTLD_STATE"
    chmod 755 -- "$STATE" "$ETC" "$LOG" "$RUN"
    if ((MULTI)); then
        local n
        for n in "${NODE_NAMES[@]}"; do mkdir -p -- "$SPOOL/$n" "$NODE_TMP/$n"; done
        # TmpFS is the jobs' /tmp: any user may write there, as in /tmp.
        chmod 1777 -- "${NODE_NAMES[@]/#/$NODE_TMP/}"
    fi
}

# munged: reuse any munged that already answers (e.g. the system one); else start our own as
# user munge on the default socket so that every client finds it without configuration.
start_munged() {
    local pid
    if pid=$(running munged); then
        say "munged: already running (ours, PID $pid)"; return
    fi
    rm -f -- "$(pid_file munged)"
    if munge_works; then
        say "munged: reusing the munged already answering on the default socket (not ours, will not stop it)"
        return
    fi
    if [[ ! -s /etc/munge/munge.key ]]; then
        say "munged: creating /etc/munge/munge.key"
        mkdir -p /etc/munge
        if command -v mungekey >/dev/null 2>&1 || [[ -x /usr/sbin/mungekey ]]; then
            mungekey --create --keyfile=/etc/munge/munge.key --force
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
        fi
    fi
    chown munge:munge /etc/munge /etc/munge/munge.key
    chmod 700 /etc/munge
    chmod 400 /etc/munge/munge.key
    # munged refuses a socket dir it does not own; /run is a tmpfs so this vanishes on reboot.
    mkdir -p /run/munge /var/lib/munge
    chown munge:munge /run/munge /var/lib/munge
    chmod 755 /run/munge
    # munged runs as munge but our run/ and log/ are root's: pre-create its two files owned by
    # munge. (It logs a harmless "Failed to remove PIDfile" because it cannot unlink in run/.)
    local pf=$RUN/munged.pid lf=$LOG/munged.log
    : >"$pf"; touch -- "$lf"
    chown munge:munge -- "$pf" "$lf"
    say "munged: starting as user munge (log $lf)"
    runuser -u munge -- munged --pid-file="$pf" --log-file="$lf" </dev/null >>"$lf" 2>&1 \
        || { tail -n 20 -- "$lf" | sed 's/^/[slurm]   /'; die "munged failed to start"; }
    wait_for "munged to answer" 15 "$lf" munge_works
}

# The settings both clusters share (single node and multi-node), verified on this machine.
# An unquoted heredoc: no backquotes or $( in its comments, which the shell would run while
# writing the file (a quoted `scontrol ...` here once cost every fresh start a minute).
# The Preempt* keys must stand before the NodeName and PartitionName lines (slurmctld ignores
# them after), which is where conf_essentials goes.
preemption_conf() {
    ((PREEMPTION)) || return 0
    cat <<EOF
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
EOF
}

# partition_lines NODES: the default partition, and with preemption the tier that preempts it.
# GraceTime=30: at its start Slurm signals the preempted job's steps (SIGTERM), at its end the
# batch step, then SIGKILL after KillWait.
partition_lines() {
    if ((PREEMPTION)); then
        echo "PartitionName=debug Nodes=$1 Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=30"
        echo "PartitionName=urgent Nodes=$1 MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF"
    else
        echo "PartitionName=debug Nodes=$1 Default=YES MaxTime=INFINITE State=UP"
    fi
}

conf_essentials() {
    cat <<EOF
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job waits cred_expire + 1 s as PENDING (BeginTime) before it may start again, so
# this sets the cost of every requeue in the tests (16-24 of them in CI's critical path). The
# default 120 s would make each wait over 2 minutes; 5 is the least Slurm accepts (below it,
# it falls back to the default without a word).
AuthInfo=cred_expire=5
SlurmctldPort=$SLURMCTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$CTLD_STATE
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in the sandbox.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# Jobs choose srun --mpi=pmix (Debian's Open MPI has no Slurm PMI-2 client).
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Lets a node claim more CPUs than the machine's core count.
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
# A submitted or requeued job starts within a second or two instead of the defaults' 30-60 s
# (bf_interval=30, sched_interval=60): every test job waits that long otherwise.
SchedulerParameters=bf_interval=1,sched_interval=2
# Jobs are requeueable unless they say otherwise: the requeue tests need it, as most sites do.
JobRequeue=1
# A node that went down (the node-failure tests crash one) returns to service when its slurmd
# registers again, without an admin's scontrol update ... state=resume.
ReturnToService=2
# SIGTERM to SIGKILL at a job's end: 5 s is what the stop tests give the ranks to save and exit
# (sites keep 30-60 s); shorter makes a save on a loaded machine fail for no reason of ours.
KillWait=5
# A job is ended at its time limit, no grace minutes: the time-limit tests end when they should.
OverTimeLimit=0
# A finished job stays in slurmctld's memory (squeue, scontrol show job) for 5 minutes, long
# enough for the tests that read it after the end; sacct keeps it for good.
MinJobAge=300
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$SLURMDBD_PORT
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
# No mail in the sandbox; the default /bin/mail is missing and slurmctld logs an error.
MailProg=/bin/true
$(preemption_conf)
EOF
}

write_configs() {
    if ((MULTI)); then write_nodes_conf; else write_slurm_conf; fi
    write_dbd_conf
}

# The single node declares 8 CPUs whatever the machine has: four 2-rank jobs of the shipped CPU
# specs at once. CI runs two test modules on this node side by side (.ci/run), each submitting
# its jobs together; with room for two jobs only, one module's jobs queued behind the other's
# and the wait tested nothing. The ranks share the real cores (nothing binds them: TaskPlugin
# task/none), which a development cluster may: a job's speed is not what runs here.
NODE_CPUS=8

write_slurm_conf() {
    local mem_mb
    # RealMemory a bit below MemTotal: slurmd drains a node that reports less than configured.
    mem_mb=$(awk '/^MemTotal:/ {printf "%d", $2 * 0.85 / 1024}' /proc/meminfo)
    say "config: writing $CONF (node $NODE, CPUs=$NODE_CPUS, RealMemory=${mem_mb}M)"
    cat >"$CONF.tmp" <<EOF
$SLURM_MARKER
# Regenerated on every start: edit env/slurm/start.sh, not this file.
ClusterName=$CLUSTER_NAME
SlurmctldHost=$NODE(127.0.0.1)
SlurmdSpoolDir=$SPOOL
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
$(conf_essentials)
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$NODE_CPUS RealMemory=$mem_mb State=UNKNOWN
$(partition_lines "$NODE")
EOF
    mv -f -- "$CONF.tmp" "$CONF"
    chmod 644 -- "$CONF"
}

start_slurmctld() {
    local pid
    if pid=$(running slurmctld); then
        say "slurmctld: already running (ours, PID $pid)"; return
    fi
    rm -f -- "$(pid_file slurmctld)"
    say "slurmctld: starting (log $LOG/slurmctld.log)"
    # -i: ignore unreadable state files instead of refusing to start after a hard kill.
    setsid slurmctld -i -f "$CONF" </dev/null >>"$LOG/slurmctld.log" 2>&1
    wait_for "slurmctld to answer" 30 "$LOG/slurmctld.log" ctld_up
}

ctld_up() { timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP'; }

start_slurmd() {
    local pid
    if pid=$(running slurmd); then
        say "slurmd: already running (ours, PID $pid)"; return
    fi
    rm -f -- "$(pid_file slurmd)"
    say "slurmd: starting (log $LOG/slurmd.log)"
    setsid slurmd -f "$CONF" </dev/null >>"$LOG/slurmd.log" 2>&1
}

node_state() { timeout 5 sinfo -h -n "$NODE" -o %T 2>/dev/null | head -n 1; }

# Wait for the node to be idle; resume it if it was left DOWN/DRAINED by an earlier run.
wait_node_idle() {
    local deadline state last_resume=-100
    deadline=$((SECONDS + WAIT_TIMEOUT))
    while :; do
        state=$(node_state) || true
        case $state in
            idle|mixed|allocated|idle+*|mixed+*|allocated+*) say "node $NODE: $state"; return 0 ;;
            *drain*|down*|fail*)
                if ((SECONDS - last_resume >= 5)); then
                    say "node $NODE is '$state': resuming it"
                    timeout 5 scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
                    last_resume=$SECONDS
                fi ;;
        esac
        if ((SECONDS >= deadline)); then
            say "timed out after ${WAIT_TIMEOUT}s: node $NODE is '${state:-no answer}'"
            for f in slurmd slurmctld; do
                say "last lines of $LOG/$f.log:"
                tail -n 20 -- "$LOG/$f.log" 2>/dev/null | sed 's/^/[slurm]   /' || true
            done
            timeout 5 scontrol show node "$NODE" 2>/dev/null | grep -E 'State|Reason' | sed 's/^/[slurm]   /' || true
            exit 1
        fi
        sleep 0.5
    done
}

# /etc/slurm/slurm.conf lets clients (sbatch, sacct, Python subprocesses) find our config with no
# environment. Only replace it if it is missing or already one of our symlinks.
link_etc_conf() {
    if [[ -L $ETC_SLURM_CONF && $(readlink -- "$ETC_SLURM_CONF") == "$CONF" ]]; then
        say "clients: $ETC_SLURM_CONF already points to $CONF"
    elif [[ ! -e $ETC_SLURM_CONF && ! -L $ETC_SLURM_CONF ]] || etc_conf_is_ours; then
        mkdir -p -- "$(dirname "$ETC_SLURM_CONF")"
        ln -sfn -- "$CONF" "$ETC_SLURM_CONF"
        say "clients: linked $ETC_SLURM_CONF -> $CONF"
    else
        say "clients: $ETC_SLURM_CONF is a site file; left untouched. You MUST run: export SLURM_CONF=$CONF"
    fi
}

# ports_free: none of our host ports is taken (by now none of our daemons runs), e.g. by the
# multi-node cluster of another state dir: fail before touching anything, not halfway through.
ports_free() {
    local p busy=""
    for p in "$DB_PORT" "$SLURMCTLD_PORT" "$SLURMDBD_PORT"; do
        if [[ -n $(ss -Hltn "sport = :$p" 2>/dev/null) ]]; then
            busy+=" $p ($(ss -Hltnp "sport = :$p" 2>/dev/null | grep -o 'users:.*' | head -n 1))"
        fi
    done
    [[ -z $busy ]] || die "ports in use:$busy. Another multi-node cluster (state dir $(cat -- "$NET_OWNER_FILE" 2>/dev/null || echo unknown))? Stop it first"
}

# Fast path: all our daemons alive and the controller answers (multi-node: and the network and
# node list are those asked for).
already_running() {
    local d
    for d in "${DAEMONS[@]:1}"; do
        running "$d" >/dev/null || return 1
    done
    if ((MULTI)); then
        net_ok || return 1
        [[ $(cat -- "$NODES_FILE" 2>/dev/null) == "$(paste -d' ' <(printf '%s\n' "${NODE_NAMES[@]}") <(printf '%s\n' "${NODE_ADDRS[@]}"))" ]] || return 1
    fi
    running munged >/dev/null || munge_works || return 1
    timeout 5 sinfo -h >/dev/null 2>&1
}

main() {
    parse_args "$@"
    require_root
    check_binaries

    if [[ -d $STATE ]] && already_running; then
        if ((MULTI)); then
            say "already running (state $STATE, cluster $CLUSTER_NAME, nodes: $(timeout 5 sinfo -h -N -o '%N=%T' 2>/dev/null | paste -sd' '))"
        else
            say "already running (state $STATE, node $NODE: $(node_state))"
            link_etc_conf
        fi
        echo "export SLURM_CONF=$CONF"
        exit 0
    fi
    if compgen -G "$RUN/*.pid" >/dev/null; then
        say "partial state in $RUN: stopping what is left, then starting fresh (data kept)"
        stop_all_daemons || die "could not stop leftover daemons; see above"
    fi
    if ((MULTI)); then
        # The network is cheap to build: rebuild it from scratch rather than repair it.
        [[ ! -e $NET_CREATED ]] || net_down
        ports_free
    fi

    say "state dir: $STATE"
    ensure_hostname
    make_dirs
    start_munged
    write_configs
    start_mariadbd
    start_slurmdbd
    register_cluster
    if ((MULTI)); then
        net_up
        start_slurmctld
        start_node_slurmds
        wait_nodes_ready
        wait_for "sacct to answer" 30 "$LOG/slurmdbd.log" timeout 10 sacct -n -X -S now-1hour
        check_pmix
        say "cluster $CLUSTER_NAME is up: nodes $(awk '{printf "%s%s=%s", (NR > 1 ? " " : ""), $1, $2}' "$NODES_FILE"), controller $NODE=$CTL_ADDR:$SLURMCTLD_PORT; /etc/slurm untouched"
        echo "export SLURM_CONF=$CONF"
        return
    fi
    start_slurmctld
    start_slurmd
    wait_node_idle
    wait_for "sacct to answer" 30 "$LOG/slurmdbd.log" timeout 10 sacct -n -X -S now-1hour
    link_etc_conf
    say "cluster $CLUSTER_NAME is up: node $NODE idle, accounting on"
    echo "export SLURM_CONF=$CONF"
}

main "$@"
