#!/usr/bin/env bash
# Stops then starts only the local rabbitmq instance (used by fault tests): restart.sh rabbitmq [--kill].
exec "$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")/restart.sh" rabbitmq "$@"
