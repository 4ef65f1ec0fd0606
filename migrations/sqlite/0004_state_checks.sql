-- Schema version 4: the same tables, their `state` checks written as
-- comparisons instead of `state IN (four values)`.
--
-- SQLite evaluates a constant IN list of more than two values by building a
-- temporary table each time: four per transfer (the claim and the outcome
-- each check a journal row and an event), about a sixth of the hub's
-- instructions per telegram with this journal. A CHECK cannot be altered in
-- SQLite, so both tables are rebuilt, rows, ids and indexes kept.

CREATE TABLE journal_v4 (
    guid            TEXT    NOT NULL PRIMARY KEY,
    tx_code         TEXT    NOT NULL,
    fingerprint     TEXT    NOT NULL,
    state           TEXT    NOT NULL
                    CHECK (state = 'sending' OR state = 'done'
                           OR state = 'unknown' OR state = 'not_sent'),
    code            TEXT,
    answer          BLOB,
    attempts        INTEGER NOT NULL CHECK (attempts >= 0),
    last_attempt_ms INTEGER NOT NULL,
    answered_ms     INTEGER,
    last_error      TEXT,
    created_ms      INTEGER NOT NULL,
    updated_ms      INTEGER NOT NULL,
    url             TEXT
) STRICT;

INSERT INTO journal_v4 (guid, tx_code, fingerprint, state, code, answer, attempts,
                        last_attempt_ms, answered_ms, last_error, created_ms,
                        updated_ms, url)
    SELECT guid, tx_code, fingerprint, state, code, answer, attempts,
           last_attempt_ms, answered_ms, last_error, created_ms, updated_ms, url
    FROM journal;
DROP TABLE journal;
ALTER TABLE journal_v4 RENAME TO journal;
CREATE INDEX journal_state_created ON journal (state, created_ms);
CREATE INDEX journal_settled_updated ON journal (updated_ms)
    WHERE state IN ('done', 'not_sent');

CREATE TABLE journal_events_v4 (
    id    INTEGER NOT NULL PRIMARY KEY,
    guid  TEXT    NOT NULL,
    at_ms INTEGER NOT NULL,
    state TEXT    NOT NULL
          CHECK (state = 'sending' OR state = 'done'
                 OR state = 'unknown' OR state = 'not_sent'),
    code  TEXT,
    note  TEXT    NOT NULL
) STRICT;

INSERT INTO journal_events_v4 (id, guid, at_ms, state, code, note)
    SELECT id, guid, at_ms, state, code, note FROM journal_events;
DROP TABLE journal_events;
ALTER TABLE journal_events_v4 RENAME TO journal_events;
CREATE INDEX journal_events_guid ON journal_events (guid);
