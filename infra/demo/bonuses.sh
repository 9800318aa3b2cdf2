#!/usr/bin/env bash
# The bonuses demo (W3): a charge-event bonus granted exactly once, however often the payment's
# completion arrives (the gateway's webhook and the app's verify call, each repeated).
#
# Starts the local services and `paybus run`; creates a member, a charge event (+50 %) and a
# purchase of 300 cans through the admin API; sends the payment completion four times (twice
# by webhook, twice by verify, signed like the payment service), then shows the member's
# balance, the charges and the bonus job, and a clean `paybus audit`.
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

start_paybus
member=$(admin -d '{"nickname":"demo member"}' "$api/v1/admin/members" | json_field id)
now=$(date -u +%s)
event=$(admin -d "{\"title\":\"demo event\",\"add_percent\":50,\"start_at\":\"$(date -u -d "@$((now - 3600))" +%FT%TZ)\",\"end_at\":\"$(date -u -d "@$((now + 3600))" +%FT%TZ)\"}" \
  "$api/v1/admin/charge-events" | json_field id)
charge=$(admin -d "{\"member_id\":$member,\"cans\":300,\"price\":\"3300\",\"payment_gateway\":\"GOOGLE_IAP\",\"method\":\"google play\"}" \
  "$api/v1/admin/charges" | json_field id)
echo "member $member, charge event $event (+50 %), purchase $charge (300 cans for 3300)"

body="{\"charge_id\":$charge,\"gateway_tx_id\":\"GPA.demo-$charge\",\"amount\":\"3300\"}"
echo -n "the completion sent 4 times at once (webhook x2, verify x2), answers: "
senders=()
for path in webhook webhook verify verify; do
  signed_post "/v1/payments/google-iap/$path" "$body" "$PAYBUS_PAYMENTS_SECRET" &
  senders+=($!)
done
wait "${senders[@]}"
echo
await_sql "SELECT COUNT(*) FROM charge_event_job WHERE source_charge_id = $charge AND status = 'DONE'" 1
echo
echo "the member's balance (300 bought + 150 bonus, expect 450 in aos):"
admin "$api/v1/admin/members/$member" | python3 -c 'import json,sys; m=json.load(sys.stdin); print("  ", {k: v for k, v in m.items() if "can" in k})'
echo "charges (expect one CHARGE COMPLETE and one EVENT):"
sql "SELECT CONCAT('  charge ', id, ': ', status, ' ', cans, ' cans, ', payment_status) FROM charges WHERE member_id = $member ORDER BY id"
echo "bonus jobs (expect one, DONE):"
sql "SELECT CONCAT('  job ', id, ': ', job_type, ' ', additional_can, ' cans, ', status, ', charge ', COALESCE(result_charge_id, '-')) FROM charge_event_job WHERE member_id = $member"
finish
