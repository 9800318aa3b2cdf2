-- Charges: a member's can purchases (CHARGE) and the bonus cans granted for them (EVENT)
-- (SPEC W3, seed 003).
--
-- status (what the row is; set at insert, never changed):
--   CHARGE  a purchase: inserted with payment_status REQUEST when the member starts paying
--           (by the app backend; the admin API stands in for it).
--   EVENT   a bonus: inserted COMPLETE by grant-bonus, in the transaction that credits its
--           cans under the member's lock and moves its charge_event_job to DONE (the job's
--           result_charge_id). `method` holds the job's method_snapshot (the reason).
--
-- payment_status:
--   REQUEST   the payment started; nothing credited.
--   COMPLETE  terminal. REQUEST -> COMPLETE only by the payment completion, the one code path
--             behind every gateway's webhook and verify call: `UPDATE ... WHERE id = ? AND
--             payment_status = 'REQUEST' AND ...`. 1 row = this call completes it and, in the
--             same transaction, credits the member's cans and writes the bonus jobs; 0 rows =
--             completed before: nothing is written and the original result is returned.
CREATE TABLE charges (
    id               BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    member_id        BIGINT UNSIGNED NOT NULL,
    status           VARCHAR(10)     NOT NULL DEFAULT 'CHARGE',
    cans             INT             NOT NULL,
    -- What the member pays (exact money); NULL for EVENT. The gateway's reported amount
    -- must equal it for the payment to complete.
    price            DECIMAL(36,18)  NULL,
    payment_gateway  VARCHAR(30)     NOT NULL,
    container        VARCHAR(10)     NOT NULL,
    -- The payment method (e.g. card); an EVENT charge's reason (its job's method_snapshot).
    method           VARCHAR(100)    NOT NULL,
    payment_status   VARCHAR(10)     NOT NULL DEFAULT 'REQUEST',
    -- The gateway's id of the payment (PG receipt, Apple transaction id, Google order id),
    -- recorded by the completion: one gateway payment completes at most one charge.
    gateway_tx_id    VARCHAR(190)    NULL,
    completed_at     TIMESTAMP(6)    NULL,
    created_at       TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at       TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    -- A replayed receipt (the same gateway payment presented for a second charge) is refused.
    UNIQUE KEY uk_charges_gateway_tx (payment_gateway, gateway_tx_id),
    -- getPaymentCount: a member's EVENT charges with one method inside an event's window; also
    -- the completion's "first charge?" count (member_id, status prefix).
    KEY index_charges_payment_count (member_id, status, method, created_at),
    CONSTRAINT fk_charges_member FOREIGN KEY (member_id) REFERENCES members (id),
    CONSTRAINT ck_charges_status CHECK (status IN ('CHARGE', 'EVENT')),
    CONSTRAINT ck_charges_payment_status CHECK (payment_status IN ('REQUEST', 'COMPLETE')),
    CONSTRAINT ck_charges_gateway
        CHECK (payment_gateway IN ('PG', 'PAYVERSE', 'HECTO', 'GOOGLE_IAP', 'APPLE_IAP')),
    CONSTRAINT ck_charges_container CHECK (container IN ('pg', 'aos', 'ios')),
    CONSTRAINT ck_charges_cans CHECK (cans > 0),
    CONSTRAINT ck_charges_price CHECK (status = 'EVENT' OR (price IS NOT NULL AND price >= 0)),
    CONSTRAINT ck_charges_event_complete CHECK (status <> 'EVENT' OR payment_status = 'COMPLETE'),
    CONSTRAINT ck_charges_completed
        CHECK (payment_status <> 'COMPLETE' OR completed_at IS NOT NULL)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
