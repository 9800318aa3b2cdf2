#!/usr/bin/env bash
# A RabbitMQ cluster of three nodes on loopback (failover tests, the chaos run's
# full profile). It never touches the single node of start.sh (paybus@localhost,
# ports 5682/15682/25682): its nodes have names, ports and state folders of
# their own.
#
#   infra/local/cluster.sh start            start every node, join them, declare the topology
#   infra/local/cluster.sh stop [--kill]    stop every node (SIGKILL with --kill)
#   infra/local/cluster.sh status           each node, the running members, the quorum queues
#   infra/local/cluster.sh urls             PAYBUS_AMQP_URL for the cluster (comma-separated)
#   infra/local/cluster.sh kill-node N      SIGKILL node N (a crash)
#   infra/local/cluster.sh stop-node N      stop node N cleanly
#   infra/local/cluster.sh start-node N     start node N again (it rejoins by itself)
#
# Settings (environment), with their defaults:
#   PAYBUS_CLUSTER_SIZE=3                   nodes
#   PAYBUS_CLUSTER_NAME=paybus-cluster      node N is <name>-N@localhost
#   PAYBUS_CLUSTER_BASE_PORT=5701           node N listens on (base + N - 1) for AMQP,
#   PAYBUS_CLUSTER_AMQP_PORT=<base>           on (mgmt + N - 1) for management and
#   PAYBUS_CLUSTER_MGMT_PORT=<base + 10000>   on (dist + N - 1) for Erlang distribution
#   PAYBUS_CLUSTER_DIST_PORT=<base + 20000>
#   PAYBUS_CLUSTER_DIR=$PAYBUS_STATE_DIR/cluster   node N's state in <dir>/node<N>
#   PAYBUS_CLUSTER_DEFINITIONS=infra/rabbitmq/definitions.json   loaded into vhost / after
#                                           the join ("none": declare nothing)
#
# Every node runs as the rabbitmq user, so every node has that user's Erlang
# cookie (/var/lib/rabbitmq/.erlang.cookie): the same cookie, as a cluster needs.
set -euo pipefail

# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")/lib.sh"

: "${PAYBUS_CLUSTER_SIZE:=3}"
: "${PAYBUS_CLUSTER_NAME:=paybus-cluster}"
: "${PAYBUS_CLUSTER_BASE_PORT:=5701}"
: "${PAYBUS_CLUSTER_AMQP_PORT:=$PAYBUS_CLUSTER_BASE_PORT}"
: "${PAYBUS_CLUSTER_MGMT_PORT:=$((PAYBUS_CLUSTER_BASE_PORT + 10000))}"
: "${PAYBUS_CLUSTER_DIST_PORT:=$((PAYBUS_CLUSTER_BASE_PORT + 20000))}"
: "${PAYBUS_CLUSTER_DIR:=$PAYBUS_STATE_DIR/cluster}"
: "${PAYBUS_CLUSTER_DEFINITIONS:=$PAYBUS_REPO_DIR/infra/rabbitmq/definitions.json}"

usage() {
  sed -n '7,13p' -- "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

for setting in PAYBUS_CLUSTER_SIZE PAYBUS_CLUSTER_AMQP_PORT PAYBUS_CLUSTER_MGMT_PORT PAYBUS_CLUSTER_DIST_PORT; do
  if ! [[ ${!setting} =~ ^[1-9][0-9]*$ ]]; then
    paybus_error "$setting=${!setting}: expected a positive integer"
    exit 2
  fi
done
if ((PAYBUS_CLUSTER_DIST_PORT + PAYBUS_CLUSTER_SIZE > 65536)); then
  paybus_error "PAYBUS_CLUSTER_BASE_PORT=$PAYBUS_CLUSTER_BASE_PORT: node ports would pass 65535"
  exit 2
fi
if ! [[ $PAYBUS_CLUSTER_NAME =~ ^[A-Za-z0-9_-]+$ ]]; then
  paybus_error "PAYBUS_CLUSTER_NAME=$PAYBUS_CLUSTER_NAME: letters, digits, - and _ only"
  exit 2
fi

cluster_node_name() { printf '%s-%s@localhost\n' "$PAYBUS_CLUSTER_NAME" "$1"; }
cluster_amqp_port() { printf '%s\n' $((PAYBUS_CLUSTER_AMQP_PORT + $1 - 1)); }

# Points lib.sh's RabbitMQ functions at node N.
cluster_use() {
  local n=$1
  paybus_rabbitmq_use "$(cluster_node_name "$n")" "$(cluster_amqp_port "$n")" \
    $((PAYBUS_CLUSTER_MGMT_PORT + n - 1)) $((PAYBUS_CLUSTER_DIST_PORT + n - 1)) \
    "$PAYBUS_CLUSTER_DIR/node$n"
}

cluster_check_node() {
  if ! [[ ${1:-} =~ ^[1-9][0-9]*$ ]] || (($1 > PAYBUS_CLUSTER_SIZE)); then
    paybus_error "node number '${1:-}': expected 1 to $PAYBUS_CLUSTER_SIZE"
    exit 2
  fi
}

cluster_urls() {
  local n urls=()
  for ((n = 1; n <= PAYBUS_CLUSTER_SIZE; n++)); do
    urls+=("amqp://guest:guest@127.0.0.1:$(cluster_amqp_port "$n")/%2f")
  done
  (
    IFS=,
    printf '%s\n' "${urls[*]}"
  )
}

# Runs COMMAND for every node at once (a node's start is mostly waiting), each
# line prefixed with the node; fails if any failed.
cluster_each() {
  local n pids=() failed=0
  for ((n = 1; n <= PAYBUS_CLUSTER_SIZE; n++)); do
    (
      cluster_use "$n"
      "$@" 2>&1 | sed -u "s/^/[node $n] /"
      exit "${PIPESTATUS[0]}"
    ) &
    pids+=($!)
  done
  for n in "${pids[@]}"; do
    wait "$n" || failed=1
  done
  return "$failed"
}

# Node N is a member of node 1's cluster (node 1 trivially is).
cluster_joined() {
  local n=$1 first
  first=$(cluster_node_name 1)
  ((n == 1)) && return 0
  cluster_use "$n"
  paybus_rabbitmqctl -q cluster_status 2>/dev/null | grep -qF -- "$first"
}

cluster_join() {
  local n first
  first=$(cluster_node_name 1)
  for ((n = 2; n <= PAYBUS_CLUSTER_SIZE; n++)); do
    cluster_joined "$n" && continue
    cluster_use "$n"
    paybus_info "[node $n] joining $first"
    # A node joins while its application is stopped; its own (empty) data is reset.
    if ! {
      paybus_rabbitmqctl -q stop_app &&
        paybus_rabbitmqctl -q reset &&
        paybus_rabbitmqctl -q join_cluster "$first" &&
        paybus_rabbitmqctl -q start_app
    } >>"$PAYBUS_RABBITMQ_OUT" 2>&1; then
      paybus_error "node $n could not join $first"
      paybus_log_tail "$PAYBUS_RABBITMQ_OUT" 20
      return 1
    fi
  done
}

# The topology, declared once every node is a member: a quorum queue declared
# now has a replica on each node (the default initial group is every member).
cluster_declare() {
  [[ $PAYBUS_CLUSTER_DEFINITIONS == none ]] && return 0
  if [[ ! -r $PAYBUS_CLUSTER_DEFINITIONS ]]; then
    paybus_error "cannot read $PAYBUS_CLUSTER_DEFINITIONS (PAYBUS_CLUSTER_DEFINITIONS)"
    return 1
  fi
  cluster_use 1
  # On standard input: the CLI runs as the rabbitmq user, who may not read the checkout.
  if ! paybus_rabbitmqctl -q import_definitions --format json \
    <"$PAYBUS_CLUSTER_DEFINITIONS" >/dev/null; then
    paybus_error "importing $PAYBUS_CLUSTER_DEFINITIONS failed"
    return 1
  fi
  paybus_info "topology of $PAYBUS_CLUSTER_DEFINITIONS declared (vhost /)"
}

cluster_start() {
  cluster_each start_rabbitmq
  cluster_join
  cluster_declare
  cluster_status
}

cluster_stop() {
  cluster_each stop_rabbitmq "$@"
}

cluster_status() {
  local n rc=0 pid state live=
  for ((n = 1; n <= PAYBUS_CLUSTER_SIZE; n++)); do
    cluster_use "$n"
    if rabbitmq_answers; then
      state="up (pid $(paybus_rabbitmq_pid || echo '?'))"
      [[ -n $live ]] || live=$n
    elif pid=$(paybus_rabbitmq_pid); then
      state="starting (pid $pid)"
      rc=1
    else
      state=down
      rc=1
    fi
    printf '%-28s %-20s amqp %s  management http://127.0.0.1:%s  %s\n' \
      "$PAYBUS_RABBITMQ_NODENAME" "$state" "$PAYBUS_AMQP_PORT" "$PAYBUS_RABBITMQ_MGMT_PORT" \
      "$PAYBUS_RABBITMQ_DIR"
  done
  printf 'PAYBUS_AMQP_URL=%s\n' "$(cluster_urls)"
  if [[ -z $live ]]; then
    return 1
  fi
  cluster_use "$live"
  printf '\nrunning members (asked node %s):\n' "$live"
  paybus_rabbitmqctl -q cluster_status --formatter json 2>/dev/null |
    jq -r '.running_nodes[] | "  " + .' 2>/dev/null || echo "  (cluster_status failed)"
  printf '\nqueues of vhost / (quorum: members, online, leader):\n'
  paybus_rabbitmqctl -q list_queues -p / name type members online leader --formatter json 2>/dev/null |
    jq -r '.[] | "  \(.name)  \(.type)  members \(.members | length)  online \(.online | length)  leader \(.leader)"' \
      2>/dev/null || echo "  (list_queues failed)"
  return "$rc"
}

command=${1:-}
shift || true
mkdir -p -- "$PAYBUS_CLUSTER_DIR"
case $command in
  start)
    (($# == 0)) || usage
    "$PAYBUS_LOCAL_DIR/install.sh"
    paybus_lock "$PAYBUS_CLUSTER_DIR"
    cluster_start
    ;;
  stop)
    case ${1:-} in
      '' | --kill) ;;
      *) usage ;;
    esac
    paybus_lock "$PAYBUS_CLUSTER_DIR"
    cluster_stop "$@"
    ;;
  status)
    (($# == 0)) || usage
    cluster_status
    ;;
  urls)
    (($# == 0)) || usage
    cluster_urls
    ;;
  kill-node | stop-node | start-node)
    (($# == 1)) || usage
    cluster_check_node "$1"
    paybus_lock "$PAYBUS_CLUSTER_DIR"
    cluster_use "$1"
    case $command in
      kill-node) stop_rabbitmq --kill ;;
      stop-node) stop_rabbitmq ;;
      start-node) start_rabbitmq ;;
    esac
    ;;
  *) usage ;;
esac
