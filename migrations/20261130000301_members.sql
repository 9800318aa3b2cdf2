-- Members and their can balances (SPEC W3, seed 003). Cans are the in-app currency a charge
-- buys: whole units (INT, as the seed's `additional_can`), not money, so not DECIMAL.
--
-- One balance per container, where the cans were bought: pg (the web payment gateways),
-- aos (Google Play), ios (the App Store). A balance changes only under this row's lock
-- (`SELECT ... FOR UPDATE`), taken by the payment completion (the charge's cans) and by
-- grant-bonus (an EVENT charge's cans), each in the transaction that writes the charge: the
-- seed's `Member.charge()` was an unlocked read-modify-write (`+=` on an entity read without
-- a lock) that lost one of two concurrent credits.
CREATE TABLE members (
    id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    nickname    VARCHAR(100)    NOT NULL,
    pg_can      INT             NOT NULL DEFAULT 0,
    aos_can     INT             NOT NULL DEFAULT 0,
    ios_can     INT             NOT NULL DEFAULT 0,
    created_at  TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at  TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    CONSTRAINT ck_members_cans CHECK (pg_can >= 0 AND aos_can >= 0 AND ios_can >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
