# shellcheck shell=bash
# Functions to start, stop and probe the private MariaDB and RabbitMQ
# instances. Sourced by the scripts in this folder (after env.sh).
#
#   start_mariadb  stop_mariadb [--kill]  mariadb_answers
#   start_rabbitmq stop_rabbitmq [--kill] rabbitmq_answers
#
# stop_* --kill sends SIGKILL instead of a clean shutdown (crash simulation
# for fault tests; the next start recovers).
#
# "Running" always means "the service answers", never "a pid file exists":
# a pid file whose process is gone (crash, kill -9) is removed and the service
# is started afresh.

# shellcheck source=SCRIPTDIR/env.sh
. "$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")/env.sh"

# fd of the lock file (set by paybus_lock).
PAYBUS_LOCK_FD=

paybus_info() { printf '%s\n' "$*"; }
paybus_error() { printf 'ERROR: %s\n' "$*" >&2; }

# Serialises the scripts of one state folder (start/stop/restart running at
# the same time). The lock fd is closed for the daemons, which outlive us.
#   paybus_lock [FOLDER]   (default: PAYBUS_STATE_DIR)
paybus_lock() {
  local dir=${1:-$PAYBUS_STATE_DIR}
  mkdir -p -- "$dir"
  exec {PAYBUS_LOCK_FD}>"$dir/.lock"
  if ! flock -w 300 "$PAYBUS_LOCK_FD"; then
    paybus_error "another paybus local-services script holds $dir/.lock"
    return 1
  fi
}

paybus_require_commands() {
  local cmd missing=()
  for cmd in "$@"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
  done
  if ((${#missing[@]} > 0)); then
    paybus_error "missing commands: ${missing[*]} (run infra/local/install.sh)"
    return 1
  fi
}

# Prints the pid stored in FILE if that process is alive and its command line
# (or, with WHERE=environ, its environment) contains PATTERN, so a recycled
# pid is never taken for our daemon.
paybus_live_pid() {
  local file=$1 pattern=$2 where=${3:-cmdline} pid text
  [[ -r $file ]] || return 1
  pid=$(head -c 32 -- "$file" 2>/dev/null | tr -cd '0-9') || return 1
  [[ -n $pid ]] || return 1
  text=$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/$where") || return 1
  # Whole-entry match: one argument, or one NAME=VALUE of the environment.
  [[ $'\n'$text$'\n' == *$'\n'"$pattern"$'\n'* ]] || return 1
  printf '%s\n' "$pid"
}

# Waits until PID has exited, at most TIMEOUT seconds.
paybus_wait_exit() {
  local pid=$1 timeout=$2 deadline=$((SECONDS + $2))
  while kill -0 "$pid" 2>/dev/null; do
    # A zombie (child of ours) counts as gone.
    [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == Z ]] && return 0
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
  ((timeout >= 0))
}

# TERM, then KILL after the timeout.
paybus_kill_wait() {
  local pid=$1 name=$2
  kill -TERM "$pid" 2>/dev/null || return 0
  if ! paybus_wait_exit "$pid" "$PAYBUS_STOP_TIMEOUT"; then
    paybus_info "$name (pid $pid) did not stop in ${PAYBUS_STOP_TIMEOUT}s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
    paybus_wait_exit "$pid" 10 || true
  fi
}

# Starts a daemon detached from us: own session (setsid) so it outlives this
# script and its terminal, stdin from /dev/null, output appended to LOG, and no
# other inherited fd (the lock, a caller's pipes: a CI runner or `start.sh |
# tee` must not wait on a daemon). Sets PAYBUS_DAEMON_PID.
#   paybus_spawn LOG COMMAND [ARG]...
paybus_spawn() {
  local log=$1
  shift
  (
    for fd in /proc/"$BASHPID"/fd/*; do
      fd=${fd##*/}
      if ((fd > 2)); then
        eval "exec $fd>&-"
      fi
    done
    exec setsid nohup "$@" </dev/null >>"$log" 2>&1
  ) &
  PAYBUS_DAEMON_PID=$!
}

paybus_log_tail() {
  local file=$1 lines=${2:-40}
  if [[ -s $file ]]; then
    printf -- '----- last lines of %s -----\n' "$file" >&2
    tail -n "$lines" -- "$file" >&2
    printf -- '-----\n' >&2
  fi
}

# True if something accepts TCP connections on 127.0.0.1:PORT.
paybus_tcp_open() {
  # shellcheck disable=SC2016 # $1 expands in the inner shell
  timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null
}

# ---------------------------------------------------------------- MariaDB

PAYBUS_MARIADB_PIDFILE="$PAYBUS_MARIADB_DIR/pid"
PAYBUS_MARIADB_ERRLOG="$PAYBUS_MARIADB_DIR/err.log"

paybus_mariadb_client() {
  mariadb --no-defaults --user=root --socket="$PAYBUS_MARIADB_SOCKET" --connect-timeout=3 "$@"
}

mariadb_answers() {
  [[ -S $PAYBUS_MARIADB_SOCKET ]] &&
    paybus_mariadb_client --batch --skip-column-names -e 'select 1' >/dev/null 2>&1
}

paybus_mariadb_pid() {
  paybus_live_pid "$PAYBUS_MARIADB_PIDFILE" "--datadir=$PAYBUS_MARIADB_DIR/data"
}

paybus_mariadb_wait() {
  local pid=$1 deadline=$((SECONDS + PAYBUS_MARIADB_START_TIMEOUT))
  until mariadb_answers; do
    if ! kill -0 "$pid" 2>/dev/null; then
      paybus_error "mariadbd (pid $pid) exited during start-up"
      paybus_log_tail "$PAYBUS_MARIADB_ERRLOG"
      return 1
    fi
    if ((SECONDS >= deadline)); then
      paybus_error "MariaDB did not answer within ${PAYBUS_MARIADB_START_TIMEOUT}s (pid $pid still running)"
      paybus_log_tail "$PAYBUS_MARIADB_ERRLOG"
      return 1
    fi
    sleep 0.2
  done
}

# The application database. (Root accounts come from mariadb-install-db with
# --auth-root-authentication-method=normal: root@localhost, root@127.0.0.1 and
# root@::1 without password; with --skip-name-resolve a TCP client from
# 127.0.0.1 matches root@127.0.0.1.)
paybus_mariadb_setup() {
  paybus_mariadb_client -e "CREATE DATABASE IF NOT EXISTS \`$PAYBUS_MARIADB_DATABASE\`
    CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
}

paybus_mariadb_init() {
  local dir=$PAYBUS_MARIADB_DIR tmp="$PAYBUS_MARIADB_DIR/data.init"
  [[ -d $dir/data/mysql ]] && return 0
  if [[ -e $dir/data ]]; then
    paybus_error "$dir/data exists but holds no initialised database; remove it and start again"
    return 1
  fi
  paybus_info "MariaDB: initialising a new data folder in $dir/data"
  rm -rf -- "$tmp"
  local args=(--no-defaults --datadir="$tmp" --auth-root-authentication-method=normal --skip-test-db)
  ((EUID == 0)) && args+=(--user=root)
  if ! mariadb-install-db "${args[@]}" >"$dir/install-db.log" 2>&1; then
    paybus_error "mariadb-install-db failed"
    paybus_log_tail "$dir/install-db.log"
    return 1
  fi
  # Renamed into place only once complete, so a half-done initialisation
  # (interrupted script) is never taken for a database.
  mv -- "$tmp" "$dir/data"
}

start_mariadb() {
  paybus_require_commands mariadbd mariadb-install-db mariadb || return 1
  local dir=$PAYBUS_MARIADB_DIR pid
  mkdir -p -- "$dir"
  if ((${#PAYBUS_MARIADB_SOCKET} > 100)); then
    paybus_error "socket path too long for a unix socket (${#PAYBUS_MARIADB_SOCKET} chars): $PAYBUS_MARIADB_SOCKET; set PAYBUS_STATE_DIR to a shorter folder"
    return 1
  fi

  if mariadb_answers; then
    paybus_info "MariaDB: already running (socket $PAYBUS_MARIADB_SOCKET)"
    paybus_mariadb_setup
    return 0
  fi

  if pid=$(paybus_mariadb_pid); then
    # Our mariadbd is alive but not answering yet (starting, or recovering).
    paybus_info "MariaDB: mariadbd (pid $pid) is up but not answering yet; waiting"
    paybus_mariadb_wait "$pid" || return 1
  else
    # Nothing of ours is running: whatever is left is stale.
    if [[ -e $PAYBUS_MARIADB_PIDFILE ]]; then
      paybus_info "MariaDB: removing stale pid file $PAYBUS_MARIADB_PIDFILE"
    fi
    rm -f -- "$PAYBUS_MARIADB_PIDFILE" "$PAYBUS_MARIADB_SOCKET" "$PAYBUS_MARIADB_SOCKET.lock"
    paybus_mariadb_init || return 1

    local args=(
      --no-defaults
      --datadir="$dir/data"
      --socket="$PAYBUS_MARIADB_SOCKET"
      --port="$PAYBUS_MARIADB_PORT"
      --bind-address=127.0.0.1
      --pid-file="$PAYBUS_MARIADB_PIDFILE"
      --log-error="$PAYBUS_MARIADB_ERRLOG"
      --max-connections=1000
      --innodb-buffer-pool-size=256M
      --character-set-server=utf8mb4
      --collation-server=utf8mb4_unicode_ci
      --skip-name-resolve
    )
    local extra
    read -r -a extra <<<"${PAYBUS_MARIADB_OPTIONS:-}"
    args+=("${extra[@]}")
    ((EUID == 0)) && args+=(--user=root)
    paybus_info "MariaDB: starting on 127.0.0.1:$PAYBUS_MARIADB_PORT"
    paybus_spawn "$dir/mariadbd.out" mariadbd "${args[@]}"
    pid=$PAYBUS_DAEMON_PID
    printf '%s\n' "$pid" >"$PAYBUS_MARIADB_PIDFILE"
    paybus_mariadb_wait "$pid" || return 1
  fi
  paybus_mariadb_setup
  paybus_info "MariaDB: running (pid $(paybus_mariadb_pid || echo '?'))"
}

stop_mariadb() {
  local pid=
  pid=$(paybus_mariadb_pid) || pid=
  if [[ ${1:-} == --kill && -n $pid ]]; then
    paybus_info "MariaDB: killing mariadbd (pid $pid) with SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    paybus_wait_exit "$pid" 10 || true
    return 0
  fi
  if mariadb_answers; then
    paybus_info "MariaDB: shutting down"
    # mariadb-admin shutdown waits until the server has removed its pid file.
    mariadb-admin --no-defaults --user=root --socket="$PAYBUS_MARIADB_SOCKET" \
      --shutdown-timeout="$PAYBUS_STOP_TIMEOUT" shutdown >/dev/null 2>&1 || true
  fi
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    if ! paybus_wait_exit "$pid" "$PAYBUS_STOP_TIMEOUT"; then
      paybus_kill_wait "$pid" mariadbd
    fi
  fi
  if [[ -z $pid ]] && ! mariadb_answers; then
    paybus_info "MariaDB: not running"
  else
    paybus_info "MariaDB: stopped"
  fi
  rm -f -- "$PAYBUS_MARIADB_PIDFILE"
}

# --------------------------------------------------------------- RabbitMQ

# Points the functions below at one node: its name, ports and state folder.
# Called once here for the node of env.sh; infra/local/cluster.sh calls it for
# each node of the cluster in turn.
#   paybus_rabbitmq_use NODENAME AMQP_PORT MGMT_PORT DIST_PORT STATE_FOLDER
paybus_rabbitmq_use() {
  PAYBUS_RABBITMQ_NODENAME=$1
  PAYBUS_AMQP_PORT=$2
  PAYBUS_RABBITMQ_MGMT_PORT=$3
  PAYBUS_RABBITMQ_DIST_PORT=$4
  PAYBUS_RABBITMQ_DIR=$5
  PAYBUS_RABBITMQ_PIDFILE="$PAYBUS_RABBITMQ_DIR/pid"
  # The node this state folder was started as (written at each start): stop and
  # start act on the node of their own folder only, never on one that merely
  # answers to the same name (the shared paybus@localhost of other people's tests).
  PAYBUS_RABBITMQ_NODEFILE="$PAYBUS_RABBITMQ_DIR/nodename"
  PAYBUS_RABBITMQ_OUT="$PAYBUS_RABBITMQ_DIR/server.out"
  PAYBUS_RABBITMQ_LOG="$PAYBUS_RABBITMQ_DIR/log/$PAYBUS_RABBITMQ_NODENAME.log"

  # The node's environment, as NAME=VALUE words for env(1). As root, Debian's
  # wrappers (/usr/sbin/rabbitmq-server, /usr/sbin/rabbitmqctl) switch to the
  # rabbitmq user with `su`, which keeps these variables; server and CLI then
  # share that user's cookie, /var/lib/rabbitmq/.erlang.cookie (so every node
  # started here has the same cookie, and the nodes of a cluster can talk).
  PAYBUS_RABBITMQ_ENV=(
    RABBITMQ_NODENAME="$PAYBUS_RABBITMQ_NODENAME"
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    RABBITMQ_NODE_PORT="$PAYBUS_AMQP_PORT"
    RABBITMQ_DIST_PORT="$PAYBUS_RABBITMQ_DIST_PORT"
    RABBITMQ_MNESIA_BASE="$PAYBUS_RABBITMQ_DIR/mnesia"
    RABBITMQ_LOG_BASE="$PAYBUS_RABBITMQ_DIR/log"
    RABBITMQ_PID_FILE="$PAYBUS_RABBITMQ_PIDFILE"
    RABBITMQ_CONFIG_FILE="$PAYBUS_RABBITMQ_DIR/rabbitmq.conf"
    RABBITMQ_ADVANCED_CONFIG_FILE="$PAYBUS_RABBITMQ_DIR/advanced.config"
    RABBITMQ_ENABLED_PLUGINS_FILE="$PAYBUS_RABBITMQ_DIR/enabled_plugins"
    RABBITMQ_CONF_ENV_FILE="$PAYBUS_RABBITMQ_DIR/rabbitmq-env.conf"
    # Erlang distribution and a newly started epmd on loopback only.
    # The CLI's own Erlang node (rabbitmqctl, rabbitmq-plugins) listens on a port of this
    # range. Debian's default, 35672-35682, lies in the kernel's ephemeral range, where the
    # tests' private nodes once took their ports: a restarted node failed with
    # dist_port_already_used, its port held by another node's rabbitmqctl.
    RABBITMQ_CTL_DIST_PORT_MIN=19100
    RABBITMQ_CTL_DIST_PORT_MAX=19199
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
    ERL_EPMD_ADDRESS=127.0.0.1
  )
}

paybus_rabbitmq_use "$PAYBUS_RABBITMQ_NODENAME" "$PAYBUS_AMQP_PORT" \
  "$PAYBUS_RABBITMQ_MGMT_PORT" "$PAYBUS_RABBITMQ_DIST_PORT" "$PAYBUS_RABBITMQ_DIR"

paybus_rabbitmqctl() {
  env "${PAYBUS_RABBITMQ_ENV[@]}" rabbitmqctl -n "$PAYBUS_RABBITMQ_NODENAME" "$@"
}

# The plugins every node runs: the management API (per-test vhosts, ops) and the
# consistent-hash exchange that spreads a sharded function's messages over its
# queues by entity (shipped with RabbitMQ; Amazon MQ for RabbitMQ has it too).
PAYBUS_RABBITMQ_PLUGINS=(rabbitmq_management rabbitmq_consistent_hash_exchange)

# Enables PAYBUS_RABBITMQ_PLUGINS on the running node, online (a node started
# before a plugin joined the list gets it without a restart); the node's
# enabled-plugins file is updated too, so its next start has them. Idempotent.
paybus_rabbitmq_enable_plugins() {
  env "${PAYBUS_RABBITMQ_ENV[@]}" rabbitmq-plugins -n "$PAYBUS_RABBITMQ_NODENAME" \
    -q enable --online "${PAYBUS_RABBITMQ_PLUGINS[@]}" >/dev/null
}

# The node runs and the rabbit application has started.
rabbitmq_answers() {
  paybus_rabbitmqctl -q await_startup --timeout 5 >/dev/null 2>&1
}

paybus_rabbitmq_pid() {
  # The beam command line does not name the node; its environment does.
  paybus_live_pid "$PAYBUS_RABBITMQ_PIDFILE" "RABBITMQ_PID_FILE=$PAYBUS_RABBITMQ_PIDFILE" environ
}

# Log size before a start, so a failure report shows only this start's errors.
PAYBUS_RABBITMQ_LOG_OFFSET=0

paybus_rabbitmq_failure_report() {
  paybus_log_tail "$PAYBUS_RABBITMQ_OUT" 25
  if [[ -s $PAYBUS_RABBITMQ_LOG ]]; then
    printf -- '----- first errors in %s -----\n' "$PAYBUS_RABBITMQ_LOG" >&2
    tail -c +"$((PAYBUS_RABBITMQ_LOG_OFFSET + 1))" -- "$PAYBUS_RABBITMQ_LOG" |
      grep -E '\[(error|critical)\]' | head -n 20 >&2 || true
    printf -- '-----\n' >&2
  fi
}

# Waits for the node; LAUNCHER is the pid that dies if the node dies.
paybus_rabbitmq_wait() {
  local launcher=$1 deadline=$((SECONDS + PAYBUS_RABBITMQ_START_TIMEOUT)) left
  while :; do
    left=$((deadline - SECONDS))
    if ((left <= 0)); then
      paybus_error "RabbitMQ did not start within ${PAYBUS_RABBITMQ_START_TIMEOUT}s"
      paybus_rabbitmq_failure_report
      return 1
    fi
    if ! kill -0 "$launcher" 2>/dev/null; then
      paybus_error "rabbitmq-server (pid $launcher) exited during start-up"
      paybus_rabbitmq_failure_report
      return 1
    fi
    # Fails at once while the node is not reachable yet; blocks while it boots.
    if paybus_rabbitmqctl -q await_startup --timeout "$left" >/dev/null 2>&1; then
      return 0
    fi
    sleep 1
  done
}

paybus_rabbitmq_files() {
  local dir=$PAYBUS_RABBITMQ_DIR
  mkdir -p -- "$dir/mnesia" "$dir/log"
  (
    IFS=,
    printf '[%s].\n' "${PAYBUS_RABBITMQ_PLUGINS[*]}"
  ) >"$dir/enabled_plugins"
  cat >"$dir/rabbitmq.conf" <<CONF
# Written by infra/local/lib.sh; changes are overwritten at each start.
listeners.tcp.default = 127.0.0.1:$PAYBUS_AMQP_PORT
management.tcp.ip = 127.0.0.1
management.tcp.port = $PAYBUS_RABBITMQ_MGMT_PORT
# Quorum queues keep every entry of their shared write-ahead log in memory until the log
# reaches this size and rolls over (default 512 MiB): the soak watched the node's memory climb
# by ~40 MiB a minute towards it. 64 MiB bounds it for a developer's or CI machine.
raft.wal_max_size_bytes = $PAYBUS_RABBITMQ_WAL_MAX_BYTES
CONF
  # Empty on purpose: keeps /etc/rabbitmq/rabbitmq-env.conf out of this node.
  : >"$dir/rabbitmq-env.conf"
  if ((EUID == 0)); then
    # The server runs as the rabbitmq user (Debian's wrapper switches to it).
    chown -R rabbitmq:rabbitmq -- "$dir"
    if ! runuser -u rabbitmq -- test -w "$dir/mnesia"; then
      paybus_error "user rabbitmq cannot write $dir/mnesia (a parent folder is not traversable?); set PAYBUS_STATE_DIR elsewhere"
      return 1
    fi
  fi
}

# The node this state folder's RabbitMQ runs as: the name in its live
# process's environment, else the one recorded at its last start. Fails when the
# folder knows of no node (never started here).
paybus_rabbitmq_own_node() {
  local pid name=
  if pid=$(paybus_rabbitmq_pid); then
    name=$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" |
      sed -n 's/^RABBITMQ_NODENAME=//p' | head -n 1) || name=
  fi
  if [[ -z $name && -r $PAYBUS_RABBITMQ_NODEFILE ]]; then
    name=$(head -n 1 -- "$PAYBUS_RABBITMQ_NODEFILE")
  fi
  [[ -n $name ]] || return 1
  printf '%s\n' "$name"
}

start_rabbitmq() {
  paybus_require_commands rabbitmq-server rabbitmqctl || return 1
  if ((EUID != 0)); then
    paybus_error "RabbitMQ: start as root (Debian's rabbitmq-server runs only as root or rabbitmq)"
    return 1
  fi
  local pid launcher own
  mkdir -p -- "$PAYBUS_RABBITMQ_DIR"
  pid=$(paybus_rabbitmq_pid) || pid=
  own=$(paybus_rabbitmq_own_node) || own=

  if [[ -n $pid && $own != "$PAYBUS_RABBITMQ_NODENAME" ]]; then
    paybus_error "RabbitMQ: $PAYBUS_RABBITMQ_DIR already runs node $own (pid $pid), not $PAYBUS_RABBITMQ_NODENAME; set PAYBUS_RABBITMQ_NODENAME=$own or stop it first"
    return 1
  fi
  if rabbitmq_answers; then
    # A node of that name answering is ours only if this folder runs or ran it: the same
    # name started from another folder (the shared paybus@localhost, when only
    # PAYBUS_STATE_DIR was overridden) must not be taken for this folder's node.
    if [[ -z $pid && $own != "$PAYBUS_RABBITMQ_NODENAME" ]]; then
      paybus_error "RabbitMQ: node $PAYBUS_RABBITMQ_NODENAME already runs, but not from $PAYBUS_RABBITMQ_DIR; give this folder a node name and ports of its own (PAYBUS_RABBITMQ_NODENAME, PAYBUS_AMQP_PORT, PAYBUS_RABBITMQ_MGMT_PORT, PAYBUS_RABBITMQ_DIST_PORT)"
      return 1
    fi
    paybus_info "RabbitMQ: already running (node $PAYBUS_RABBITMQ_NODENAME)"
    printf '%s\n' "$PAYBUS_RABBITMQ_NODENAME" >"$PAYBUS_RABBITMQ_NODEFILE"
    if ! paybus_rabbitmq_enable_plugins; then
      paybus_error "RabbitMQ: cannot enable ${PAYBUS_RABBITMQ_PLUGINS[*]} on node $PAYBUS_RABBITMQ_NODENAME"
      return 1
    fi
    return 0
  fi

  if [[ -n $pid ]]; then
    paybus_info "RabbitMQ: node process (pid $pid) is up but not answering yet; waiting"
    paybus_rabbitmq_wait "$pid" || return 1
    paybus_rabbitmq_enable_plugins || return 1
  else
    if [[ -e $PAYBUS_RABBITMQ_PIDFILE ]]; then
      paybus_info "RabbitMQ: removing stale pid file $PAYBUS_RABBITMQ_PIDFILE"
    fi
    rm -f -- "$PAYBUS_RABBITMQ_PIDFILE"
    paybus_rabbitmq_files || return 1
    printf '%s\n' "$PAYBUS_RABBITMQ_NODENAME" >"$PAYBUS_RABBITMQ_NODEFILE"
    PAYBUS_RABBITMQ_LOG_OFFSET=$(stat -c %s -- "$PAYBUS_RABBITMQ_LOG" 2>/dev/null || echo 0)
    paybus_info "RabbitMQ: starting node $PAYBUS_RABBITMQ_NODENAME (AMQP 127.0.0.1:$PAYBUS_AMQP_PORT)"
    {
      printf '\n===== %s start\n' "$(date -Is)"
    } >>"$PAYBUS_RABBITMQ_OUT"
    paybus_spawn "$PAYBUS_RABBITMQ_OUT" env "${PAYBUS_RABBITMQ_ENV[@]}" \
      ERL_CRASH_DUMP="$PAYBUS_RABBITMQ_DIR/log/erl_crash.dump" rabbitmq-server
    launcher=$PAYBUS_DAEMON_PID
    paybus_rabbitmq_wait "$launcher" || return 1
  fi
  paybus_info "RabbitMQ: running (pid $(paybus_rabbitmq_pid || echo '?'))"
}

# Stops this state folder's node, and only it: by its pid (which names the
# folder's pid file in its environment), or, with no live pid, by the node name
# recorded at its start. A node that merely answers to PAYBUS_RABBITMQ_NODENAME
# is not stopped when the folder records no node of that name: with only
# PAYBUS_STATE_DIR overridden, the fallback `rabbitmqctl -n paybus@localhost
# stop` would have stopped the shared node other people's tests run on.
stop_rabbitmq() {
  local pid= own=
  pid=$(paybus_rabbitmq_pid) || pid=
  if [[ ${1:-} == --kill && -n $pid ]]; then
    paybus_info "RabbitMQ: killing the node (pid $pid) with SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    paybus_wait_exit "$pid" 10 || true
    return 0
  fi
  own=$(paybus_rabbitmq_own_node) || own=
  if [[ -z $own ]]; then
    if rabbitmq_answers; then
      paybus_error "RabbitMQ: node $PAYBUS_RABBITMQ_NODENAME answers, but $PAYBUS_RABBITMQ_DIR records no node (it was not started from this folder); refusing to stop it"
      return 1
    fi
    paybus_info "RabbitMQ: not running"
    rm -f -- "$PAYBUS_RABBITMQ_PIDFILE"
    return 0
  fi
  if [[ -n $pid ]] || PAYBUS_RABBITMQ_NODENAME=$own rabbitmq_answers; then
    paybus_info "RabbitMQ: stopping node $own"
    # `stop` with the pid file waits until the OS process has exited, for as long as that
    # takes: bounded here, then the node is killed below. Unbounded, a node whose shutdown
    # hangs would hold its caller (stop.sh, a fault test's broker restart) for good.
    timeout "$PAYBUS_STOP_TIMEOUT" env "${PAYBUS_RABBITMQ_ENV[@]}" \
      rabbitmqctl -n "$own" -q stop "$PAYBUS_RABBITMQ_PIDFILE" >/dev/null 2>&1 ||
      timeout 20 env "${PAYBUS_RABBITMQ_ENV[@]}" rabbitmqctl -n "$own" -q stop >/dev/null 2>&1 || true
    if [[ -n $pid ]] && ! paybus_wait_exit "$pid" "$PAYBUS_STOP_TIMEOUT"; then
      paybus_kill_wait "$pid" "RabbitMQ node"
    fi
    paybus_info "RabbitMQ: stopped"
  else
    paybus_info "RabbitMQ: not running"
  fi
  rm -f -- "$PAYBUS_RABBITMQ_PIDFILE"
}

# ----------------------------------------------------------------- common

paybus_print_summary() {
  cat <<TXT

paybus local services:
  MariaDB   $PAYBUS_DATABASE_URL
            socket $PAYBUS_MARIADB_SOCKET
            log    $PAYBUS_MARIADB_ERRLOG
  RabbitMQ  $PAYBUS_AMQP_URL
            management $PAYBUS_RABBITMQ_MGMT_URL (guest/guest, from localhost only)
            node   $PAYBUS_RABBITMQ_NODENAME
            log    $PAYBUS_RABBITMQ_LOG
                   $PAYBUS_RABBITMQ_OUT
TXT
}

# Expands service arguments ("", "all", "mariadb", "rabbitmq") into a list.
paybus_services() {
  local arg
  if (($# == 0)); then
    printf '%s\n' mariadb rabbitmq
    return 0
  fi
  for arg in "$@"; do
    case "$arg" in
      all) printf '%s\n' mariadb rabbitmq ;;
      mariadb | mysql) printf '%s\n' mariadb ;;
      rabbitmq | amqp) printf '%s\n' rabbitmq ;;
      *)
        paybus_error "unknown service '$arg' (mariadb, rabbitmq, all)"
        return 1
        ;;
    esac
  done
}
