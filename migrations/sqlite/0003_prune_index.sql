-- Schema version 3: pruning finds its rows through an index on updated_ms
-- instead of scanning the whole table inside the writer's transaction.
--
-- Partial: only settled rows (`done`, `not_sent`) are ever pruned. Rows still
-- `sending` or `unknown` are kept past the retention until something settles
-- them, so they are left out of the index and a prune never walks over them.
-- The prune's WHERE repeats this condition word for word, which is what lets
-- SQLite use a partial index.

CREATE INDEX journal_settled_updated ON journal (updated_ms)
    WHERE state IN ('done', 'not_sent');
