-- Partners: the merchants whose balances the ledger keeps and whom we notify by webhook.
--
-- No state machine: a row is inserted by partner onboarding (admin tooling) and its webhook
-- settings are edited by ops. Every money row (withdrawals, deposits, partner_balances,
-- ledger_entries, partner_notifications) points here.
--
-- webhook_url NULL means "this partner takes no webhooks": deliver-webhook skips its
-- notifications instead of failing them. webhook_secret signs every delivery (HMAC).
CREATE TABLE partners (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    name            VARCHAR(190)    NOT NULL,
    webhook_url     VARCHAR(2000)   NULL,
    webhook_secret  VARCHAR(255)    NOT NULL,
    created_at      TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at      TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
