#!/usr/bin/env bash
# Runs a command with a throwaway PostgreSQL server, for the tests of the
# shared journal (tests/pg_*.rs):
#
#   scripts/with-postgres.sh cargo test --workspace
#
# Installs the server from Debian's packages when none is there, starts one in
# a temporary directory on a free loopback port (run as the `postgres` user
# when started as root: the server refuses to run as root), creates a database
# and a user, exports RELAYHUB_TEST_PG=postgres://..., runs the command, then
# stops the server and removes its directory, whatever the command did. Exits
# with the command's status.
set -euo pipefail

if [ "$#" -eq 0 ]; then
    echo "usage: $0 COMMAND [ARGS...]" >&2
    exit 2
fi

pg_bin() {
    # The newest installed major version.
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

BIN="$(pg_bin || true)"
if [ -z "$BIN" ] || [ ! -x "$BIN/initdb" ]; then
    echo "== installing PostgreSQL (Debian packages)" >&2
    if [ "$(id -u)" -ne 0 ]; then
        # Not root: run the command anyway; the PostgreSQL tests say they were
        # skipped (RELAYHUB_TEST_PG unset) and everything else runs.
        echo "no PostgreSQL server found and not root: running without it (install the postgresql package to include those tests)" >&2
        exec "$@"
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq postgresql >/dev/null
    BIN="$(pg_bin)"
fi

# A free port: ask the kernel for one, then hand it to the server. Another
# program could take it in between; the start fails loudly then.
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo $((20000 + RANDOM % 20000)))"

DIR="$(mktemp -d /tmp/relayhub-pg.XXXXXX)"
DATA="$DIR/data"
AS=()
if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home-dir "$DIR" --shell /usr/sbin/nologin postgres
    chown postgres "$DIR"
    AS=(runuser -u postgres --)
fi

stop() {
    local status=$?
    if [ -f "$DATA/postmaster.pid" ]; then
        "${AS[@]}" "$BIN/pg_ctl" -D "$DATA" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$DIR"
    exit "$status"
}
trap stop EXIT INT TERM

echo "== PostgreSQL $("$BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT ($DIR)" >&2
"${AS[@]}" "$BIN/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --no-locale >"$DIR/initdb.log" 2>&1 ||
    { cat "$DIR/initdb.log" >&2; exit 1; }
# fsync stays on: the tests are about a journal that must survive crashes, and
# the server is small. Up to 200 connections: every hub keeps a pool.
"${AS[@]}" "$BIN/pg_ctl" -D "$DATA" -l "$DIR/server.log" -w -t 60 \
    -o "-k $DIR -p $PORT -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null ||
    { cat "$DIR/server.log" >&2; exit 1; }

"${AS[@]}" "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -q \
    -c "CREATE ROLE relayhub LOGIN PASSWORD 'relayhub'" \
    -c "CREATE DATABASE relayhub OWNER relayhub" >/dev/null

export RELAYHUB_TEST_PG="postgres://relayhub:relayhub@127.0.0.1:$PORT/relayhub"
echo "== RELAYHUB_TEST_PG=postgres://relayhub:***@127.0.0.1:$PORT/relayhub" >&2

set +e
"$@"
status=$?
set -e
exit "$status"
