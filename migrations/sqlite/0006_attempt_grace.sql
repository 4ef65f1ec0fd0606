-- Schema version 6: the wire grace (ms) of the hub that made the latest
-- attempt, stamped by its claim, with the attempt it was stamped for. A
-- "never received" proves nothing about the attempt before that much time
-- has passed, whoever asks: a hub restarted with a shorter late-answer
-- window, or a reconcile with another config, must not settle an attempt
-- made under a longer one while its request may still be on its way. The
-- stamp counts only while `grace_attempt` is the row's `attempts`: a resend
-- claimed by a build before this version moves `attempts` on and leaves an
-- earlier attempt's grace, which says nothing about the new one. NULL for
-- rows claimed before this version.
ALTER TABLE journal ADD COLUMN grace_ms INTEGER CHECK (grace_ms IS NULL OR grace_ms >= 0);
ALTER TABLE journal ADD COLUMN grace_attempt INTEGER;
