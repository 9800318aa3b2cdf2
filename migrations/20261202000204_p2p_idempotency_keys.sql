-- The partner API's Idempotency-Key on the orders it creates (alongside partner_order_ref, not
-- instead): a create that ran twice under one key — its first process died after the commit,
-- before its answer was kept — finds the order the first run made instead of making a second.
ALTER TABLE p2p_deposit_orders
    ADD COLUMN idempotency_key VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NULL,
    ADD UNIQUE KEY uk_p2p_deposit_orders_idempotency_key (partner_id, idempotency_key);
ALTER TABLE p2p_withdraw_orders
    ADD COLUMN idempotency_key VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NULL,
    ADD UNIQUE KEY uk_p2p_withdraw_orders_idempotency_key (partner_id, idempotency_key);
