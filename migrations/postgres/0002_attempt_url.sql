-- Schema version 2: the base URL that the latest attempt was (or is about to
-- be) sent to. Written before the first request byte leaves, and again before
-- a failover to another URL, so an inquiry can ask the URL that may hold the
-- transfer: a "never received" from any other URL proves nothing.
ALTER TABLE relayhub_journal ADD COLUMN url text;
