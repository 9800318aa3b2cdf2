-- The purchases still in REQUEST inside a member's checkpoint (member_can_checkpoints). A
-- purchase abandoned at the gateway stays REQUEST for ever; when such a charge ended a
-- checkpoint's prefix, one abandoned checkout held its member's checkpoint there, and the
-- auditor read every charge of that member after it, as before checkpoints. Now the prefix
-- runs over it and lists it here: its cans are not in the checkpoint's sums, the windowed
-- check adds it once it is COMPLETE, and the checkpointer folds it into the sums (deleting
-- this row in the same transaction) when it sees it paid.
--
-- Written only by the checkpointer; read by the auditor. No foreign keys, for the reason the
-- checkpoints have none.
CREATE TABLE member_can_checkpoint_unpaid (
    member_id BIGINT UNSIGNED NOT NULL,
    charge_id BIGINT UNSIGNED NOT NULL,
    PRIMARY KEY (member_id, charge_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
