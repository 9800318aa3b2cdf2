#!/usr/bin/env bash
# Stops the private MariaDB and RabbitMQ instances. Idempotent: nothing
# running is not an error.
#   infra/local/stop.sh [--kill] [mariadb|rabbitmq|all]...
# --kill: SIGKILL instead of a clean shutdown (crash simulation).
set -euo pipefail

# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")/lib.sh"

mode=()
if [[ ${1:-} == --kill ]]; then
  mode=(--kill)
  shift
fi
services_list=$(paybus_services "$@")
mapfile -t services <<<"$services_list"
paybus_lock
for service in "${services[@]}"; do
  if [[ $service == rabbitmq ]] && ! command -v rabbitmqctl >/dev/null 2>&1; then
    echo "RabbitMQ: not installed, nothing to stop"
    continue
  fi
  if [[ $service == mariadb ]] && ! command -v mariadb >/dev/null 2>&1; then
    echo "MariaDB: not installed, nothing to stop"
    continue
  fi
  "stop_$service" "${mode[@]}"
done
