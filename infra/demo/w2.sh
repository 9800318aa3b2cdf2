#!/usr/bin/env bash
# W2 demo: duplicate withdrawal confirmations debit once and notify the partner once.
#
# Starts the local services and `paybus run` (with demo secrets), a tiny partner endpoint that
# counts webhooks, creates a partner and three BROADCASTING withdrawals through the admin API,
# sends every confirmation three times at once (signed like the chain monitor does), then
# shows one DEBIT and one webhook per withdrawal and a clean `paybus audit`.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
infra/local/start.sh >/dev/null
# shellcheck source=../local/env.sh
source infra/local/env.sh

export PAYBUS_ADMIN_JWT_SECRET="demo-admin-jwt-secret-0123456789abcdef"
export PAYBUS_CHAIN_MONITOR_SECRET="demo-chain-monitor-secret-0123"
export PAYBUS_HTTP_ADDR="127.0.0.1:18080"
api="http://$PAYBUS_HTTP_ADDR"
partner_port=18089
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

cargo build -q --release --locked -p paybus
paybus="$repo/target/release/paybus"
token=$("$paybus" token issue --role ADMIN --subject demo --ttl 1h)
"$paybus" migrate >/dev/null
"$paybus" run >"$work/paybus.log" 2>&1 &

# The partner: answers 200 to every POST and appends the body to a file.
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

for _ in $(seq 100); do curl -fs "$api/health" >/dev/null && break; sleep 0.1; done

admin() { curl -fsS -H "Authorization: Bearer $token" -H 'Content-Type: application/json' "$@"; }
json_id() { python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])'; }

partner=$(admin -d "{\"name\":\"demo partner\",\"webhook_url\":\"http://127.0.0.1:$partner_port/hook\",\"webhook_secret\":\"demo-webhook-secret-0123\"}" "$api/v1/admin/partners" | json_id)
echo "partner $partner created"
withdrawals=()
for i in 1 2 3; do
  id=$(admin -d "{\"partner_id\":$partner,\"status\":\"BROADCASTING\",\"currency\":\"USDT\",\"amount\":\"100\",\"to_address\":\"T-demo-$i\"}" "$api/v1/admin/withdrawals" | json_id)
  withdrawals+=("$id")
done
echo "withdrawals ${withdrawals[*]} created (BROADCASTING, 100 USDT each)"

confirm() {
  local body="{\"withdrawal_id\":$1,\"tx_hash\":\"0xdemo$1\"}" t signature
  t=$(date +%s)
  signature=$(printf '%s.%s' "$t" "$body" | openssl dgst -sha256 -hmac "$PAYBUS_CHAIN_MONITOR_SECRET" -r | cut -d' ' -f1)
  curl -s -o /dev/null -w '%{http_code} ' -H 'Content-Type: application/json' \
    -H "X-Paybus-Signature: t=$t,v1=$signature" -d "$body" "$api/v1/chain-monitor/withdrawal-confirmations"
}
echo -n "each confirmation sent 3 times at once, answers: "
senders=()
for id in "${withdrawals[@]}"; do for _ in 1 2 3; do confirm "$id" & senders+=($!); done; done
wait "${senders[@]}"; echo

for _ in $(seq 100); do
  [[ -f "$work/webhooks.log" ]] && (( $(wc -l <"$work/webhooks.log") >= 3 )) && break
  sleep 0.2
done
sleep 1
sql() { mariadb -uroot -S "$PAYBUS_MARIADB_SOCKET" -N paybus -e "$1"; }
ids=$(IFS=,; echo "${withdrawals[*]}")
echo
echo "DEBITs per withdrawal (expect 1 each):"
sql "SELECT CONCAT('  withdrawal ', reference_id, ': ', COUNT(*), ' DEBIT, key ', MAX(idem_key)) FROM ledger_entries WHERE reference_type='WITHDRAWAL' AND entry_type='DEBIT' AND reference_id IN ($ids) GROUP BY reference_id"
echo "webhooks the partner received (expect 3, one per withdrawal):"
sed 's/^/  /' "$work/webhooks.log"
echo "skipped duplicates in the log: $(grep -c 'already CONFIRMED' "$work/paybus.log" || true)"
"$paybus" audit
