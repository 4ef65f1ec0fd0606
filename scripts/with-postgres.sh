#!/usr/bin/env bash
# Runs a command with a throwaway PostgreSQL server, for the tests of the
# shared journal (tests/pg_*.rs):
#
#   scripts/with-postgres.sh cargo test --workspace --locked
#
# - Uses the newest server under /usr/lib/postgresql/*/bin. When there is none
#   and it runs as root, installs Debian's `postgresql` package (apt-get); the
#   package stays installed afterwards. It creates no user and no system
#   service: the server runs from a temporary directory, as the user `nobody`
#   when started as root (PostgreSQL refuses to run as root), else as the
#   caller.
# - Starts the server on a free loopback port, creates a database and a user
#   inside it, exports RELAYHUB_TEST_PG=postgres://..., runs the command, then
#   stops the server and removes the temporary directory (data, socket, logs),
#   whatever the command did. Exits with the command's status.
# - No server and no way to get one: with CI=true that is an error (exit 1,
#   the reason on stderr), so CI cannot pass without the PostgreSQL tests;
#   otherwise the command runs without it and those tests report themselves
#   skipped.
set -euo pipefail

if [ "$#" -eq 0 ]; then
    echo "usage: $0 COMMAND [ARGS...]" >&2
    exit 2
fi

in_ci() { [ "${CI:-}" = true ]; }

# No PostgreSQL: fail under CI, else run the command without it.
without_postgres() {
    local reason=$1
    shift
    if in_ci; then
        echo "with-postgres: $reason; CI=true requires the PostgreSQL tests to run" >&2
        exit 1
    fi
    echo "with-postgres: $reason: running without it (the PostgreSQL tests report themselves skipped)" >&2
    exec "$@"
}

pg_bin() {
    # The newest installed major version.
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

BIN="$(pg_bin || true)"
if [ -z "$BIN" ] || [ ! -x "$BIN/initdb" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        without_postgres "no PostgreSQL server under /usr/lib/postgresql and not root (cannot install the postgresql package)" "$@"
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        without_postgres "no PostgreSQL server under /usr/lib/postgresql and no apt-get to install one" "$@"
    fi
    echo "== installing PostgreSQL (Debian package postgresql)" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; }; then
        without_postgres "apt-get could not install the postgresql package" "$@"
    fi
    BIN="$(pg_bin || true)"
    if [ -z "$BIN" ] || [ ! -x "$BIN/initdb" ]; then
        without_postgres "the postgresql package installed no server under /usr/lib/postgresql" "$@"
    fi
fi

# A free port: ask the kernel for one, then hand it to the server. Another
# program could take it in between; the start fails loudly then.
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo $((20000 + RANDOM % 20000)))"

DIR="$(mktemp -d /tmp/relayhub-pg.XXXXXX)"
DATA="$DIR/data"
AS=()
if [ "$(id -u)" -eq 0 ]; then
    # An existing unprivileged account: nothing to create, nothing to remove.
    chown nobody "$DIR"
    AS=(setpriv --reuid="$(id -u nobody)" --regid="$(id -g nobody)" --clear-groups --)
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

# Fail with the reason, under CI as elsewhere: a server that was found but
# does not start is a broken machine, not a missing package.
fail() {
    echo "with-postgres: $1" >&2
    [ -f "$2" ] && cat "$2" >&2
    exit 1
}

echo "== PostgreSQL $("$BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT ($DIR)" >&2
"${AS[@]}" "$BIN/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --no-locale >"$DIR/initdb.log" 2>&1 ||
    fail "initdb failed" "$DIR/initdb.log"
# fsync stays on: the tests are about a journal that must survive crashes, and
# the server is small. Up to 200 connections: every hub keeps a pool.
"${AS[@]}" "$BIN/pg_ctl" -D "$DATA" -l "$DIR/server.log" -w -t 60 \
    -o "-k $DIR -p $PORT -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null ||
    fail "the server did not start" "$DIR/server.log"

"$BIN/psql" -X -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -q \
    -c "CREATE ROLE relayhub LOGIN PASSWORD 'relayhub'" \
    -c "CREATE DATABASE relayhub OWNER relayhub" >/dev/null ||
    fail "could not create the test database" "$DIR/server.log"

export RELAYHUB_TEST_PG="postgres://relayhub:relayhub@127.0.0.1:$PORT/relayhub"
echo "== RELAYHUB_TEST_PG=postgres://relayhub:***@127.0.0.1:$PORT/relayhub" >&2

set +e
"$@"
status=$?
set -e
exit "$status"
