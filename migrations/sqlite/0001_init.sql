-- Schema version 1: one row per GUID, and its history.
-- STRICT so that a value of the wrong type is refused instead of coerced.

CREATE TABLE journal (
    guid            TEXT    NOT NULL PRIMARY KEY,
    tx_code         TEXT    NOT NULL,
    fingerprint     TEXT    NOT NULL,
    state           TEXT    NOT NULL
                    CHECK (state IN ('sending', 'done', 'unknown', 'not_sent')),
    code            TEXT,
    answer          BLOB,
    attempts        INTEGER NOT NULL CHECK (attempts >= 0),
    last_attempt_ms INTEGER NOT NULL,
    answered_ms     INTEGER,
    last_error      TEXT,
    created_ms      INTEGER NOT NULL,
    updated_ms      INTEGER NOT NULL
) STRICT;

-- `list` (rows in a state, oldest first) and `recover` (rows left `sending`).
CREATE INDEX journal_state_created ON journal (state, created_ms);

-- `id` keeps a GUID's events in the order they were written, even within one
-- millisecond.
CREATE TABLE journal_events (
    id    INTEGER NOT NULL PRIMARY KEY,
    guid  TEXT    NOT NULL,
    at_ms INTEGER NOT NULL,
    state TEXT    NOT NULL
          CHECK (state IN ('sending', 'done', 'unknown', 'not_sent')),
    code  TEXT,
    note  TEXT    NOT NULL
) STRICT;

CREATE INDEX journal_events_guid ON journal_events (guid);
