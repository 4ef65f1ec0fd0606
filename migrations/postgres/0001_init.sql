-- Schema version 1 of the shared (PostgreSQL) journal: one row per GUID, and
-- its history. Same columns as the embedded store, plus who holds the row's
-- lease. Names carry a `relayhub_` prefix because the database may be shared
-- with other applications.

CREATE TABLE relayhub_journal (
    guid            text    NOT NULL PRIMARY KEY,
    tx_code         text    NOT NULL,
    fingerprint     text    NOT NULL,
    state           text    NOT NULL
                    CHECK (state IN ('sending', 'done', 'unknown', 'not_sent')),
    code            text,
    answer          bytea,
    attempts        integer NOT NULL CHECK (attempts >= 0),
    last_attempt_ms bigint  NOT NULL,
    answered_ms     bigint,
    last_error      text,
    created_ms      bigint  NOT NULL,
    updated_ms      bigint  NOT NULL,
    -- The hub that made the last attempt.
    owner           text,
    -- Until when (database clock, ms since the epoch) that hub's call may
    -- still be running: its budget, its late-answer window and a margin.
    -- While it is in the future, no other hub treats the row as abandoned.
    lease_until_ms  bigint
);

-- `list` (rows in a state, oldest first) and `recover` (rows left `sending`).
CREATE INDEX relayhub_journal_state_created ON relayhub_journal (state, created_ms);

-- `id` keeps a GUID's events in the order they were written, even within one
-- millisecond.
CREATE TABLE relayhub_journal_events (
    id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    guid  text   NOT NULL,
    at_ms bigint NOT NULL,
    state text   NOT NULL
          CHECK (state IN ('sending', 'done', 'unknown', 'not_sent')),
    code  text,
    note  text   NOT NULL
);

CREATE INDEX relayhub_journal_events_guid ON relayhub_journal_events (guid, id);
