-- A contract-breaking migration, planted by the upgrade test: the previous release's
-- confirm-withdrawal sets withdrawals.confirmed_at, so dropping it in the release that still
-- runs beside it (and is rolled back to) breaks every withdrawal confirmed after it. The
-- expand-then-contract rule (docs/architecture.md) drops a column only in a release after
-- every released reader is gone; the upgrade run must fail on this one.
ALTER TABLE withdrawals DROP CONSTRAINT ck_withdrawals_confirmed;
ALTER TABLE withdrawals DROP COLUMN confirmed_at;
