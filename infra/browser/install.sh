#!/usr/bin/env bash
# The Python tools of the API's black-box tests, installed into the repository's own venv
# (.local/venv, git-ignored) so a fresh clone needs nothing by hand:
# - schemathesis fuzzes the API from its served OpenAPI document (cli/tests/schemathesis.rs);
# - playwright drives Debian's chromium through the console (cli/tests/console_browser.rs).
#   Playwright's own browser download cannot work here (no network but the registries), so
#   the tests point it at the system chromium (`executable_path`), installed with apt if missing;
# - standardwebhooks and svix, the Standard Webhooks reference library and Svix's, verify what
#   deliver-webhook sends (functions/deliver-webhook/tests/standard_webhooks.rs);
# - axe-core (npm, pinned in package-lock.json), the accessibility engine the console's page
#   test injects into every page (cli/tests/console_pages_browser.rs), installed with `npm ci`
#   into .local/axe: npm ci installs exactly the locked tree but reads the lock only from the
#   folder it installs into, so both files are copied there first (as infra/oidc/install.sh).
#
# Idempotent: a second run finds everything in place and returns in about a second.
# Prints the variables the tests read (source-able); infra/test.sh exports them.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$repo/.local/venv"
# Pinned: a schemathesis upgrade changes which checks run and what they report.
requirements="schemathesis==4.32.5 playwright==1.65.2 standardwebhooks==1.1.0 svix==2.9.1"

if ! command -v chromium >/dev/null 2>&1; then
  echo "installing Debian's chromium (for the console's browser test)" >&2
  if [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2
  else
    echo "chromium is missing: apt-get install chromium (as root)" >&2
    exit 1
  fi
fi

stamp="$venv/.installed"
if [[ ! -f $stamp || $(cat "$stamp") != "$requirements" ]]; then
  echo "installing $requirements into $venv" >&2
  python3 -m venv "$venv"
  # shellcheck disable=SC2086 # one word per requirement
  "$venv/bin/pip" install --quiet --disable-pip-version-check $requirements >&2
  echo "$requirements" >"$stamp"
fi

here="$repo/infra/browser"
axe="$repo/.local/axe"
npm="$(command -v npm || true)"
if [[ -z $npm ]]; then
  echo "npm is missing (axe-core, for the console's accessibility test): apt-get install nodejs npm" >&2
  exit 1
fi
mkdir -p "$axe"
axe_stamp="$axe/.installed"
lock_hash="$(sha256sum "$here/package-lock.json" | cut -d' ' -f1)"
if [[ ! -f $axe_stamp || $(cat "$axe_stamp") != "$lock_hash" || ! -f $axe/node_modules/axe-core/axe.min.js ]]; then
  echo "installing axe-core into $axe (npm ci)" >&2
  cp "$here/package.json" "$here/package-lock.json" "$axe/"
  (cd "$axe" && "$npm" ci --no-audit --no-fund --loglevel=error >&2)
  echo "$lock_hash" >"$axe_stamp"
fi

echo "export PAYBUS_TEST_PYTHON=$venv/bin/python"
echo "export PAYBUS_TEST_SCHEMATHESIS=$venv/bin/schemathesis"
echo "export PAYBUS_TEST_CHROMIUM=$(command -v chromium)"
echo "export PAYBUS_TEST_AXE=$axe/node_modules/axe-core/axe.min.js"
