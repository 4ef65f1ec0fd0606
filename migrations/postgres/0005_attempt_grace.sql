-- Schema version 5: the wire grace (ms) of the hub that made the latest
-- attempt, stamped by its claim, with the attempt it was stamped for. A
-- "never received" proves nothing about the attempt before that much time
-- has passed, whichever hub asks: a hub with a shorter late-answer window (a
-- rolling config change, a restart, or `journal reconcile` with another
-- config) must not settle an attempt made under a longer one while its
-- request may still be on its way. The stamp counts only while
-- `grace_attempt` is the row's `attempts`: a hub of a build before this
-- version that claims a resend moves `attempts` on and leaves an earlier
-- attempt's grace, which says nothing about the new one. NULL for rows
-- claimed before this version.
--
-- Columns with no default change only the catalogue; the check is added
-- NOT VALID, so no existing row is scanned while the table is locked (rows
-- before this version hold NULL, which passes it anyway).
ALTER TABLE relayhub_journal ADD COLUMN grace_ms bigint;
ALTER TABLE relayhub_journal ADD COLUMN grace_attempt integer;
ALTER TABLE relayhub_journal ADD CONSTRAINT relayhub_journal_grace_ms_check
    CHECK (grace_ms IS NULL OR grace_ms >= 0) NOT VALID;
