#!/usr/bin/env bash
# The markets demo (W4): suspending a market cancels every open order, in tasks materialised
# after the suspend committed, with its progress visible all the way.
#
# Starts the local services and `paybus run`; creates a market with 500 open orders through
# the admin API, fills one (no longer open: no task for it), suspends the market (one short
# request, whatever the number of orders), shows the progress until it is complete, and a
# clean `paybus audit`.
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

start_paybus
symbol="DEMO-KRW"
admin -d "{\"symbol\":\"$symbol\"}" "$api/v1/admin/markets" >/dev/null
echo -n "500 open orders placed"
# Eight at a time, as a trading front end places them: one at a time took minutes on a loaded
# machine, most of it in starting curl.
seq 500 | xargs -P 8 -I{} curl -fsS -o /dev/null -H "Authorization: Bearer $token" \
  -H 'Content-Type: application/json' \
  -d '{"account_id":{},"side":"BUY","price":"100","quantity":"1"}' \
  "$api/v1/admin/markets/$symbol/orders"
filled=$(sql "SELECT MIN(id) FROM orders")
admin -d '{"quantity":"1"}' "$api/v1/admin/orders/$filled/fills" >/dev/null
echo "; order $filled filled"
echo -n "suspend: "
admin -o /dev/null -w '%{http_code} in %{time_total} s\n' -d '{"note":"demo maintenance"}' \
  "$api/v1/admin/markets/$symbol/suspend"
progress() { admin "$api/v1/admin/markets/$symbol/suspension" | json_field summary; }
for _ in $(seq 150); do
  summary=$(progress)
  echo "  $summary"
  [[ $summary == "suspension complete"* ]] && break
  sleep 0.2
done
echo "orders by status (expect 499 CANCELLED, 1 FILLED):"
sql "SELECT CONCAT('  ', status, ': ', COUNT(*)) FROM orders GROUP BY status ORDER BY status"
echo "tasks by state (expect 499 DONE: the filled order was not open at the suspension):"
sql "SELECT CONCAT('  ', state, ': ', COUNT(*)) FROM tasks GROUP BY state ORDER BY state"
finish
