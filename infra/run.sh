#!/usr/bin/env bash
# Runs the system locally, from nothing: installs and starts MariaDB and RabbitMQ if needed,
# builds paybus, applies migrations, declares the topology, then runs every function, the
# dead-letter recorders, the sweeper and the HTTP API in one process (`paybus run`) until
# Ctrl-C.
#
# Local mode: when PAYBUS_ADMIN_JWT_SECRET, PAYBUS_CHAIN_MONITOR_SECRET or PAYBUS_SECRETS_KEY
# (the key partner webhook secrets are sealed with) is unset, development secrets are
# generated once into the git-ignored state folder
# (.local/dev-secrets.env) and used, break-glass tokens are switched on (no identity provider
# runs locally), so the admin API and the intake answer from the first request; a break-glass
# ADMIN token and an example session are printed. Production never runs this
# script: there an unset secret keeps its route closed (503).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

infra/local/start.sh
# shellcheck source=local/env.sh
source infra/local/env.sh
cargo build --release --locked -p paybus
paybus="$repo/target/release/paybus"

secrets="$PAYBUS_STATE_DIR/dev-secrets.env"
if [[ -z ${PAYBUS_ADMIN_JWT_SECRET:-} || -z ${PAYBUS_CHAIN_MONITOR_SECRET:-} || -z ${PAYBUS_SECRETS_KEY:-} || -z ${PAYBUS_PARTNER_KEY_HASH_KEY:-} ]]; then
  random() { head -c "${1:-16}" /dev/urandom | od -An -tx1 | tr -d ' \n'; }
  if [[ ! -f $secrets ]] || ! grep -q '^PAYBUS_ADMIN_JWT_SECRET=' "$secrets"; then
    (
      umask 077
      printf 'PAYBUS_ADMIN_JWT_SECRET=dev-jwt-%s\nPAYBUS_CHAIN_MONITOR_SECRET=dev-monitor-%s\n' \
        "$(random)" "$(random)" >"$secrets"
    )
  fi
  # Added to an existing file too (one written before the key existed). Losing this key
  # loses the partners' sealed webhook secrets of the local database.
  if ! grep -q '^PAYBUS_SECRETS_KEY=' "$secrets"; then
    (umask 077 && printf 'PAYBUS_SECRETS_KEY=%s\n' "$(random 32)" >>"$secrets")
  fi
  if ! grep -q '^PAYBUS_PARTNER_KEY_HASH_KEY=' "$secrets"; then
    (umask 077 && printf 'PAYBUS_PARTNER_KEY_HASH_KEY=dev-partner-keys-%s\n' "$(random 16)" >>"$secrets")
  fi
  while IFS='=' read -r name value; do
    [[ -n ${!name:-} ]] || export "$name=$value"
  done <"$secrets"
  # One developer is both people of a four-eyes approval here: off unless asked for. No
  # identity provider runs locally: the printed token is a break-glass one, and every action
  # taken with it is marked so (PAYBUS_OIDC_ISSUER signs people in instead).
  export PAYBUS_FOUR_EYES="${PAYBUS_FOUR_EYES:-off}"
  export PAYBUS_BREAK_GLASS="${PAYBUS_BREAK_GLASS:-true}"
  token=$("$paybus" token issue --role ADMIN --subject dev --ttl 12h)
  api="http://${PAYBUS_HTTP_ADDR:-127.0.0.1:8080}"
  cat <<EXAMPLE

== Local mode: development secrets (generated once into $secrets; never for production)
   PAYBUS_ADMIN_JWT_SECRET=$PAYBUS_ADMIN_JWT_SECRET
   PAYBUS_CHAIN_MONITOR_SECRET=$PAYBUS_CHAIN_MONITOR_SECRET
   PAYBUS_SECRETS_KEY=$PAYBUS_SECRETS_KEY
   PAYBUS_PARTNER_KEY_HASH_KEY=$PAYBUS_PARTNER_KEY_HASH_KEY
   a break-glass ADMIN token for 12 h (more: $paybus token issue --role ADMIN|OPS; the CLI
   takes it as PAYBUS_TOKEN):
   $token

== Try W2 from another shell once "paybus running" shows below (paste as is):
export PAYBUS_CHAIN_MONITOR_SECRET=$PAYBUS_CHAIN_MONITOR_SECRET
admin=(-H "Authorization: Bearer $token" -H 'Content-Type: application/json')
partner=\$(curl -s "\${admin[@]}" -d '{"name":"acme"}' $api/v1/admin/partners | sed -E 's/.*"id":([0-9]+).*/\\1/')
withdrawal=\$(curl -s "\${admin[@]}" -d "{\"partner_id\":\$partner,\"status\":\"BROADCASTING\",\"currency\":\"USDT\",\"amount\":\"100.5\",\"to_address\":\"T-acme\"}" $api/v1/admin/withdrawals | tr -dc 0-9)
body="{\"withdrawal_id\":\$withdrawal,\"tx_hash\":\"0xabc\"}"
curl -s -w ' HTTP %{http_code}\n' -H "X-Paybus-Signature: \$($paybus sign "\$body")" -H 'Content-Type: application/json' -d "\$body" $api/v1/chain-monitor/withdrawal-confirmations
sleep 1; curl -s "\${admin[@]}" $api/v1/admin/withdrawals/\$withdrawal; echo

EXAMPLE
fi

"$paybus" migrate
"$paybus" topology
"$paybus" doctor
exec "$paybus" run
