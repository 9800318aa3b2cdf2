-- paybus trace reads a money movement's notifications by the row they are about; the ops log
-- by what an action was on.
ALTER TABLE partner_notifications
    ADD KEY index_partner_notifications_by_reference (reference_type, reference_id);
ALTER TABLE ops_log ADD KEY index_ops_log_by_subject (subject, seq);
