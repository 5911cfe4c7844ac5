# Fake hosts for multi-host tests: network namespaces joined by veth pairs to a bridge that
# lives in a namespace of its own (nothing is added to the root namespace's network), each
# "remote" host running Debian's sshd on its own address with a throw-away host key and an
# authorized throw-away user key. Source this file from bash; see tests/launcher/multihost/.
#
#   netns_hosts_up N     makes the switch, a launcher host L (10.233.0.1) and hosts
#                        H1..HN (10.233.0.11, .12, ...) with sshd on port $NETNS_SSH_PORT.
#                        Sets NETNS_L, NETNS_H[i], NETNS_ADDR[i], NETNS_DIR, NETNS_SSH_CONFIG,
#                        NETNS_SSH_KEY. Exits 77 (skip) when namespaces cannot be made.
#   netns_hosts_down     stops every process in the namespaces, deletes them and the keys.
#                        Installed as an EXIT trap by netns_hosts_up; safe to call twice.
#   netns_run_l CMD...   runs CMD on the launcher host.
#   netns_leftovers I    prints the pids in host I's namespace other than its sshd listener.
#
# Addresses are 10.233.0.0/24 inside the namespaces only; every wait is bounded.

NETNS_SKIP=77
NETNS_SSH_PORT=2222
NETNS_SUBNET=10.233.0

netns_log() { echo "netns: $*" >&2; }

netns_hosts_down() {
  local ns pid i
  for ns in "${NETNS_ALL[@]+"${NETNS_ALL[@]}"}"; do
    [ -n "$ns" ] || continue
    # Every process in the namespace: TERM, a bounded wait, then KILL.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null; done
    for i in $(seq 1 20); do
      [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break
      sleep 0.1
    done
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  NETNS_ALL=()
  if [ -n "${NETNS_DIR:-}" ] && [ -d "$NETNS_DIR" ]; then rm -rf "$NETNS_DIR"; fi
  NETNS_DIR=""
}

# netns_wait_port NS ADDR PORT: until something listens there (at most 5 s).
netns_wait_port() {
  local i
  for i in $(seq 1 50); do
    if ip netns exec "$1" ss -Hltn "src $2:$3" 2>/dev/null | grep -q LISTEN; then return 0; fi
    sleep 0.1
  done
  return 1
}

netns_start_sshd() {
  local i=$1 ns=${NETNS_H[$1]} addr=${NETNS_ADDR[$1]}
  local cfg="$NETNS_DIR/sshd_config.$i"
  cat > "$cfg" <<CFG
ListenAddress $addr:$NETNS_SSH_PORT
HostKey $NETNS_DIR/host_key
PidFile none
AuthorizedKeysFile $NETNS_DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
PrintLastLog no
X11Forwarding no
AllowTcpForwarding no
AllowAgentForwarding no
PermitUserEnvironment no
MaxStartups 100:30:200
MaxSessions 100
LogLevel ERROR
CFG
  mkdir -p /run/sshd  # sshd's privilege-separation directory (Debian's service makes it too)
  ip netns exec "$ns" /usr/sbin/sshd -D -f "$cfg" -E "$NETNS_DIR/sshd.$i.log" &
  NETNS_SSHD_PID[$i]=$!
  if ! netns_wait_port "$ns" "$addr" "$NETNS_SSH_PORT"; then
    netns_log "sshd on $ns did not start:"; cat "$NETNS_DIR/sshd.$i.log" >&2
    return 1
  fi
}

netns_add_host() {  # NAME ADDR
  ip netns add "$1" || return 1
  NETNS_ALL+=("$1")
  ip -n "$1" link set lo up
  ip link add eth0 netns "$1" type veth peer name "p$2" netns "$NETNS_SW" || return 1
  ip -n "$NETNS_SW" link set "p$2" master br0 up
  ip -n "$1" addr add "$NETNS_SUBNET.$2/24" dev eth0
  ip -n "$1" link set eth0 up
}

# A run killed with SIGKILL (a CTest timeout) cannot clean up after itself: the next run
# removes the namespaces and directories of runs whose shell is gone.
netns_pid_alive() {  # a zombie counts as gone
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  [[ "$stat" != *") Z "* ]]
}

netns_sweep_stale() {
  local ns pid dir
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^hvdt[0-9]+(sw|l|h[0-9]+)$'); do
    pid=${ns#hvdt}; pid=${pid%%[!0-9]*}
    netns_pid_alive "$pid" && continue
    netns_log "removing $ns, left by a run (pid $pid) that is gone"
    NETNS_ALL=("$ns")
    NETNS_DIR=""
    netns_hosts_down
  done
  for dir in /tmp/hvd_netns.[0-9]*.*; do
    [ -d "$dir" ] || continue
    pid=${dir#/tmp/hvd_netns.}; pid=${pid%%.*}
    netns_pid_alive "$pid" || rm -rf "$dir"
  done
}

netns_hosts_up() {
  local n=$1 tag i
  NETNS_ALL=()
  trap netns_hosts_down EXIT
  trap 'exit 130' INT TERM
  netns_sweep_stale
  NETNS_ALL=()
  tag="hvdt$$"
  NETNS_SW="${tag}sw"
  if ! ip netns add "$NETNS_SW" 2>/dev/null; then
    echo "SKIP: cannot create network namespaces here (needs root and CAP_SYS_ADMIN)"
    exit $NETNS_SKIP
  fi
  NETNS_ALL+=("$NETNS_SW")
  for tool in /usr/sbin/sshd ssh ssh-keygen ss; do
    if ! command -v "$tool" > /dev/null; then
      echo "SKIP: $tool is not installed (scripts/install_deps.sh installs it)"; exit $NETNS_SKIP
    fi
  done
  ip -n "$NETNS_SW" link add br0 type bridge || return 1
  ip -n "$NETNS_SW" link set br0 up
  NETNS_DIR=$(mktemp -d "/tmp/hvd_netns.$$.XXXXXX")
  chmod 700 "$NETNS_DIR"
  NETNS_L="${tag}l"
  netns_add_host "$NETNS_L" 1 || return 1
  NETNS_H=() NETNS_ADDR=() NETNS_SSHD_PID=()
  for i in $(seq 1 "$n"); do
    NETNS_H[$i]="${tag}h$i"
    NETNS_ADDR[$i]="$NETNS_SUBNET.$((10 + i))"
    netns_add_host "${NETNS_H[$i]}" $((10 + i)) || return 1
  done
  ssh-keygen -q -t ed25519 -N '' -C hvd-test-host -f "$NETNS_DIR/host_key" || return 1
  ssh-keygen -q -t ed25519 -N '' -C hvd-test-user -f "$NETNS_DIR/user_key" || return 1
  cp "$NETNS_DIR/user_key.pub" "$NETNS_DIR/authorized_keys"
  NETNS_SSH_KEY="$NETNS_DIR/user_key"
  NETNS_SSH_CONFIG="$NETNS_DIR/ssh_config"
  : > "$NETNS_DIR/known_hosts"
  for i in $(seq 1 "$n"); do
    echo "[${NETNS_ADDR[$i]}]:$NETNS_SSH_PORT $(cut -d' ' -f1,2 "$NETNS_DIR/host_key.pub")" \
      >> "$NETNS_DIR/known_hosts"
    netns_start_sshd "$i" || return 1
  done
  cat > "$NETNS_SSH_CONFIG" <<CFG
Host *
  User root
  UserKnownHostsFile $NETNS_DIR/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  IdentitiesOnly yes
  PasswordAuthentication no
  KbdInteractiveAuthentication no
  LogLevel ERROR
CFG
}

netns_run_l() { ip netns exec "$NETNS_L" "$@"; }

netns_leftovers() {
  local pid
  for pid in $(ip netns pids "${NETNS_H[$1]}" 2>/dev/null); do
    [ "$pid" = "${NETNS_SSHD_PID[$1]}" ] || echo "$pid"
  done
}

# Faults on a host's link. The kernels here have no netem, so loss is an nftables rule and a
# slow link a token bucket; netem delay is used only where the kernel has it.
#   netns_loss PCT          the switch drops PCT% of the frames it forwards (bridge forward
#                           hook, numgen random), and every host sends one frame per packet:
#                           loss on the wire, which TCP sees as such (a drop in a host's own
#                           output hook would be a local send error instead); 0 removes it
#   netns_rate I RATE       host I sends at most RATE (tc units, e.g. 50mbit) through a 2 MB
#                           queue; "" removes it
#   netns_netem_delay I MS  netem delay on host I's eth0; returns 1 when the kernel has no netem
#   netns_cut I / netns_heal I   the switch's port to host I down / up: a partition, no reset
#   netns_reboot I          a host lost at once: its port down, every process in it SIGKILLed,
#                           its namespace (and so its interfaces) deleted
netns_loss() {
  local sw="ip netns exec $NETNS_SW nft" ns
  $sw delete table bridge hvdfault 2>/dev/null
  # One frame per packet, as on a wire (else TCP hands the link 64 KB segments that drop whole).
  for ns in "$NETNS_L" "${NETNS_H[@]}"; do
    ip -n "$ns" link set eth0 gso_max_segs "$([ "$1" = 0 ] && echo 65535 || echo 1)"
  done
  [ "$1" = 0 ] && return 0
  $sw add table bridge hvdfault &&
    $sw add chain bridge hvdfault lossy '{ type filter hook forward priority 0; policy accept; }' &&
    $sw add rule bridge hvdfault lossy numgen random mod 100 '<' "$1" counter drop
}

netns_loss_count() {  # frames the switch dropped since netns_loss
  ip netns exec "$NETNS_SW" nft list chain bridge hvdfault lossy 2>/dev/null |
    sed -n 's/.*counter packets \([0-9]*\).*/\1/p'
}

netns_rate() {
  local ns=${NETNS_H[$1]}
  tc -n "$ns" qdisc del dev eth0 root 2>/dev/null
  [ -z "$2" ] && return 0
  tc -n "$ns" qdisc add dev eth0 root tbf rate "$2" burst 32kb limit 2mb
}

netns_netem_delay() {
  tc -n "${NETNS_H[$1]}" qdisc replace dev eth0 root netem delay "${2}ms" 2>/dev/null
}

netns_cut() { ip -n "$NETNS_SW" link set "p$((10 + $1))" down; }
netns_heal() { ip -n "$NETNS_SW" link set "p$((10 + $1))" up; }

netns_reboot() {
  local ns=${NETNS_H[$1]} pid
  netns_cut "$1"
  for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
  wait "${NETNS_SSHD_PID[$1]}" 2>/dev/null  # reaps sshd quietly
  ip netns del "$ns" 2>/dev/null
}
