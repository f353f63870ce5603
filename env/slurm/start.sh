#!/usr/bin/env bash
# Start a private single-node Slurm 22.05 cluster (with accounting) without systemd.
#
#   bash env/slurm/start.sh [--state-dir DIR] [--nodes N]
#
# Order: munged -> private mariadbd -> slurmdbd -> slurmctld -i -> slurmd, then wait until the
# node is idle and sacct answers. Idempotent: if our daemons already run and sinfo answers it
# exits at once. Stop with env/slurm/stop.sh (same --state-dir).
#
# --nodes N (N >= 2): a second, independent cluster (hpctrainnodes) of N compute nodes hpcn1..N,
# each a slurmd in its own network/UTS/mount namespace on a private bridge (see netns.sh), with
# its own mariadbd/slurmdbd/slurmctld and ports. It can run next to the single-node one and never
# touches /etc/slurm: use it with the `export SLURM_CONF=...` line printed last.
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

# One DB password, generated once and kept in the state dir (only root can read it).
db_password() {
    if [[ ! -s $DB_PASS_FILE ]]; then
        (umask 077; od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$DB_PASS_FILE")
    fi
    chmod 600 -- "$DB_PASS_FILE"
    cat -- "$DB_PASS_FILE"
}

db_root() {  # run SQL as MariaDB root over our private socket (unix_socket auth: OS root)
    mariadb --no-defaults --protocol=socket --socket="$DB_SOCK" -uroot "$@"
}

db_ping() { db_root -N -e 'SELECT 1'; }

init_db() {
    say "mariadbd: initialising datadir $DB_DIR"
    mkdir -p -- "$DB_DIR"
    # root@localhost authenticates by unix_socket (OS root only): no password to keep around.
    if ! mariadb-install-db --no-defaults --user=root --datadir="$DB_DIR" \
            --auth-root-authentication-method=socket --skip-test-db --skip-name-resolve \
            >>"$LOG/mariadbd.log" 2>&1; then
        tail -n 30 -- "$LOG/mariadbd.log" | sed 's/^/[slurm]   /'
        die "mariadb-install-db failed"
    fi
}

launch_mariadbd() {
    rm -f -- "$DB_SOCK" "$(pid_file mariadbd)"
    # A small buffer pool on purpose: slurmdbd logs "Database settings not recommended values:
    # innodb_buffer_pool_size" (it wants >= 512M); harmless for a one-node test cluster.
    # setsid + /dev/null stdio: the daemon must not hold the caller's terminal or pipes
    # (a pytest subprocess capturing our output would otherwise wait for it forever).
    setsid mariadbd --no-defaults --user=root --datadir="$DB_DIR" --socket="$DB_SOCK" \
        --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
        --pid-file="$(pid_file mariadbd)" --log-error="$LOG/mariadbd.log" \
        --innodb-buffer-pool-size=128M --innodb-log-file-size=64M --innodb-lock-wait-timeout=900 \
        </dev/null >>"$LOG/mariadbd.log" 2>&1 &
    local deadline=$((SECONDS + 30))
    until db_ping >/dev/null 2>&1; do
        if ((SECONDS >= deadline)) || ! kill -0 $! 2>/dev/null; then
            return 1
        fi
        sleep 0.5
    done
}

start_mariadbd() {
    local pid pass
    if pid=$(running mariadbd); then
        say "mariadbd: already running (ours, PID $pid)"
    else
        [[ -d $DB_DIR/mysql ]] || init_db
        say "mariadbd: starting on 127.0.0.1:$DB_PORT (datadir $DB_DIR)"
        if ! launch_mariadbd; then
            # A datadir that no longer starts is not worth debugging here: keep it aside, start
            # fresh (accounting history is lost, but the cluster comes up).
            local aside
            aside=$DB_DIR.broken-$(date +%Y%m%d-%H%M%S)
            say "mariadbd: failed to start with the existing datadir; moving it to $aside and re-initialising"
            tail -n 15 -- "$LOG/mariadbd.log" | sed 's/^/[slurm]   /'
            stop_daemon mariadbd 10 || true
            mv -- "$DB_DIR" "$aside"
            init_db
            launch_mariadbd || { tail -n 30 -- "$LOG/mariadbd.log" | sed 's/^/[slurm]   /'; die "mariadbd failed to start"; }
        fi
    fi
    # slurmdbd connects over TCP to 127.0.0.1, which with skip-name-resolve is host '127.0.0.1'.
    pass=$(db_password)
    say "mariadbd: ensuring DB user slurm with rights on slurm_acct_db"
    db_root <<SQL
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pass';
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$pass';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
FLUSH PRIVILEGES;
SQL
}

# The settings both clusters share (single node and multi-node), verified on this machine.
conf_essentials() {
    cat <<EOF
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
SchedulerParameters=bf_interval=1,sched_interval=2
JobRequeue=1
ReturnToService=2
KillWait=5
OverTimeLimit=0
MinJobAge=300
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$SLURMDBD_PORT
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
# No mail in the sandbox; the default /bin/mail is missing and slurmctld logs an error.
MailProg=/bin/true
EOF
}

write_configs() {
    if ((MULTI)); then write_nodes_conf; else write_slurm_conf; fi
    write_dbd_conf
}

write_slurm_conf() {
    local mem_mb
    # RealMemory a bit below MemTotal: slurmd drains a node that reports less than configured.
    mem_mb=$(awk '/^MemTotal:/ {printf "%d", $2 * 0.85 / 1024}' /proc/meminfo)
    say "config: writing $CONF (node $NODE, CPUs=4, RealMemory=${mem_mb}M)"
    cat >"$CONF.tmp" <<EOF
$SLURM_MARKER
# Regenerated on every start: edit env/slurm/start.sh, not this file.
ClusterName=$CLUSTER_NAME
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire default 120 s makes every requeue wait over 2 minutes; 2 is rejected.
AuthInfo=cred_expire=10
SlurmctldPort=$SLURMCTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$CTLD_STATE
SlurmdSpoolDir=$SPOOL
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
$(conf_essentials)
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=4 RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
    mv -f -- "$CONF.tmp" "$CONF"
    chmod 644 -- "$CONF"
}

# The multi-node slurm.conf: the essentials of the single-node one, per-node paths (%n = node
# name), and the controller on the bridge address, which every namespace reaches.
write_nodes_conf() {
    local mem_mb i nodelines=""
    # Every slurmd sees the whole machine: share 85% of MemTotal between the nodes.
    mem_mb=$(awk -v n="$NODES" '/^MemTotal:/ {printf "%d", $2 * 0.85 / 1024 / n}' /proc/meminfo)
    ((mem_mb >= 2048)) || say "config: WARNING: only ${mem_mb}M per node; jobs asking --mem=2G per node will not run"
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
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10
SlurmctldPort=$SLURMCTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$CTLD_STATE
SlurmdSpoolDir=$SPOOL/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
# All nodes share /tmp, and mpi/pmix creates the same /tmp/spmix_appdir_* on each: one TmpFS each.
TmpFS=$NODE_TMP/%n
$(conf_essentials)
${nodelines}PartitionName=debug Nodes=${NODE_PREFIX}[1-$NODES] Default=YES MaxTime=INFINITE State=UP
EOF
    mv -f -- "$CONF.tmp" "$CONF"
    chmod 644 -- "$CONF"
}

write_dbd_conf() {
    local pass
    pass=$(db_password)
    say "config: writing $DBD_CONF (mode 600)"
    (umask 077; cat >"$DBD_CONF.tmp" <<EOF
$SLURM_MARKER
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$SLURMDBD_PORT
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$pass
StorageLoc=slurm_acct_db
EOF
    )
    mv -f -- "$DBD_CONF.tmp" "$DBD_CONF"
    chown root:root -- "$DBD_CONF"
    chmod 600 -- "$DBD_CONF"   # slurmdbd refuses a world-readable config holding a password
}

sacctmgr_works() { timeout 5 sacctmgr -n -P list cluster format=cluster; }

start_slurmdbd() {
    local pid
    if pid=$(running slurmdbd); then
        say "slurmdbd: already running (ours, PID $pid)"
    else
        rm -f -- "$(pid_file slurmdbd)"
        say "slurmdbd: starting (log $LOG/slurmdbd.log)"
        setsid slurmdbd </dev/null >>"$LOG/slurmdbd.log" 2>&1
    fi
    wait_for "slurmdbd to answer sacctmgr" 30 "$LOG/slurmdbd.log" sacctmgr_works
}

# The cluster must exist in slurmdbd before slurmctld registers, or jobs are not accounted.
register_cluster() {
    if ! timeout 5 sacctmgr -n -P list cluster format=cluster | grep -qxF "$CLUSTER_NAME"; then
        say "accounting: adding cluster $CLUSTER_NAME"
        timeout 10 sacctmgr -i add cluster "$CLUSTER_NAME" >/dev/null
    fi
    # Adding a cluster creates account root and user root's association; make sure of it.
    if [[ -z $(timeout 5 sacctmgr -n -P list assoc cluster="$CLUSTER_NAME" user=root format=user) ]]; then
        say "accounting: adding association root/root on $CLUSTER_NAME"
        timeout 10 sacctmgr -i add user root account=root cluster="$CLUSTER_NAME" >/dev/null
    fi
    say "accounting: cluster $CLUSTER_NAME registered"
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
