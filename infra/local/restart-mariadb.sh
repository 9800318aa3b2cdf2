#!/usr/bin/env bash
# Stops then starts only the local mariadb instance (used by fault tests).
#   infra/local/restart-mariadb.sh          clean shutdown, then start
#   infra/local/restart-mariadb.sh --kill   SIGKILL (crash), then start
set -euo pipefail

# shellcheck source=SCRIPTDIR/lib.sh
. "$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")/lib.sh"

mode=
case ${1:-} in
  '') ;;
  --kill) mode=--kill ;;
  *)
    echo "usage: $0 [--kill]" >&2
    exit 2
    ;;
esac
paybus_lock
stop_mariadb ${mode:+"$mode"}
start_mariadb
