# shellcheck shell=bash
# The network of the multi-node cluster (start.sh/stop.sh --nodes N). Sourced by lib.sh.
#
# Each compute node is one slurmd in its own network + UTS + mount namespace (hostname = node
# name), joined to the others by a private bridge through a veth pair. slurmctld, slurmdbd and
# mariadbd stay in the host namespace; the host has the bridge address, which is the controller's
# address in slurm.conf. Only NET_PREFIX.0/24 is used, on the bridge and in the namespaces, and
# the namespaces have no default route: no packet leaves this machine.
#
#   net/created      what we created, one "KIND NAME" line each (mount, dir, bridge, link, netns),
#                    so that stop.sh removes exactly that and nothing else
#   net/hosts        /etc/hosts inside every node: the node names and the controller (this host's
#                    short name) on the bridge address
#   net/resolv.conf  no nameserver, bind-mounted over /etc/resolv.conf in every node: a lookup of
#                    an unknown name fails at once inside the namespace instead of leaving it

NETNS_DIR=/run/netns
NODE_PREFIX=hpcn
BRIDGE=hpcnbr0

# net_vars: node names and addresses for $NODES nodes; called by parse_args.
net_vars() {
    local i
    NET_PREFIX=${HPC_TRAIN_SLURM_NODES_NET:-10.231.7}
    [[ $NET_PREFIX =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] \
        || die "HPC_TRAIN_SLURM_NODES_NET must be the first three octets of a /24 (got '$NET_PREFIX')"
    CTL_ADDR=$NET_PREFIX.1
    NET=$STATE/net
    NET_CREATED=$NET/created
    NODE_NAMES=() NODE_ADDRS=()
    for ((i = 1; i <= NODES; i++)); do
        NODE_NAMES+=("$NODE_PREFIX$i")
        NODE_ADDRS+=("$NET_PREFIX.$((10 + i))")
    done
}

# Interface names: at most 15 characters. Host end "hpcn1-br" on the bridge; the node end is
# created as "hpcn1-eth", moved into the namespace and renamed eth0 there.
veth_host() { printf '%s-br' "$1"; }
veth_node() { printf '%s-eth' "$1"; }

link_exists() { ip link show dev "$1" >/dev/null 2>&1; }
netns_exists() { [[ -e $NETNS_DIR/$1 ]]; }

net_record() { mkdir -p -- "$NET"; printf '%s %s\n' "$1" "$2" >>"$NET_CREATED"; }
net_recorded() { [[ -r $NET_CREATED ]] && grep -qxF -- "$1 $2" "$NET_CREATED"; }

# IPv6 off on our links: no link-local addresses, router solicitations or DAD on the bridge.
# Best effort (a kernel without IPv6 has no such file). NS empty = host namespace.
no_ipv6() {
    local ns=$1 f=/proc/sys/net/ipv6/conf/$2/disable_ipv6
    if [[ -z $ns ]]; then
        if [[ -w $f ]]; then echo 1 >"$f" 2>/dev/null || true; fi
    else
        # /proc/sys/net shows the network namespace of the process that reads it.
        nsenter --net="$NETNS_DIR/$ns" sh -c "[ -w $f ] && echo 1 >$f" 2>/dev/null || true
    fi
}

# Which state dir's cluster owns the names above (one multi-node cluster per machine at a time).
NET_OWNER_FILE=/run/hpc_train-slurm-nodes.owner

# our_leftovers: our kind of namespaces and links that exist now, whoever created them.
our_leftovers() {
    local f
    link_exists "$BRIDGE" && printf 'bridge %s\n' "$BRIDGE"
    for f in "$NETNS_DIR/$NODE_PREFIX"*; do
        [[ -e $f && ${f##*/} =~ ^${NODE_PREFIX}[0-9]+$ ]] && printf 'netns %s\n' "${f##*/}"
    done
    ip -o link show 2>/dev/null | awk -F': ' -v re="^${NODE_PREFIX}[0-9]+-br(@|$)" '$2 ~ re {sub(/@.*/, "", $2); print "link", $2}'
    return 0
}

# net_claim: make sure our names and our range are free before net_up. Names left by an earlier
# run whose processes are all gone (killed with its machine session, say, or another clone's
# state dir) are stale: removed, using that run's own net/created when it still exists. Names in
# use by live processes, or an address/route in our range that is not ours, stop us.
net_claim() {
    local left owner="" pids="" used kind name
    left=$(our_leftovers)
    if [[ -n $left ]]; then
        [[ -r $NET_OWNER_FILE ]] && owner=$(cat -- "$NET_OWNER_FILE")
        while read -r kind name; do
            [[ $kind == netns ]] && pids+=$(ip netns pids "$name" 2>/dev/null | tr '\n' ' ')
        done <<<"$left"
        if [[ -n ${pids// /} ]]; then
            die "network: $(echo "$left" | awk '{print $2}' | paste -sd' ') exist and processes run in them (PIDs ${pids% }): another multi-node cluster (state dir ${owner:-unknown}) is running; stop it first: bash env/slurm/stop.sh --state-dir ${owner:-DIR}"
        fi
        say "network: removing stale leftovers of an earlier multi-node cluster (state dir ${owner:-unknown}): $(echo "$left" | awk '{print $2}' | paste -sd' ')"
        if [[ -n $owner && $owner != "$STATE" && -r $owner/net/created ]]; then
            NET_CREATED=$owner/net/created net_down
        fi
        while read -r kind name; do
            case $kind in
                netns) if netns_exists "$name"; then ip netns del "$name"; fi ;;
                link|bridge) if link_exists "$name"; then ip link del "$name"; fi ;;
            esac
        done < <(our_leftovers | tac)
        [[ -z $(our_leftovers) ]] || die "network: could not remove $(our_leftovers | awk '{print $2}' | paste -sd' ')"
    fi
    # Any address or route in (or around, short of the default route) our /24 means it is in use.
    used=$(ip -4 -o addr show 2>/dev/null | awk -v p="$NET_PREFIX." 'index($4, p) == 1 {print $2, $4}')
    [[ -z $used ]] || die "network: $NET_PREFIX.0/24 is already used on this machine ($used); set HPC_TRAIN_SLURM_NODES_NET to a free private /24, e.g. 10.231.8"
    used=$(ip -4 route show table all match "$NET_PREFIX.0/24" 2>/dev/null | grep -vE '^(default|broadcast|local|unreachable) ' || true)
    used+=$(ip -4 route show table all root "$NET_PREFIX.0/24" 2>/dev/null | grep -vE '^(broadcast|local) ' || true)
    [[ -z $used ]] || die "network: a route covers $NET_PREFIX.0/24 ($used); set HPC_TRAIN_SLURM_NODES_NET to a free private /24"
    printf '%s\n' "$STATE" >"$NET_OWNER_FILE"
}

net_files() {
    local i
    mkdir -p -- "$NET"
    {
        printf '%s\n' "$SLURM_MARKER"
        printf '127.0.0.1 localhost\n%s %s\n' "$CTL_ADDR" "$NODE"
        for ((i = 0; i < NODES; i++)); do printf '%s %s\n' "${NODE_ADDRS[i]}" "${NODE_NAMES[i]}"; done
    } >"$NET/hosts"
    printf '%s\n# no nameserver: names resolve from /etc/hosts only\noptions timeout:1 attempts:1\n' \
        "$SLURM_MARKER" >"$NET/resolv.conf"
    chmod 644 -- "$NET/hosts" "$NET/resolv.conf"
    for ((i = 0; i < NODES; i++)); do printf '%s %s\n' "${NODE_NAMES[i]}" "${NODE_ADDRS[i]}"; done >"$NODES_FILE.tmp"
    mv -f -- "$NODES_FILE.tmp" "$NODES_FILE"
}

# net_add_netns NAME: `ip netns add` bind-mounts /run/netns onto itself the first time (and may
# create the directory); record that we did, so that stop.sh undoes it.
net_add_netns() {
    local had_dir=0 was_mount=0
    [[ -d $NETNS_DIR ]] && had_dir=1
    mountpoint -q "$NETNS_DIR" 2>/dev/null && was_mount=1
    ((had_dir)) || net_record dir "$NETNS_DIR"
    net_record netns "$1"
    ip netns add "$1" || die "network: ip netns add $1 failed"
    if ((!was_mount)) && mountpoint -q "$NETNS_DIR" 2>/dev/null; then
        net_record mount "$NETNS_DIR"
    fi
}

# net_up: bridge with the controller address, then per node a namespace with eth0 + lo.
net_up() {
    local i n addr
    net_claim
    net_files
    say "network: bridge $BRIDGE $CTL_ADDR/24, nodes ${NODE_NAMES[*]} on $NET_PREFIX.0/24"
    net_record bridge "$BRIDGE"
    ip link add "$BRIDGE" type bridge || die "network: cannot create bridge $BRIDGE"
    no_ipv6 "" "$BRIDGE"
    ip addr add "$CTL_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for ((i = 0; i < NODES; i++)); do
        n=${NODE_NAMES[i]} addr=${NODE_ADDRS[i]}
        net_add_netns "$n"
        net_record link "$(veth_host "$n")"
        ip link add "$(veth_host "$n")" type veth peer name "$(veth_node "$n")"
        no_ipv6 "" "$(veth_host "$n")"
        ip link set "$(veth_node "$n")" netns "$n"
        ip link set "$(veth_host "$n")" master "$BRIDGE" up
        ip -n "$n" link set "$(veth_node "$n")" name eth0
        no_ipv6 "$n" eth0
        ip -n "$n" addr add "$addr/24" dev eth0
        ip -n "$n" link set eth0 up
        ip -n "$n" link set lo up
    done
}

# net_ok: the network of a running cluster is complete (fast path of start.sh).
net_ok() {
    local n
    link_exists "$BRIDGE" && net_recorded bridge "$BRIDGE" || return 1
    for n in "${NODE_NAMES[@]}"; do netns_exists "$n" || return 1; done
}

# net_down: remove what net/created lists: namespaces, links and bridge newest first, then the
# /run/netns mount and directory (unmounted only when no namespace is left in it). Absent things
# are skipped, so it is idempotent.
net_down() {
    local kind name left
    [[ -r $NET_CREATED ]] || return 0
    while read -r kind name; do
        case $kind in
            netns) if netns_exists "$name"; then ip netns del "$name" && say "network: removed namespace $name"; fi ;;
            link) if link_exists "$name"; then ip link del "$name" && say "network: removed link $name"; fi ;;
            bridge) if link_exists "$name"; then ip link del "$name" && say "network: removed bridge $name"; fi ;;
        esac
    done < <(tac -- "$NET_CREATED")
    if net_recorded mount "$NETNS_DIR" && mountpoint -q "$NETNS_DIR" 2>/dev/null; then
        left=$(find "$NETNS_DIR" -mindepth 1 -maxdepth 1 -printf '%f ' 2>/dev/null)
        if [[ -n $left ]]; then
            say "network: $NETNS_DIR still holds namespaces we did not create (${left% }); leaving it mounted"
        else
            umount -- "$NETNS_DIR" && say "network: unmounted $NETNS_DIR"
        fi
    fi
    if net_recorded dir "$NETNS_DIR" && [[ -d $NETNS_DIR ]] && ! mountpoint -q "$NETNS_DIR" 2>/dev/null; then
        rmdir -- "$NETNS_DIR" 2>/dev/null || true
    fi
    rm -f -- "$NET_CREATED"
    if [[ -r $NET_OWNER_FILE && $(cat -- "$NET_OWNER_FILE") == "$STATE" ]]; then
        rm -f -- "$NET_OWNER_FILE"
    fi
}

# node_argv NODE: sets NODE_ARGV to the command prefix that runs a command in NODE's network
# namespace, in a new UTS namespace with the node's hostname and a new mount namespace with our
# hosts/resolv.conf bind-mounted. Not `ip netns exec`: it remounts /sys, which hides
# /sys/fs/cgroup, and slurmd 22.05 then refuses to start. Usage: "${NODE_ARGV[@]}" CMD ARGS...
# (an argv, not a function, so that setsid can run it).
node_argv() {
    # shellcheck disable=SC2016  # $1.. are expanded by the inner sh
    NODE_ARGV=(nsenter "--net=$NETNS_DIR/$1" unshare --uts --mount -- /bin/sh -c '
        hostname "$1" && mount --bind "$2" /etc/hosts && mount --bind "$3" /etc/resolv.conf || exit 1
        shift 3
        exec "$@"' node_exec "$1" "$NET/hosts" "$NET/resolv.conf")
}
