# shellcheck shell=bash
# Settings for the local (developer / CI) MariaDB and RabbitMQ instances.
# Sourced by the other scripts in this folder; can also be sourced by tests
# (`. infra/local/env.sh`) to get the URLs. Every PAYBUS_* value below can be
# overridden from the environment.

# This folder and the repository root (two levels up), symlinks resolved.
PAYBUS_LOCAL_DIR="$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")"
PAYBUS_REPO_DIR="$(cd -P -- "$PAYBUS_LOCAL_DIR/../.." && pwd -P)"

# Daemons and admin tools live in sbin, which a non-login PATH may lack.
case ":$PATH:" in
  *:/usr/sbin:*) ;;
  *) PATH="$PATH:/usr/sbin:/sbin" ;;
esac

: "${PAYBUS_STATE_DIR:=$PAYBUS_REPO_DIR/.local}"
case "$PAYBUS_STATE_DIR" in
  /*) ;;
  *) PAYBUS_STATE_DIR="$PWD/$PAYBUS_STATE_DIR" ;;
esac

: "${PAYBUS_MARIADB_PORT:=13306}"
: "${PAYBUS_MARIADB_DATABASE:=paybus}"
: "${PAYBUS_AMQP_PORT:=5682}"
: "${PAYBUS_RABBITMQ_MGMT_PORT:=15682}"
: "${PAYBUS_RABBITMQ_DIST_PORT:=25682}"
: "${PAYBUS_RABBITMQ_NODENAME:=paybus@localhost}"
: "${PAYBUS_MARIADB_START_TIMEOUT:=60}"
: "${PAYBUS_RABBITMQ_START_TIMEOUT:=90}"
: "${PAYBUS_STOP_TIMEOUT:=60}"
# The local RabbitMQ's quorum-queue write-ahead log size, in bytes: its entries stay in memory
# until it rolls over (see lib.sh's rabbitmq.conf).
: "${PAYBUS_RABBITMQ_WAL_MAX_BYTES:=67108864}"
# Extra mariadbd options, space-separated, after the defaults (so they win): a measurement's
# server settings, e.g. "--innodb-buffer-pool-size=1G --performance-schema=ON".
PAYBUS_MARIADB_OPTIONS="${PAYBUS_MARIADB_OPTIONS:-}"

# Per-service state folders (data, sockets, pid files, logs).
PAYBUS_MARIADB_DIR="$PAYBUS_STATE_DIR/mariadb"
PAYBUS_RABBITMQ_DIR="$PAYBUS_STATE_DIR/rabbitmq"
PAYBUS_MARIADB_SOCKET="$PAYBUS_MARIADB_DIR/sock"

# Connection URLs for the application and tests.
PAYBUS_DATABASE_URL="mysql://root@127.0.0.1:$PAYBUS_MARIADB_PORT/$PAYBUS_MARIADB_DATABASE"
PAYBUS_AMQP_URL="amqp://guest:guest@127.0.0.1:$PAYBUS_AMQP_PORT/%2f"
PAYBUS_RABBITMQ_MGMT_URL="http://127.0.0.1:$PAYBUS_RABBITMQ_MGMT_PORT"

export PATH PAYBUS_LOCAL_DIR PAYBUS_REPO_DIR PAYBUS_STATE_DIR \
  PAYBUS_MARIADB_PORT PAYBUS_MARIADB_DATABASE PAYBUS_AMQP_PORT \
  PAYBUS_RABBITMQ_MGMT_PORT PAYBUS_RABBITMQ_DIST_PORT PAYBUS_RABBITMQ_NODENAME \
  PAYBUS_MARIADB_START_TIMEOUT PAYBUS_RABBITMQ_START_TIMEOUT PAYBUS_STOP_TIMEOUT PAYBUS_MARIADB_OPTIONS \
  PAYBUS_RABBITMQ_WAL_MAX_BYTES \
  PAYBUS_MARIADB_DIR PAYBUS_RABBITMQ_DIR PAYBUS_MARIADB_SOCKET \
  PAYBUS_DATABASE_URL PAYBUS_AMQP_URL PAYBUS_RABBITMQ_MGMT_URL
