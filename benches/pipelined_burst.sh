#!/usr/bin/env bash
# Thousands of budgets ending together (docs/protocol.md, section 7): corebank
# and a hub (budget 3000 ms, max_in_flight_per_connection 8), then
# CONNECTIONS (150) channels each pipelining DEPTH (40) transfers behind a
# POST the fixture holds past the budget. Prints, per run: the codes, answers
# out of order or lost, GUIDs answered "not sent" that were posted (must be
# 0), the most POSTs of one GUID (must be 1 at most), the hub's latest
# summary-line `ms`, its answers written past the
# budget (relayhub_answers_past_budget_total) and the client's latest answer
# counted from its write. Each argument is a relayhub binary, run in turn
# with each journal in JOURNALS ("sqlite memory"; "pg" too under
# scripts/with-postgres.sh) and ROUNDS (1) times, so builds alternate:
#   benches/pipelined_burst.sh target/release/relayhub /tmp/relayhub-before
#   JOURNALS=pg scripts/with-postgres.sh benches/pipelined_burst.sh NEW OLD
# Linux only. docs/performance.md, "Thousands of budgets ending together".
set -euo pipefail

cd "$(dirname "$0")/.."
CORE_BIN=${CORE_BIN:-target/release/corebank}
CLIENT=${CLIENT:-target/release/examples/pipelined_burst}
CONNECTIONS=${CONNECTIONS:-150}
DEPTH=${DEPTH:-40}
ROUNDS=${ROUNDS:-1}
JOURNALS=${JOURNALS:-sqlite memory}
[ "$#" -gt 0 ] || set -- target/release/relayhub
WORK=$(mktemp -d)
PIDS=()
# A process that does not stop on SIGTERM within 10 s is killed.
cleanup() {
    for p in "${PIDS[@]}"; do
        kill "$p" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    PIDS=()
}
trap 'cleanup; rm -rf "$WORK"' EXIT

# wait_ready, num
. benches/common.sh

# fresh_pg_schema: a journal URL on an empty schema of RELAYHUB_TEST_PG's
# database (JOURNALS=pg; run under scripts/with-postgres.sh, which sets it).
fresh_pg_schema() {
    local base=${RELAYHUB_TEST_PG:?"JOURNALS=pg runs under scripts/with-postgres.sh"}
    local schema="burst_$(date +%s%N)" sep='?'
    psql -q "$base" -c "CREATE SCHEMA $schema" >&2
    [ "${base#*\?}" != "$base" ] && sep='&'
    printf '%s%soptions=-c%%20search_path%%3D%s&hub_id=burst' "$base" "$sep" "$schema"
}

cat >"$WORK/hub.toml" <<'EOF'
[server]
budget_ms = 3000
max_in_flight_per_connection = 8
EOF

printf '%-5s %-7s %-36s %-34s %5s %5s %6s %6s %7s %6s %9s\n' round journal hub codes order lost posted "posts" "max ms" "past" "client ms"
for round in $(seq 1 "$ROUNDS"); do
    for bin in "$@"; do
        for journal in $JOURNALS; do
            run="$WORK/run"; rm -rf "$run"; mkdir -p "$run"
            RUST_LOG=info "$CORE_BIN" --listen 127.0.0.1:0 >"$run/core.out" 2>"$run/core.log" &
            PIDS+=("$!")
            core=$(wait_ready "$run/core.out")
            case "$journal" in
                sqlite) spec="$run/journal.sqlite" ;;
                pg) spec=$(fresh_pg_schema) ;;
                *) spec=memory ;;
            esac
            RUST_LOG=info "$bin" serve --config "$WORK/hub.toml" --listen 127.0.0.1:0 \
                --admin-listen 127.0.0.1:0 --core-url "http://$core" --journal "$spec" \
                >"$run/hub.out" 2>"$run/hub.log" &
            PIDS+=("$!")
            hub=$(wait_ready "$run/hub.out")
            admin=$(sed -n 's/^admin endpoints on \([^ ]*\).*/\1/p' "$run/hub.out" | head -n1)
            "$CLIENT" --hub "$hub" --core "http://$core" --connections "$CONNECTIONS" \
                --depth "$DEPTH" >"$run/report.json"
            past=$(curl -s --max-time 10 "http://$admin/metrics" \
                | sed -n 's/^relayhub_answers_past_budget_total \(.*\)$/\1/p' || true)
            max_ms=$({ grep -o ' ms=[0-9]*$' "$run/hub.log" || true; } | cut -d= -f2 | sort -n | tail -n1)
            codes=$(tr -d '\n ' <"$run/report.json" | sed -n 's/.*"codes":{\([^}]*\)}.*/\1/p' | tr -d '"')
            printf '%-5s %-7s %-36s %-34s %5s %5s %6s %6s %7s %6s %9s\n' "$round" "$journal" "$bin" "$codes" \
                "$(num "$run/report.json" out_of_order)" "$(num "$run/report.json" lost)" \
                "$(num "$run/report.json" not_sent_but_posted)" \
                "$(num "$run/report.json" max_posts_per_guid)" "${max_ms:-?}" "${past:-?}" \
                "$(num "$run/report.json" latest_answer_ms_from_write)"
            cleanup
        done
    done
done
