-- Schema version 4 of the shared journal: the liveness of each hub process.
--
-- Every hub renews its row every `liveness_renew_ms` on a connection of its
-- own, stamping `renewed_ms` with the database's clock. A hub whose row was
-- last renewed more than its own `dead_after_ms` ago (database clock again) is
-- dead: other hubs take its `sending` rows over (they become `unknown`) and
-- settle them by inquiry. The hub itself stops posting (fences) after
-- `fence_ms` without a renewal, measured on its own monotonic clock from the
-- start of its last successful renewal; `fence_ms < dead_after_ms`, so it has
-- stopped before anyone may take over. See docs/scale-out.md.
--
-- One row per hub process (hub ids carry a random suffix), so a restarted hub
-- is never taken for the one before it. Rows of hubs dead for a day are
-- deleted by the next hub that starts.

CREATE TABLE relayhub_hubs (
    hub_id        text   NOT NULL PRIMARY KEY,
    started_ms    bigint NOT NULL,
    renewed_ms    bigint NOT NULL,
    fence_ms      bigint NOT NULL CHECK (fence_ms > 0),
    dead_after_ms bigint NOT NULL CHECK (dead_after_ms > fence_ms)
);
