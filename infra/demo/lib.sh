# shellcheck shell=bash
# What every workflow demo shares: the local services, a paybus binary, `paybus run` with demo
# secrets on its own port, a partner endpoint that records webhooks, and small helpers.
# Sourced by infra/demo/<workflow>.sh; not run alone.
#
# Overrides (the suite's smoke test uses them, so a demo runs beside the tests):
#   PAYBUS_BIN                  a built paybus binary (default: build the release one)
#   PAYBUS_DEMO_DATABASE_URL,   the database and broker to use (default: a database and a
#   PAYBUS_DEMO_AMQP_URL        vhost `paybus_demo` on the local services, made anew)
#   PAYBUS_DEMO_HTTP_PORT,      the API's, the partner endpoint's and (p2p) the quote
#   PAYBUS_DEMO_PARTNER_PORT,   service's ports (18080, 18089, 18090)
#   PAYBUS_DEMO_QUOTE_PORT
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
infra/local/start.sh >/dev/null
# shellcheck source=../local/env.sh
source infra/local/env.sh
# A database and a vhost of the demo's own, made anew each run, so what it prints is what it
# did, and a `paybus run` of infra/run.sh never takes its messages.
if [[ -z ${PAYBUS_DEMO_DATABASE_URL:-} ]]; then
  mariadb -uroot -S "$PAYBUS_MARIADB_SOCKET" -e \
    "DROP DATABASE IF EXISTS paybus_demo; CREATE DATABASE paybus_demo"
  PAYBUS_DEMO_DATABASE_URL="${PAYBUS_DATABASE_URL%/*}/paybus_demo"
fi
if [[ -z ${PAYBUS_DEMO_AMQP_URL:-} ]]; then
  curl -fsS -u guest:guest -X DELETE "$PAYBUS_RABBITMQ_MGMT_URL/api/vhosts/paybus_demo" >/dev/null 2>&1 || true
  curl -fsS -u guest:guest -X PUT "$PAYBUS_RABBITMQ_MGMT_URL/api/vhosts/paybus_demo" >/dev/null
  curl -fsS -u guest:guest -X PUT -H 'Content-Type: application/json' \
    -d '{"configure":".*","write":".*","read":".*"}' \
    "$PAYBUS_RABBITMQ_MGMT_URL/api/permissions/paybus_demo/guest" >/dev/null
  PAYBUS_DEMO_AMQP_URL="${PAYBUS_AMQP_URL%/*}/paybus_demo"
fi
export PAYBUS_DATABASE_URL="$PAYBUS_DEMO_DATABASE_URL"
export PAYBUS_AMQP_URL="$PAYBUS_DEMO_AMQP_URL"
demo_database="${PAYBUS_DATABASE_URL##*/}"
demo_database="${demo_database%%\?*}"

export PAYBUS_ADMIN_JWT_SECRET="demo-admin-jwt-secret-0123456789abcdef"
# The demos act with a break-glass token: no identity provider runs beside them.
export PAYBUS_BREAK_GLASS=true
export PAYBUS_CHAIN_MONITOR_SECRET="demo-chain-monitor-secret-0123"
export PAYBUS_PAYMENTS_SECRET="demo-payments-secret-01234567"
export PAYBUS_PARTNER_KEY_HASH_KEY="demo-partner-key-hash-key-0123456789abcdef"
# Seals the partners' webhook secrets at rest (32 bytes, hex): a demo's own, never a real one.
export PAYBUS_SECRETS_KEY="64656d6f206b6579206f6e6c792c206e657665722061207265616c206f6e6521"
export PAYBUS_HTTP_ADDR="127.0.0.1:${PAYBUS_DEMO_HTTP_PORT:-18080}"
export RUST_LOG="${RUST_LOG:-info}"
api="http://$PAYBUS_HTTP_ADDR"
partner_port="${PAYBUS_DEMO_PARTNER_PORT:-18089}"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

if [[ -n ${PAYBUS_BIN:-} ]]; then
  paybus="$PAYBUS_BIN"
else
  cargo build -q --release --locked -p paybus
  paybus="$repo/target/release/paybus"
fi
token=$("$paybus" token issue --role ADMIN --subject demo --ttl 1h)

# `paybus run` (every function, the sweeper and the API) in the background, its log kept.
start_paybus() {
  "$paybus" migrate >/dev/null
  "$paybus" topology >/dev/null
  "$paybus" run >"$work/paybus.log" 2>&1 &
  for _ in $(seq 300); do curl -fs "$api/health" >/dev/null && return 0; sleep 0.1; done
  echo "paybus did not answer on $api/health; its log:" >&2
  tail -20 "$work/paybus.log" >&2
  return 1
}

# A partner that answers 200 to every webhook and appends "<event> <body>" to a file.
start_partner() {
  python3 - "$partner_port" "$work/webhooks.log" <<'PY' &
import http.server, sys
port, log = int(sys.argv[1]), sys.argv[2]
class Partner(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(log, "a") as f:
            f.write(self.headers.get("X-Paybus-Event", "") + " " + body.decode() + "\n")
        self.send_response(200); self.end_headers()
    def log_message(self, *args): pass
http.server.HTTPServer(("127.0.0.1", port), Partner).serve_forever()
PY
  touch "$work/webhooks.log"
}

# A partner with that endpoint; prints its id.
create_partner() {
  admin -d "{\"name\":\"$1\",\"webhook_url\":\"http://127.0.0.1:$partner_port/hook\",\"webhook_secret\":\"demo-webhook-secret-0123\"}" \
    "$api/v1/admin/partners" | json_field id
}

admin() { curl -fsS -H "Authorization: Bearer $token" -H 'Content-Type: application/json' "$@"; }
# A new API key of partner $1 (`pbk_…`, shown once), created by an ADMIN.
partner_key() { admin -d '{"label":"demo"}' "$api/v1/admin/partners/$1/api-keys" | json_field key; }
# A partner API call with key $1: `as_partner "$key" [curl args…]`.
as_partner() {
  local key=$1
  shift
  curl -fsS -H "Authorization: Bearer $key" -H 'Content-Type: application/json' "$@"
}
json_field() { python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
sql() { mariadb -uroot -S "$PAYBUS_MARIADB_SOCKET" -N "$demo_database" -e "$1"; }

# POSTs `body` to `path` signed as the chain monitor and the payment service sign
# (`X-Paybus-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`); prints the status.
signed_post() {
  local path=$1 body=$2 secret=$3 t signature
  t=$(date +%s)
  signature=$(printf '%s.%s' "$t" "$body" | openssl dgst -sha256 -hmac "$secret" -r | cut -d' ' -f1)
  curl -s -o /dev/null -w '%{http_code} ' -H 'Content-Type: application/json' \
    -H "X-Paybus-Signature: t=$t,v1=$signature" -d "$body" "$api$path"
}

# Waits until `sql` prints `want` (at most 30 s).
await_sql() {
  local query=$1 want=$2
  for _ in $(seq 150); do [[ "$(sql "$query")" == "$want" ]] && return 0; sleep 0.2; done
  echo "timed out waiting for: $query = $want (got $(sql "$query"))" >&2
  return 1
}

# The last word: every workflow's invariants.
finish() {
  echo
  RUST_LOG=warn "$paybus" audit --since 1h
}
