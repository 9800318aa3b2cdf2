-- The continuous auditor's checkpointed prefix of each member's charges. `member_can_balances`
-- sums a member's COMPLETE charges against its balance; over every touched member's whole
-- history that grew with the history (the soak of 2026-12-05, evening: its passes 1.3 s ->
-- 2.3 s in 30 minutes, 250 members, docs/benchmarks.md). A checkpoint holds the sums of the
-- member's charges with id <= through_charge_id, every one of them COMPLETE and old enough
-- that no charge of the member below it can still commit (shared/bonuses/src/checkpoint.rs
-- says why). A COMPLETE charge never changes again, so the sums never do: the windowed check
-- adds the charges above the checkpoint to it. The full audit does not trust checkpoints; it
-- verifies them.
--
-- Written only by the checkpointer (a sweeper job), each move conditional on the through it
-- read; read by the auditor. No foreign key: its shared lock on the member row would queue
-- the checkpointer behind every completion and grant holding that row.
CREATE TABLE member_can_checkpoints (
    member_id         BIGINT UNSIGNED NOT NULL,
    through_charge_id BIGINT UNSIGNED NOT NULL,
    pg_cans           BIGINT          NOT NULL,
    aos_cans          BIGINT          NOT NULL,
    ios_cans          BIGINT          NOT NULL,
    moved_at         TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
                                      ON UPDATE CURRENT_TIMESTAMP(6),
    PRIMARY KEY (member_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
