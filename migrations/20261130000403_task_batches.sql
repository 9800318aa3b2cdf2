-- Task batches (SPEC W4, seed 004): what one state change owes, frozen when it happened. A
-- suspension writes one batch in its own transaction; its tasks are materialised afterwards,
-- in chunks, by whoever holds the batch row (the suspend request for the first chunk, then
-- cancel-orders' materialiser job), so the request stays short however many orders are open.
--
-- The frozen target set of a CANCEL_OPEN_ORDER batch: every order of market_id still open
-- with id <= max_target_id. The market is SUSPENDED from the same commit on and placement is
-- refused while it is, so no order joins the set later; the bound keeps it exact even after a
-- resume.
--
-- Materialisation (resumable; the cursor is the last target id materialised):
--   materialised_at NULL      preparing: chunks remain. Each chunk is one transaction that
--                             locks this row, INSERTs ... SELECTs the next open orders after
--                             the cursor, moves the cursor, adds to created_count and writes
--                             the chunk's `market.cancel_tasks.created` messages to the outbox.
--   materialised_at set       created_count is final ("0 tasks created" is reported as such).
--
-- closed_at: set when the market is resumed (only once the batch is complete). At most one
-- batch of a type is open per market (uk_task_batches_open_per_market).
CREATE TABLE task_batches (
    id                 BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    type               VARCHAR(32)     NOT NULL,
    market_id          BIGINT UNSIGNED NOT NULL,
    -- What the batch is about, as the seed's queries name it (the market symbol).
    ref                VARCHAR(32)     NOT NULL,
    reason             VARCHAR(32)     NOT NULL,
    note               VARCHAR(255)    NULL,
    max_target_id      BIGINT UNSIGNED NOT NULL,
    materialise_cursor BIGINT UNSIGNED NOT NULL DEFAULT 0,
    created_count      BIGINT UNSIGNED NOT NULL DEFAULT 0,
    materialised_at    TIMESTAMP(6)    NULL,
    closed_at          TIMESTAMP(6)    NULL,
    open_market_id     BIGINT UNSIGNED GENERATED ALWAYS AS
        (CASE WHEN closed_at IS NULL THEN market_id END) STORED,
    created_at         TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    updated_at         TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    UNIQUE KEY uk_task_batches_open_per_market (type, open_market_id),
    -- The materialiser's poll for batches still preparing.
    KEY index_task_batches_preparing (materialised_at, id),
    KEY index_task_batches_by_ref (type, ref, created_at),
    CONSTRAINT fk_task_batches_market FOREIGN KEY (market_id) REFERENCES markets (id),
    CONSTRAINT ck_task_batches_type CHECK (type IN ('CANCEL_OPEN_ORDER')),
    CONSTRAINT ck_task_batches_cursor CHECK (materialise_cursor <= max_target_id),
    CONSTRAINT ck_task_batches_materialised
        CHECK (materialised_at IS NULL OR materialise_cursor = max_target_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
