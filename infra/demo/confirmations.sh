#!/usr/bin/env bash
# The confirmations demo (W2): duplicate withdrawal confirmations debit once and notify the
# partner once.
#
# Starts the local services and `paybus run` (with demo secrets), a tiny partner endpoint that
# records webhooks, creates a partner and three BROADCASTING withdrawals through the admin API,
# sends every confirmation three times at once (signed like the chain monitor), then shows one
# DEBIT and one webhook per withdrawal and a clean `paybus audit`.
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

start_paybus
start_partner
partner=$(create_partner "demo partner")
echo "partner $partner created"
withdrawals=()
for i in 1 2 3; do
  id=$(admin -d "{\"partner_id\":$partner,\"status\":\"BROADCASTING\",\"currency\":\"USDT\",\"amount\":\"100\",\"to_address\":\"T-demo-$i\"}" \
    "$api/v1/admin/withdrawals" | json_field id)
  withdrawals+=("$id")
done
echo "withdrawals ${withdrawals[*]} created (BROADCASTING, 100 USDT each)"

echo -n "each confirmation sent 3 times at once, answers: "
senders=()
for id in "${withdrawals[@]}"; do
  for _ in 1 2 3; do
    signed_post /v1/chain-monitor/withdrawal-confirmations \
      "{\"withdrawal_id\":$id,\"tx_hash\":\"0xdemo$id\"}" "$PAYBUS_CHAIN_MONITOR_SECRET" &
    senders+=($!)
  done
done
wait "${senders[@]}"
echo

ids=$(IFS=,; echo "${withdrawals[*]}")
await_sql "SELECT COUNT(*) FROM partner_notifications WHERE reference_type = 'WITHDRAWAL' AND reference_id IN ($ids) AND status = 'DELIVERED'" 3
echo
echo "DEBITs per withdrawal (expect 1 each):"
sql "SELECT CONCAT('  withdrawal ', reference_id, ': ', COUNT(*), ' DEBIT, key ', MAX(idem_key)) FROM ledger_entries WHERE reference_type='WITHDRAWAL' AND entry_type='DEBIT' AND reference_id IN ($ids) GROUP BY reference_id"
echo "webhooks the partner received (expect 3, one per withdrawal):"
sed 's/^/  /' "$work/webhooks.log"
finish
