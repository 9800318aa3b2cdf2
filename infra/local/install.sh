#!/usr/bin/env bash
# Installs MariaDB and RabbitMQ from Debian packages if they are missing, and the kernel's
# network tools chaos's network faults use (iproute2: ip netns, veth, tc, ss -K; nftables:
# loss and partitions inside a run's namespaces). Safe without an init system: package
# scripts are told not to start services.
set -euo pipefail

# shellcheck source=SCRIPTDIR/env.sh
. "$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")/env.sh"

PACKAGES=(mariadb-server mariadb-client rabbitmq-server iproute2 nftables)
# Commands the other scripts use, and the package each comes from.
declare -A NEEDED=(
  [mariadbd]=mariadb-server
  [mariadb-install-db]=mariadb-server
  [mariadb]=mariadb-client
  [mariadb-admin]=mariadb-client
  [rabbitmq-server]=rabbitmq-server
  [rabbitmqctl]=rabbitmq-server
  [ip]=iproute2
  [tc]=iproute2
  [ss]=iproute2
  [nft]=nftables
)

missing_commands() {
  local cmd
  for cmd in "${!NEEDED[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || printf '%s\n' "$cmd"
  done
}

mapfile -t missing < <(missing_commands | sort)
if ((${#missing[@]} == 0)); then
  echo "install: ${PACKAGES[*]} already installed"
  exit 0
fi

if ((EUID != 0)); then
  echo "install: missing commands: ${missing[*]}" >&2
  echo "install: run as root, or: sudo apt-get install -y ${PACKAGES[*]}" >&2
  exit 1
fi

echo "install: missing commands: ${missing[*]}; installing ${PACKAGES[*]}"

# Without an init system, package postinst scripts that start services would
# fail; the Debian way to prevent that is a policy-rc.d that exits 101.
POLICY=/usr/sbin/policy-rc.d
created_policy=0
cleanup() {
  if ((created_policy)); then
    rm -f -- "$POLICY"
  fi
}
trap cleanup EXIT
if [[ ! -e $POLICY ]]; then
  printf '#!/bin/sh\n# temporary, written by paybus infra/local/install.sh\nexit 101\n' >"$POLICY"
  chmod 755 "$POLICY"
  created_policy=1
  echo "install: wrote a temporary $POLICY (exit 101) so package scripts start no service"
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y "${PACKAGES[@]}"

mapfile -t still_missing < <(missing_commands | sort)
if ((${#still_missing[@]} > 0)); then
  echo "install: still missing after apt-get install: ${still_missing[*]}" >&2
  exit 1
fi
echo "install: installed ${PACKAGES[*]} ($(dpkg-query -W -f='${Package} ${Version}; ' "${PACKAGES[@]}"))"
