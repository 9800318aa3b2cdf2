#!/usr/bin/env bash
# Debian's prometheus package (the server and promtool), for the suite's checks of the alert
# rules: `promtool check rules` and `promtool test rules` (tests/tests/alert_rules.rs). Installed
# with apt when promtool is missing; the package's own service is not what the tests use.
#
# Idempotent. Prints the variable the tests read (source-able); infra/test.sh exports it.
set -euo pipefail

if ! command -v promtool >/dev/null 2>&1; then
  echo "installing Debian's prometheus (promtool, for the alert rules' tests)" >&2
  if [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >&2
  else
    echo "promtool is missing: apt-get install prometheus (as root)" >&2
    exit 1
  fi
fi
echo "PAYBUS_TEST_PROMTOOL=$(command -v promtool)"
