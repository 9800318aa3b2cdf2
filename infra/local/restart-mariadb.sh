#!/usr/bin/env bash
# Stops then starts only the local mariadb instance (used by fault tests): restart.sh mariadb [--kill].
exec "$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")/restart.sh" mariadb "$@"
