# shellcheck shell=bash
# Accounting for start.sh: the private MariaDB, slurmdbd and the cluster's registration.
# Sourced by start.sh after lib.sh, never executed.

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
