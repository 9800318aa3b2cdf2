#!/usr/bin/env bash
# Stops then starts one local service (used by fault tests).
#   infra/local/restart.sh mariadb|rabbitmq          clean shutdown, then start
#   infra/local/restart.sh mariadb|rabbitmq --kill   SIGKILL (crash), then start
set -euo pipefail

# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")/lib.sh"

usage() {
  echo "usage: $0 mariadb|rabbitmq [--kill]" >&2
  exit 2
}
case ${1:-} in
  mariadb | rabbitmq) service=$1 ;;
  *) usage ;;
esac
mode=
case ${2:-} in
  '') ;;
  --kill) mode=--kill ;;
  *) usage ;;
esac
paybus_lock
"stop_$service" ${mode:+"$mode"}
"start_$service"
