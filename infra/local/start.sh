#!/usr/bin/env bash
# Starts the private MariaDB and RabbitMQ instances (installing the packages if
# needed). Idempotent: services that already answer are left alone.
#   infra/local/start.sh [mariadb|rabbitmq|all]...
set -euo pipefail

# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")/lib.sh"

services_list=$(paybus_services "$@")
mapfile -t services <<<"$services_list"
"$PAYBUS_LOCAL_DIR/install.sh"
paybus_lock
for service in "${services[@]}"; do
  "start_$service"
done
paybus_print_summary
