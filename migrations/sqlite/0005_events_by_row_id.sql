-- Schema version 5: a row's events point at the row's integer id instead of
-- repeating its GUID.
--
-- GUIDs come in no order, so an index on them takes each new entry on a
-- random leaf. With the events' index on the GUID, every transfer dirtied
-- two such leaves (the journal's GUID index and the events'), each one a
-- page written to the WAL at each commit that touched it, then copied to a
-- scattered offset of the file and fsynced at the next checkpoint. The
-- journal keeps its GUID index (a claim looks the GUID up); the events now
-- carry the row's `id`, which grows with each claim, so their index takes
-- new entries on its last leaves, next to the ones before.
--
-- `id` is declared (INTEGER PRIMARY KEY): a bare rowid may be renumbered by
-- VACUUM, which would cut the events from their row. It takes the rowid
-- each row had, so every order by rowid stays as it was. SQLite cannot add
-- a primary key to a table, so both tables are rebuilt, ids and rows kept.
-- Events are kept by the GUID they were written with; an event with no row
-- (none is ever written: a row and its events are written and pruned in one
-- transaction) has no id to point at and is not carried over.

CREATE TABLE journal_v5 (
    id              INTEGER NOT NULL PRIMARY KEY,
    guid            TEXT    NOT NULL UNIQUE,
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

INSERT INTO journal_v5 (id, guid, tx_code, fingerprint, state, code, answer, attempts,
                        last_attempt_ms, answered_ms, last_error, created_ms,
                        updated_ms, url)
    SELECT rowid, guid, tx_code, fingerprint, state, code, answer, attempts,
           last_attempt_ms, answered_ms, last_error, created_ms, updated_ms, url
    FROM journal;

CREATE TABLE journal_events_v5 (
    id         INTEGER NOT NULL PRIMARY KEY,
    journal_id INTEGER NOT NULL,
    at_ms      INTEGER NOT NULL,
    state      TEXT    NOT NULL
               CHECK (state = 'sending' OR state = 'done'
                      OR state = 'unknown' OR state = 'not_sent'),
    code       TEXT,
    note       TEXT    NOT NULL
) STRICT;

INSERT INTO journal_events_v5 (id, journal_id, at_ms, state, code, note)
    SELECT e.id, j.id, e.at_ms, e.state, e.code, e.note
    FROM journal_events AS e JOIN journal_v5 AS j ON j.guid = e.guid;

DROP TABLE journal_events;
DROP TABLE journal;
ALTER TABLE journal_v5 RENAME TO journal;
ALTER TABLE journal_events_v5 RENAME TO journal_events;
CREATE INDEX journal_state_created ON journal (state, created_ms);
CREATE INDEX journal_settled_updated ON journal (updated_ms)
    WHERE state IN ('done', 'not_sent');
CREATE INDEX journal_events_journal ON journal_events (journal_id);
