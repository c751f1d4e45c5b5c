#!/usr/bin/env bash
# A CMS cluster on this machine, without Kubernetes: one ZooKeeper, N bookies
# and M brokers as background processes on loopback (free ports), with all
# data and logs under one directory. The interface below is a contract that
# scripts (scripts/bench-suite) and tests (tests/tests/local_cluster.rs)
# depend on: keep it stable.
#
#   cluster.sh up DIR [--bookies N] [--brokers M] [--ensemble E]
#                     [--write-quorum QW] [--ack-quorum QA]
#                     [--bookie-config FILE] [--broker-config FILE]
#       Starts ZooKeeper, runs `cms-broker init-cluster` (cluster `local`,
#       tenant public, namespace public/default), then the bookies and the
#       brokers; returns once every process answers ready (ZooKeeper `ruok`,
#       bookies and brokers `GET /ready`), each within $CMS_READY_TIMEOUT_S
#       (default 60) seconds. Defaults: 3 bookies, 2 brokers, ledgers
#       E3 / Qw3 / Qa2 (with fewer bookies: E = Qw = bookies, Qa = min(2, Qw));
#       E, Qw, Qa must satisfy Qa <= Qw <= E <= bookies. --bookie-config /
#       --broker-config append a TOML file's lines to every bookie's / broker's
#       generated config (keys are the long flag names with `_`).
#       Refuses a DIR that holds a cluster (running or stopped): use a new DIR.
#       On a failure it prints the failing process's log tail, stops what it
#       started and exits non-zero.
#   cluster.sh status DIR
#       One tab-separated line per process started, in start order:
#         role  id  pid  service_url  admin_url
#       zookeeper  zk1      PID  zk://127.0.0.1:PORT      -
#       bookie     b1..bN   PID  grpc://127.0.0.1:PORT    http://127.0.0.1:PORT
#       broker     broker1..brokerM PID pulsar://127.0.0.1:PORT http://127.0.0.1:PORT
#       (ZooKeeper's service_url is the `--metadata-url` our binaries take.)
#       Exit 0; a line whose process is no longer running is still printed,
#       with a warning on stderr.
#   cluster.sh logs DIR [ID]
#       Without ID: the last 40 lines of every process's log. With ID (zk1, b2,
#       broker1, ...): that process's whole log.
#   cluster.sh down DIR
#       Stops only the processes recorded in DIR (brokers, then bookies, then
#       ZooKeeper): SIGTERM by PID, wait up to $CMS_STOP_TIMEOUT_S (default
#       15) seconds, then SIGKILL. A PID is signalled only while its command
#       line still names DIR (a reused PID is left alone). Data stays in DIR.
#
# Binaries: $CMS_BIN_DIR (default <repo>/target/release), built beforehand
# (`cargo build --release -p cms-broker -p cms-bookie --bins`). ZooKeeper: the
# Debian `zookeeper` package (java + /usr/share/java/zookeeper.jar).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin_dir="${CMS_BIN_DIR:-$repo/target/release}"
ready_timeout_s="${CMS_READY_TIMEOUT_S:-60}"
stop_timeout_s="${CMS_STOP_TIMEOUT_S:-15}"
java="${CMS_JAVA:-/usr/bin/java}"
zk_cp="/etc/zookeeper/conf:/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar"

die() { echo "cluster.sh: $*" >&2; exit 1; }
usage() {
  sed -n '/^#   cluster.sh up/,/^#       line still names DIR/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# A free loopback TCP port for a process about to start. It comes from below
# the kernel's ephemeral range (as the test harness's ports do), so no
# outgoing connection or port-0 listener of another process can take it
# before the process binds it (a bench run once failed on exactly that: a
# broker's HTTP port, handed out by the kernel, was in use when it bound);
# it is not one this cluster already got ($DIR/ports), and not one a running
# test process holds (its lock in $TMPDIR/cms-test-ports). Ports from the
# kernel are the fallback when the range below the ephemeral one is too small.
free_port() {
  python3 - "$DIR/ports" "${TMPDIR:-/tmp}/cms-test-ports" <<'PY'
import fcntl, os, random, socket, sys
taken_file, lock_dir = sys.argv[1], sys.argv[2]
taken = set()
if os.path.exists(taken_file):
    taken = {int(x) for x in open(taken_file).read().split()}
def bindable(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()
def held_by_a_test(port):
    try:
        fd = os.open(os.path.join(lock_dir, f"{port}.lock"), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
port = None
for _ in range(1000):
    if low >= 11000:
        p = random.randrange(10000, low)
    else:
        s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    if p not in taken and not held_by_a_test(p) and bindable(p):
        port = p
        break
if port is None:
    sys.exit("cluster.sh: no free loopback port after 1000 attempts")
with open(taken_file, "a") as f:
    f.write(f"{port}\n")
print(port)
PY
}

# Whether PID runs (not a zombie) and its command line names DIR.
ours_alive() {
  local pid="$1" dir="$2" state
  [[ -r /proc/$pid/stat ]] || return 1
  state=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [[ "$state" != Z && "$state" != X ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$dir/"
}

zk_ruok() {
  timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf ruok >&3 && head -c 4 <&3" 2>/dev/null || true
}

http_ready() { curl -fsS -m 2 "$1/ready" >/dev/null 2>&1; }

# Starts a process in its own session (it outlives this script); records it.
# spawn ROLE ID SERVICE_URL ADMIN_URL LOG CMD...
spawn() {
  local role="$1" id="$2" service="$3" admin="$4" log="$5"
  shift 5
  setsid "$@" </dev/null >"$log" 2>&1 &
  local pid=$!
  printf '%s\t%s\t%s\t%s\t%s\n' "$role" "$id" "$pid" "$service" "$admin" >>"$DIR/cluster.tsv"
  echo "$pid"
}

# wait_ready ID PID LOG CHECK...: polls CHECK until it succeeds, the process
# exits or the deadline passes.
wait_ready() {
  local id="$1" pid="$2" log="$3"
  shift 3
  local deadline=$((SECONDS + ready_timeout_s))
  while ((SECONDS < deadline)); do
    if "$@"; then return 0; fi
    if ! ours_alive "$pid" "$DIR"; then
      fail "$id (pid $pid) exited before it was ready" "$log"
    fi
    sleep 0.2
  done
  fail "$id (pid $pid) not ready within ${ready_timeout_s}s" "$log"
}

fail() {
  echo "cluster.sh: $1; last lines of $2:" >&2
  tail -n 40 "$2" >&2 || true
  echo "cluster.sh: stopping what was started" >&2
  do_down >&2 || true
  exit 1
}

zk_is_ready() { [[ "$(zk_ruok "$1")" == imok ]]; }

cmd_up() {
  local bookies=3 brokers=2 ensemble="" wq="" aq="" bookie_extra="" broker_extra=""
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --bookies) bookies="${2:?--bookies needs a value}"; shift 2 ;;
      --brokers) brokers="${2:?--brokers needs a value}"; shift 2 ;;
      --ensemble) ensemble="${2:?--ensemble needs a value}"; shift 2 ;;
      --write-quorum) wq="${2:?--write-quorum needs a value}"; shift 2 ;;
      --ack-quorum) aq="${2:?--ack-quorum needs a value}"; shift 2 ;;
      --bookie-config) bookie_extra="${2:?--bookie-config needs a file}"; shift 2 ;;
      --broker-config) broker_extra="${2:?--broker-config needs a file}"; shift 2 ;;
      *) echo "cluster.sh up: unknown argument '$1'" >&2; usage ;;
    esac
  done
  local n
  for n in "$bookies" "$brokers" ${ensemble:+"$ensemble"} ${wq:+"$wq"} ${aq:+"$aq"}; do
    [[ "$n" =~ ^[0-9]+$ ]] || die "'$n' is not a count"
  done
  ((bookies >= 1 && bookies <= 32)) || die "--bookies must be 1..32 (got $bookies)"
  ((brokers >= 1 && brokers <= 16)) || die "--brokers must be 1..16 (got $brokers)"
  [[ -n "$ensemble" ]] || ensemble=$((bookies < 3 ? bookies : 3))
  [[ -n "$wq" ]] || wq="$ensemble"
  [[ -n "$aq" ]] || aq=$((wq < 2 ? wq : 2))
  ((aq >= 1 && aq <= wq && wq <= ensemble && ensemble <= bookies)) ||
    die "need 1 <= ack quorum ($aq) <= write quorum ($wq) <= ensemble ($ensemble) <= bookies ($bookies)"
  for f in "$bookie_extra" "$broker_extra"; do
    [[ -z "$f" || -r "$f" ]] || die "cannot read config file '$f'"
  done
  for b in cms-broker cms-bookie; do
    [[ -x "$bin_dir/$b" ]] || die "no $bin_dir/$b: build it (cargo build --release -p cms-broker -p cms-bookie --bins) or set CMS_BIN_DIR"
  done
  [[ -x "$java" && -f /usr/share/java/zookeeper.jar ]] ||
    die "ZooKeeper needs java and /usr/share/java/zookeeper.jar (apt-get install zookeeper)"
  command -v curl >/dev/null || die "curl is needed"
  command -v python3 >/dev/null || die "python3 is needed (free ports)"

  if [[ -e "$DIR/cluster.tsv" ]]; then
    local pid
    while IFS=$'\t' read -r _ _ pid _ _; do
      if ours_alive "$pid" "$DIR"; then die "$DIR holds a running cluster (pid $pid): run 'cluster.sh down $DIR' first"; fi
    done <"$DIR/cluster.tsv"
    die "$DIR holds a stopped cluster's data: use a new DIR (or remove this one)"
  fi
  mkdir -p "$DIR"
  : >"$DIR/cluster.tsv"

  # ZooKeeper.
  local zk_port
  zk_port=$(free_port)
  mkdir -p "$DIR/zk1/data"
  # tickTime 500 ms: ZooKeeper expires sessions in tick-sized buckets, so a
  # dead broker's ownership nodes go between its 4 s session timeout and one
  # tick later (W6's resume; docs/ownership.md). Sessions may be 1-20 s.
  cat >"$DIR/zk1/zoo.cfg" <<CFG
tickTime=500
dataDir=$DIR/zk1/data
clientPort=$zk_port
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,mntr
maxSessionTimeout=20000
CFG
  local url="zk://127.0.0.1:$zk_port" pid
  pid=$(spawn zookeeper zk1 "$url" - "$DIR/zk1.log" \
    "$java" -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -cp "$zk_cp" \
    org.apache.zookeeper.server.quorum.QuorumPeerMain "$DIR/zk1/zoo.cfg")
  wait_ready zk1 "$pid" "$DIR/zk1.log" zk_is_ready "$zk_port"

  if ! "$bin_dir/cms-broker" init-cluster --metadata-url "$url" --cluster-name local \
    --log-level warn >"$DIR/init-cluster.log" 2>&1; then
    fail "cms-broker init-cluster failed" "$DIR/init-cluster.log"
  fi

  # Bookies.
  local i id grpc http
  for ((i = 1; i <= bookies; i++)); do
    id="b$i"
    grpc=$(free_port)
    http=$(free_port)
    mkdir -p "$DIR/$id"
    {
      echo "metadata_url = \"$url\""
      echo "metadata_session_timeout_ms = 4000"
      echo "bookie_id = \"$id\""
      echo "grpc_bind = \"127.0.0.1:$grpc\""
      echo "http_bind = \"127.0.0.1:$http\""
      echo "journal_dir = \"$DIR/$id/journal\""
      echo "ledger_dir = \"$DIR/$id/ledgers\""
      echo "autorecovery = true"
      [[ -z "$bookie_extra" ]] || cat "$bookie_extra"
    } >"$DIR/$id/bookie.toml"
    pid=$(spawn bookie "$id" "grpc://127.0.0.1:$grpc" "http://127.0.0.1:$http" "$DIR/$id.log" \
      "$bin_dir/cms-bookie" serve --config "$DIR/$id/bookie.toml")
    wait_ready "$id" "$pid" "$DIR/$id.log" http_ready "http://127.0.0.1:$http"
  done

  # Brokers.
  local port
  for ((i = 1; i <= brokers; i++)); do
    id="broker$i"
    port=$(free_port)
    http=$(free_port)
    mkdir -p "$DIR/$id"
    {
      echo "metadata_url = \"$url\""
      echo "metadata_session_timeout_ms = 4000"
      echo "broker_bind = \"127.0.0.1:$port\""
      echo "http_bind = \"127.0.0.1:$http\""
      echo "ensemble_size = $ensemble"
      echo "write_quorum = $wq"
      echo "ack_quorum = $aq"
      [[ -z "$broker_extra" ]] || cat "$broker_extra"
    } >"$DIR/$id/broker.toml"
    pid=$(spawn broker "$id" "pulsar://127.0.0.1:$port" "http://127.0.0.1:$http" "$DIR/$id.log" \
      "$bin_dir/cms-broker" serve --config "$DIR/$id/broker.toml")
    wait_ready "$id" "$pid" "$DIR/$id.log" http_ready "http://127.0.0.1:$http"
  done
  echo "cluster.sh: up in $DIR: zookeeper $url, $bookies bookies, $brokers brokers (E$ensemble/Qw$wq/Qa$aq)" >&2
  cmd_status
}

cmd_status() {
  [[ -r "$DIR/cluster.tsv" ]] || die "no cluster in $DIR (no $DIR/cluster.tsv)"
  local role id pid service admin
  while IFS=$'\t' read -r role id pid service admin; do
    printf '%s\t%s\t%s\t%s\t%s\n' "$role" "$id" "$pid" "$service" "$admin"
    ours_alive "$pid" "$DIR" || echo "cluster.sh: $role $id (pid $pid) is not running" >&2
  done <"$DIR/cluster.tsv"
}

cmd_logs() {
  [[ -r "$DIR/cluster.tsv" ]] || die "no cluster in $DIR (no $DIR/cluster.tsv)"
  local want="${1:-}" role id
  if [[ -n "$want" ]]; then
    grep -q "^[a-z]*	$want	" "$DIR/cluster.tsv" || die "no process '$want' in $DIR"
    cat "$DIR/$want.log"
    return
  fi
  while IFS=$'\t' read -r role id _ _ _; do
    echo "==> $role $id ($DIR/$id.log) <=="
    tail -n 40 "$DIR/$id.log" 2>/dev/null || true
  done <"$DIR/cluster.tsv"
}

# Stops one role's processes: SIGTERM, wait, SIGKILL.
stop_role() {
  local want="$1" role id pid pids=()
  while IFS=$'\t' read -r role id pid _ _; do
    [[ "$role" == "$want" ]] || continue
    if ours_alive "$pid" "$DIR"; then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done <"$DIR/cluster.tsv"
  [[ ${#pids[@]} -gt 0 ]] || return 0
  local deadline=$((SECONDS + stop_timeout_s)) left
  while :; do
    left=()
    for pid in "${pids[@]}"; do ours_alive "$pid" "$DIR" && left+=("$pid"); done
    [[ ${#left[@]} -gt 0 ]] || return 0
    if ((SECONDS >= deadline)); then
      echo "cluster.sh: $want pid(s) ${left[*]} still running after ${stop_timeout_s}s: SIGKILL" >&2
      for pid in "${left[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
      sleep 0.2
      for pid in "${left[@]}"; do
        ours_alive "$pid" "$DIR" && echo "cluster.sh: pid $pid survived SIGKILL" >&2
      done
      return 0
    fi
    sleep 0.1
  done
}

do_down() {
  [[ -r "$DIR/cluster.tsv" ]] || return 0
  stop_role broker
  stop_role bookie
  stop_role zookeeper
}

cmd_down() {
  [[ -r "$DIR/cluster.tsv" ]] || die "no cluster in $DIR (no $DIR/cluster.tsv)"
  do_down
  echo "cluster.sh: stopped the cluster in $DIR (data kept)" >&2
}

[[ $# -ge 2 ]] || usage
command="$1"
[[ -n "$2" ]] || usage
DIR="$(realpath -m -- "$2")"
shift 2
case "$command" in
  up) cmd_up "$@" ;;
  status) [[ $# -eq 0 ]] || usage; cmd_status ;;
  logs) [[ $# -le 1 ]] || usage; cmd_logs "$@" ;;
  down) [[ $# -eq 0 ]] || usage; cmd_down ;;
  *) usage ;;
esac
