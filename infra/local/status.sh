#!/usr/bin/env bash
# Tells whether each local service answers. Exit 0 if all asked-for services
# answer, 1 otherwise.
#   infra/local/status.sh [mariadb|rabbitmq|all]...
set -euo pipefail

# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")/lib.sh"

services_list=$(paybus_services "$@")
mapfile -t services <<<"$services_list"
rc=0
for service in "${services[@]}"; do
  case $service in
    mariadb)
      if command -v mariadb >/dev/null 2>&1 && mariadb_answers; then
        version=$(paybus_mariadb_client -Nse 'select version()' 2>/dev/null || true)
        # A real login over TCP, as the application does (root@127.0.0.1).
        if mariadb --no-defaults -h127.0.0.1 -P"$PAYBUS_MARIADB_PORT" -uroot --connect-timeout=3 \
          -e 'select 1' >/dev/null 2>&1; then tcp=ok; else tcp=FAILED; rc=1; fi
        echo "MariaDB:  up ($version, pid $(paybus_mariadb_pid || echo '?'), tcp $PAYBUS_MARIADB_PORT $tcp) $PAYBUS_DATABASE_URL"
      else
        echo "MariaDB:  down (socket $PAYBUS_MARIADB_SOCKET)"
        rc=1
      fi
      ;;
    rabbitmq)
      if command -v rabbitmqctl >/dev/null 2>&1 && rabbitmq_answers; then
        if paybus_tcp_open "$PAYBUS_AMQP_PORT"; then tcp=open; else tcp=CLOSED; rc=1; fi
        if paybus_tcp_open "$PAYBUS_RABBITMQ_MGMT_PORT"; then mgmt=open; else mgmt=closed; fi
        echo "RabbitMQ: up (node $PAYBUS_RABBITMQ_NODENAME, pid $(paybus_rabbitmq_pid || echo '?'), amqp $PAYBUS_AMQP_PORT $tcp, management $PAYBUS_RABBITMQ_MGMT_PORT $mgmt) $PAYBUS_AMQP_URL"
      else
        echo "RabbitMQ: down (node $PAYBUS_RABBITMQ_NODENAME)"
        rc=1
      fi
      ;;
  esac
done
exit "$rc"
