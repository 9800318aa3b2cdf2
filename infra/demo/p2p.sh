#!/usr/bin/env bash
# The p2p demo (W1): buyers' deposit orders matched against a seller's liquidity with a trade at
# the quote service, and one of them in doubt: the quote service trades but answers after the
# client's timeout, the liquidity stays held for that order, and the next check under the same
# key settles the trade it made — once.
#
# Starts the local services, a quote service stub (trades as a request arrives; answers late
# when told) and `paybus run`; an ADMIN creates a partner and its API key, and the partner,
# with its key, offers 100 USDT and places three buyers' orders through the partner API (the
# switch off: matched inside the request); then the orders, the trades, a clean reconciliation
# with the quote service and a clean `paybus audit`.
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

quote_port="${PAYBUS_DEMO_QUOTE_PORT:-$((partner_port + 1))}"
# The quote service: POST /v1/quotes, POST /v1/trades (idempotent by Idempotency-Key; trades
# on arrival, then sleeps while $work/late exists), GET /v1/trades (the reconciliation
# contract).
python3 - "$quote_port" "$work/late" <<'PY' &
import http.server, json, os, sys, threading, time, datetime, urllib.parse
port, late = int(sys.argv[1]), sys.argv[2]
trades, lock = {}, threading.Lock()
def now(): return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")
class Quotes(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self, status, value):
        body = json.dumps(value).encode()
        try:
            self.send_response(status); self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up waiting: the trade stands all the same
    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/v1/quotes":
            return self.answer(200, {"quote_id": "q-%d" % time.time_ns(), "rate": "1391.5", "fee": "0.1"})
        key = self.headers.get("Idempotency-Key")
        with lock:
            trade = trades.setdefault(key, {"trade_id": "t-%d" % (len(trades) + 1), "idempotency_key": key,
                "reference": request["reference"], "currency": request["currency"],
                "amount": request["amount"], "rate": "1391.5", "fee": "0.1", "created_at": now()})
        if trade["amount"] != request["amount"]:
            return self.answer(409, {"error": "key reused with another amount"})
        if os.path.exists(late):
            time.sleep(3)
        self.answer(200, trade)
    def do_GET(self):
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(self.path).query))
        with lock:
            found = [t for k, t in trades.items()
                     if query.get("idempotency_key", k) == k
                     and query.get("created_since", "") <= t["created_at"] < query.get("created_before", "~")]
        self.answer(200, {"trades": found, "next_after": None})
    def log_message(self, *args): pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Quotes).serve_forever()
PY
export PAYBUS_QUOTE_URL="http://127.0.0.1:$quote_port"
export PAYBUS_QUOTE_TIMEOUT_MS=1000
start_paybus
start_partner
partner=$(create_partner "demo partner")
key=$(partner_key "$partner")
echo "partner $partner, its API key ${key:0:12}… (shown once)"
seller=$(as_partner "$key" -H 'Idempotency-Key: demo-sell-1' -d '{"currency":"USDT","amount":"100"}' \
  "$api/v1/partner/p2p/withdraw-orders" | json_field id)
echo "the partner's seller: withdraw order $seller (100 USDT)"

buy() {
  as_partner "$key" -H "Idempotency-Key: $2" \
    -d "{\"currency\":\"USDT\",\"amount\":\"$1\",\"partner_order_ref\":\"$2\"}" \
    "$api/v1/partner/p2p/deposit-orders"
}
show() { python3 -c 'import json,sys; o=json.load(sys.stdin); print("  order %s: %s %s, %s of %s USDT remaining, last error: %s" % (o["id"], o["status"], o["close_reason"] or "", o["remaining_amount"], o["amount"], o["last_error"]))'; }

echo "buyer A, 40 USDT:"; buy 40 demo-a | show
echo "buyer A's request sent again under its Idempotency-Key: the same answer, no second order:"
buy 40 demo-a | show
echo "the quote service now trades and answers after the client's 1 s timeout"
touch "$work/late"
echo "buyer B, 60 USDT:"; late_order=$(buy 60 demo-b); echo "$late_order" | show
b=$(echo "$late_order" | json_field id)
echo "buyer C, 60 USDT, while B's fill is in doubt (its 60 are still held for B):"; buy 60 demo-c | show
rm -f "$work/late"
echo "the quote service answers in time again; match-deposit asks about B's fill under its key:"
await_sql "SELECT status FROM p2p_deposit_orders WHERE id = $b" MATCHED
admin "$api/v1/admin/p2p/deposit-orders/$b" | show
echo
echo "matches (one trade per settled fill):"
sql "SELECT CONCAT('  order ', deposit_order_id, ': ', status, ' ', CAST(amount AS DECIMAL(10,2)), ' USDT, key ', trade_key, ', trade ', COALESCE(external_trade_id, '-')) FROM p2p_matches ORDER BY id"
echo
"$paybus" reconcile quotes --since 1h
finish
