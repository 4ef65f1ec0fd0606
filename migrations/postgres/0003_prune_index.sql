-- Schema version 3 of the shared journal: pruning finds its rows through an
-- index on updated_ms instead of scanning the whole table.
--
-- Partial: only settled rows (`done`, `not_sent`) are ever pruned. Rows still
-- `sending` or `unknown` are kept past the retention until something settles
-- them, so they are left out of the index and a prune never walks over them.
--
-- Built inside the migration's transaction (CREATE INDEX CONCURRENTLY cannot
-- run in one): writes to the table wait while it builds, about a second per
-- million rows.

CREATE INDEX relayhub_journal_settled_updated ON relayhub_journal (updated_ms)
    WHERE state IN ('done', 'not_sent');
