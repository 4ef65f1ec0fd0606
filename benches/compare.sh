#!/usr/bin/env bash
# Side-by-side speed and memory of the hub against the core it fronts.
#
#   cargo build --release --workspace --bins --examples
#   benches/compare.sh [--slow-core] [--connections-scale] [--tls] [--all]
#
# Default run: at each of CONNECTIONS (8 and 32), the same closed-loop load
# straight to the fixture (`bench --direct`), through the yardstick (a bare
# thread-per-connection relay with ureq inline, benches/yardstick.rs) and
# through the hub with the memory and the SQLite journal, each with a corebank
# of its own, in one table: throughput and its ratio to the yardstick's, the
# relay's and the fixture's CPU per telegram (from /proc/PID/stat around each
# run) and their ratio, p50 and p99. Then the core alone and the first hub at
# one fixed rate (FIXED_RATE_PER_S, by default half the lower of the core
# alone's and the first hub's round-1 throughput at the first CONNECTIONS;
# run at twice those connections): the latency added,
# and the relay's and the core's CPU per request at that rate (steadier than
# the closed loop's on a small machine; docs/performance.md, "The core's
# socket").
#   --slow-core          the fixture answers after 200 ms; 1,000 concurrent
#                        transfers through each of SLOW_RELAYS (the yardstick,
#                        then the hub with the memory journal), each with a
#                        corebank of its own: throughput against the
#                        Little's-law bound, RSS, threads and CPU. The
#                        yardstick's share is what this machine allows a
#                        relay with a thread per call.
#   --connections-scale  10,000 idle channel connections held open, a load
#                        through a few more: hub RSS per connection.
#   --tls                the cost of TLS: at each of CONNECTIONS, the hub with
#                        plain channel + plain core, TLS channel only, HTTPS
#                        core only, and TLS on both sides, each with a corebank
#                        of its own, in the same table (ratio to the plain
#                        hub); then FRESH telegrams each on a new connection,
#                        plain and TLS, to one hub: the handshake's price.
#                        Certificates (a throwaway CA, one leaf for localhost
#                        and 127.0.0.1) are made in the work folder with
#                        openssl; nothing is kept.
#   --all                all four.
# Settings (environment): CONNECTIONS ("8 32"), DURATION (10s), WARMUP (3000),
# ROUNDS (1: the whole matrix again, for run-to-run spread), RELAYS ("yardstick
# hub:memory hub:sqlite"; an entry is `yardstick[+VAR=VALUE...]` or
# `hub:JOURNAL[:name][@BIN][+VAR=VALUE...]`, see start_relay), FIXED_RATE (1; 0
# skips the fixed-rate part), FIXED_RATE_PER_S, SLOW_RELAYS ("yardstick
# hub:memory", entries as in RELAYS), SLOW_CONNECTIONS (1000),
# SLOW_DURATION (15s), IDLE (10000), LOG (info: the RUST_LOG of the servers;
# their logs go to files in the work folder), TLS_KEY (ec: P-256 keys; rsa:
# 2048-bit RSA), FRESH (1000 telegrams per fresh-connection run, each a
# `relayhub send` process; 0 skips them).
# Example, a host-name core URL against an IP literal and the binary of an
# earlier commit, in one run:
#   RELAYS="hub:memory hub:memory:name hub:memory@/tmp/relayhub-before" benches/compare.sh
# Linux only (/proc). Every process this script starts is stopped by its PID.
set -euo pipefail

cd "$(dirname "$0")/.."
HUB_BIN=${HUB_BIN:-target/release/relayhub}
CORE_BIN=${CORE_BIN:-target/release/corebank}
CONNECTIONS=${CONNECTIONS:-8 32}
DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-1}
RELAYS=${RELAYS:-yardstick hub:memory hub:sqlite}
FIXED_RATE=${FIXED_RATE:-1}
YARD_BIN=${YARD_BIN:-target/release/examples/yardstick}
WARMUP=${WARMUP:-3000}
SLOW_RELAYS=${SLOW_RELAYS:-yardstick hub:memory}
SLOW_CONNECTIONS=${SLOW_CONNECTIONS:-1000}
SLOW_DURATION=${SLOW_DURATION:-15s}
IDLE=${IDLE:-10000}
LOG=${LOG:-info}
TLS_KEY=${TLS_KEY:-ec}
FRESH=${FRESH:-1000}

modes=()
for arg in "$@"; do
    case "$arg" in
        --slow-core) modes+=(slow) ;;
        --connections-scale) modes+=(scale) ;;
        --tls) modes+=(tls) ;;
        --all) modes=(compare slow scale tls) ;;
        -h|--help) sed -n '2,52p' "$0"; exit 0 ;;
        *) echo "compare.sh: unknown argument $arg" >&2; exit 64 ;;
    esac
done
[ ${#modes[@]} -eq 0 ] && modes=(compare)

# The relays the chosen modes run: the yardstick's binary only if one does.
needed=
for m in "${modes[@]}"; do
    case "$m" in compare) needed+=" $RELAYS" ;; slow) needed+=" $SLOW_RELAYS" ;; esac
done
for b in "$HUB_BIN" "$CORE_BIN" $(case " $needed " in *" yardstick "*) echo "$YARD_BIN" ;; esac); do
    [ -x "$b" ] || { echo "compare.sh: $b not found; run cargo build --release --workspace --bins --examples first" >&2; exit 1; }
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/relayhub-bench.XXXXXX")
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
echo "work folder (logs, JSON reports): $WORK" >&2

TCK=$(getconf CLK_TCK)

# wait_ready, num
. benches/common.sh

# start_core NAME [ARGS...] -> sets CORE_PID, CORE_ADDR
start_core() {
    RUST_LOG=$LOG "$CORE_BIN" --listen 127.0.0.1:0 "${@:2}" >"$WORK/$1-core.out" 2>"$WORK/$1-core.log" &
    CORE_PID=$!; PIDS+=("$CORE_PID")
    CORE_ADDR=$(wait_ready "$WORK/$1-core.out")
}

# start_hub NAME -> sets HUB_PID, HUB_ADDR
start_hub() {
    RUST_LOG=$LOG "$HUB_BIN" serve --listen 127.0.0.1:0 --core-url "http://$CORE_ADDR" \
        --journal memory >"$WORK/$1-hub.out" 2>"$WORK/$1-hub.log" &
    HUB_PID=$!; PIDS+=("$HUB_PID")
    HUB_ADDR=$(wait_ready "$WORK/$1-hub.out")
}

stop_all() {
    cleanup
    PIDS=()
}

# cpu PID: utime+stime in clock ticks (fields 14 and 15; the command name has no spaces).
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# status PID KEY: a number from /proc/PID/status (kB for Vm*).
status() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }
calc() { awk "BEGIN { printf \"%.${2:-2}f\", $1 }"; }

# bench NAME ARGS...: runs `relayhub bench --json ARGS` into $WORK/NAME.json and
# fails loudly when an answer was wrong or missing.
bench() {
    local name=$1; shift
    local rc=0
    "$HUB_BIN" bench --json "$@" >"$WORK/$name.json" 2>"$WORK/$name.err" || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "compare.sh: bench $name exited $rc (wrong or missing answers?); see $WORK/$name.json" >&2
        grep -A3 '"wrong_examples"\|"error_examples"' "$WORK/$name.json" >&2 || cat "$WORK/$name.err" >&2
    fi
    return 0
}

# measured NAME ARGS...: a bench run with the CPU ticks of the hub and core
# around it; sets HUB_TICKS, CORE_TICKS.
measured() {
    local h0 c0
    h0=$( [ -n "${HUB_PID:-}" ] && cpu "$HUB_PID" || echo 0 )
    c0=$(cpu "$CORE_PID")
    bench "$@"
    HUB_TICKS=$(( $( [ -n "${HUB_PID:-}" ] && cpu "$HUB_PID" || echo 0 ) - h0 ))
    CORE_TICKS=$(( $(cpu "$CORE_PID") - c0 ))
}

# per1000 TICKS FILE: CPU seconds per 1,000 answered requests of a report.
per1000() {
    local n; n=$(num "$2" sent)
    calc "$1 / $TCK / ($n > 0 ? $n : 1) * 1000" 3
}

# sample PID FILE: until stopped, the peak Threads and VmRSS of PID every 100 ms.
sample() {
    local pid=$1 out=$2 t r max_t=0 max_r=0
    while kill -0 "$pid" 2>/dev/null; do
        t=$(status "$pid" Threads 2>/dev/null || echo 0); r=$(status "$pid" VmRSS 2>/dev/null || echo 0)
        [ "${t:-0}" -gt "$max_t" ] && max_t=$t
        [ "${r:-0}" -gt "$max_r" ] && max_r=$r
        # Whole or not at all: the reader may stop this loop at any point.
        echo "$max_t $max_r" >"$out.part" && mv "$out.part" "$out"
        sleep 0.1
    done
}

# relay_label ENTRY: a short name for a relay entry (a binary's base name).
relay_label() {
    local e=$1 bin env
    env=${e#*+}; [ "$env" = "$e" ] && env= || e=${e%%+*}
    bin=${e#*@}; [ "$bin" = "$e" ] && bin= || e=${e%%@*}
    printf '%s%s%s' "$e" "${bin:+@$(basename "$bin")}" "${env:++$env}"
}

# start_relay ENTRY NAME -> sets HUB_PID, HUB_ADDR. ENTRY is
# `yardstick[+VAR=VALUE...]` or
# `hub:JOURNAL[:name][@BIN][+VAR=VALUE...]`: JOURNAL is memory or sqlite (a
# fresh file), `name` gives the core URL as http://localhost:PORT, BIN another
# relayhub binary (a candidate, or the one before a change), VAR=VALUE an
# environment variable of the relay (several joined by `+`; `yardstick+POOL=8`
# is the yardstick with 8 threads sharing its connections).
start_relay() {
    local e=$1 name=$2 bin=$HUB_BIN env=() journal host=127.0.0.1
    if [ "${e#*+}" != "$e" ]; then IFS=+ read -r -a env <<<"${e#*+}"; e=${e%%+*}; fi
    if [ "$e" = yardstick ]; then
        env "${env[@]}" "$YARD_BIN" --listen 127.0.0.1:0 --core-url "http://$CORE_ADDR" \
            >"$WORK/$name-relay.out" 2>"$WORK/$name-relay.log" &
        HUB_PID=$!; PIDS+=("$HUB_PID")
        HUB_ADDR=$(wait_ready "$WORK/$name-relay.out")
        return
    fi
    if [ "${e#*@}" != "$e" ]; then bin=${e#*@}; e=${e%%@*}; fi
    IFS=: read -r _ journal host_kind <<<"$e"
    [ "${host_kind:-}" = name ] && host=localhost
    case "$journal" in
        memory) ;;
        sqlite) journal="$WORK/$name.sqlite" ;;
        *) echo "compare.sh: unknown journal in $1" >&2; return 1 ;;
    esac
    env RUST_LOG="$LOG" "${env[@]}" "$bin" serve --listen 127.0.0.1:0 \
        --core-url "http://$host:${CORE_ADDR##*:}" --journal "$journal" \
        >"$WORK/$name-relay.out" 2>"$WORK/$name-relay.log" &
    HUB_PID=$!; PIDS+=("$HUB_PID")
    HUB_ADDR=$(wait_ready "$WORK/$name-relay.out")
}

# One closed-loop run of ENTRY (or `direct`) at C connections, with a core of
# its own; appends a row to $WORK/rows.
measure_relay() {
    local entry=$1 c=$2 round=$3 name
    name="r$round-c$c-$(relay_label "$entry" | tr -c 'A-Za-z0-9_.-' _)"
    start_core "$name"
    local to=()
    if [ "$entry" = direct ]; then
        HUB_PID=; to=(--direct "http://$CORE_ADDR")
    else
        start_relay "$entry" "$name"; to=(--to "$HUB_ADDR")
    fi
    bench "$name-warm" "${to[@]}" -c "$c" -n "$WARMUP"
    measured "$name" "${to[@]}" -c "$c" -d "$DURATION"
    local f="$WORK/$name.json" n
    n=$(num "$f" sent)
    [ "${n:-0}" -gt 0 ] || n=1
    echo "$round $c $(relay_label "$entry") $(num "$f" throughput) $HUB_TICKS $CORE_TICKS $n" \
        "$(num "$f" p50_us) $(num "$f" p99_us) $(num "$f" wrong) $(num "$f" errors)" >>"$WORK/rows"
    stop_all
}

# The fixed-rate part: straight to the core and through the first hub entry,
# both at RATE.
fixed_rate() {
    local entry=$1 c=$2 rate=$3
    local rc=(-c "$(( c * 2 ))" --rate "$rate" -d "$DURATION")
    start_core rate-direct; HUB_PID=
    measured rate-direct --direct "http://$CORE_ADDR" "${rc[@]}"
    local core_alone=$CORE_TICKS
    stop_all
    start_core rate-hub; start_relay "$entry" rate-hub
    bench rate-hub-warm --to "$HUB_ADDR" -c "$c" -n "$WARMUP"
    measured rate-hub --to "$HUB_ADDR" "${rc[@]}"
    local relay=$HUB_TICKS core_behind=$CORE_TICKS
    stop_all
    local r_d="$WORK/rate-direct.json" r_h="$WORK/rate-hub.json"
    echo
    echo "added latency at a fixed rate of $rate/s ($(( c * 2 )) connections, $DURATION): $(relay_label "$entry") against the core alone"
    printf '%-30s %12s %12s %12s\n' "" "core alone" "through hub" "added"
    # CPU per request at a steady rate: every exchange wakes the threads it
    # involves, and the closed loop's contention for the cores is absent.
    local us_alone us_behind us_relay
    us_alone=$(calc "$(per1000 "$core_alone" "$r_d") * 1000" 1)
    us_behind=$(calc "$(per1000 "$core_behind" "$r_h") * 1000" 1)
    us_relay=$(calc "$(per1000 "$relay" "$r_h") * 1000" 1)
    printf '%-30s %12s %12s\n' "core CPU us per request" "$us_alone" "$us_behind"
    printf '%-30s %12s %12s %12s\n' "relay CPU us per telegram" "-" "$us_relay" \
        "$(calc "$us_relay / ($us_behind > 0 ? $us_behind : 1)" 2)x"
    for p in p50 p90 p99 p999; do
        local a b
        a=$(num "$r_d" ${p}_us); b=$(num "$r_h" ${p}_us)
        printf "%-30s %12s %12s %12s\n" "latency $p (ms)" \
            "$(calc "$a / 1000" 3)" "$(calc "$b / 1000" 3)" "$(awk "BEGIN { printf \"%+.3f\", ($b - $a) / 1000 }")"
    done
    printf '%-30s %12s %12s\n' "wrong / no answer" \
        "$(num "$r_d" wrong) / $(num "$r_d" errors)" "$(num "$r_h" wrong) / $(num "$r_h" errors)"
}

# print_rows FILE BASE HEADING: the table of the rows in FILE, with each row's
# throughput against that of the BASE relay of the same round and connections
# (column HEADING).
print_rows() {
    printf '%-5s %-4s %-34s %10s %9s %9s %9s %9s %9s %9s %9s\n' round conn relay "req/s" \
        "$3" "relay us" "core us" "relay/" "p50 ms" "p99 ms" "wrong/"
    printf '%-5s %-4s %-34s %10s %9s %9s %9s %9s %9s %9s %9s\n' "" "" "" "" \
        "" "/telegram" "/request" "core" "" "" "no ans"
    awk -v tck="$TCK" -v base="$2" '
        { row[NR] = $0; if ($3 == base) yard[$1 " " $2] = $4 }
        END {
            for (i = 1; i <= NR; i++) {
                split(row[i], f, " ")
                y = yard[f[1] " " f[2]]
                relay_us = f[5] / tck / f[7] * 1e6; core_us = f[6] / tck / f[7] * 1e6
                printf "%-5s %-4s %-34s %10.0f %9s %9s %9.1f %9s %9.3f %9.3f %9s\n", f[1], f[2], f[3], f[4],
                    (y > 0 ? sprintf("%.2f", f[4] / y) : "-"),
                    (f[3] == "direct" ? "-" : sprintf("%.1f", relay_us)), core_us,
                    (f[3] == "direct" || core_us == 0 ? "-" : sprintf("%.2fx", relay_us / core_us)),
                    f[8] / 1000, f[9] / 1000, f[10] "/" f[11]
            }
        }' "$1"
}

run_compare() {
    : >"$WORK/rows"
    local round c entry
    for round in $(seq 1 "$ROUNDS"); do
        for c in $CONNECTIONS; do
            echo "== round $round, $c connections, $DURATION closed loop each: direct $RELAYS ==" >&2
            measure_relay direct "$c" "$round"
            for entry in $RELAYS; do measure_relay "$entry" "$c" "$round"; done
        done
    done
    echo
    echo "closed loop, $DURATION per row, each relay with a fresh corebank; CPU from /proc/PID/stat"
    print_rows "$WORK/rows" yardstick "x yard"
    if [ "$FIXED_RATE" != 0 ]; then
        local first_hub="" first_c td th rate
        for entry in $RELAYS; do
            case "$entry" in hub:*) first_hub=$entry; break ;; esac
        done
        first_c=${CONNECTIONS%% *}
        [ -n "$first_hub" ] || return 0
        td=$(awk -v c="$first_c" '$1 == 1 && $2 == c && $3 == "direct" {print $4}' "$WORK/rows")
        th=$(awk -v c="$first_c" -v l="$(relay_label "$first_hub")" '$1 == 1 && $2 == c && $3 == l {print $4}' "$WORK/rows")
        rate=${FIXED_RATE_PER_S:-$(awk "BEGIN { r = ($td < $th ? $td : $th) / 2; printf \"%d\", (r < 1 ? 1 : r) }")}
        echo "== both at $rate/s, $DURATION each ==" >&2
        fixed_rate "$first_hub" "$first_c" "$rate"
    fi
}

http_post() { # ADDR PATH BODY: a tiny HTTP client, so the script needs no curl.
    local host=${1%:*} port=${1##*:}
    exec 3<>"/dev/tcp/$host/$port"
    printf 'POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
        "$2" "$1" "${#3}" "$3" >&3
    cat <&3 >/dev/null
    exec 3>&-
}

run_slow() {
    local entry
    for entry in $SLOW_RELAYS; do slow_one "$entry"; done
}

# slow_one ENTRY: the slow-core run through one relay (see start_relay), with
# a core of its own.
slow_one() {
    local entry=$1 name
    name="slow-$(relay_label "$entry" | tr -c 'A-Za-z0-9_.-' _)"
    echo "== slow core: 200 ms per transfer, $SLOW_CONNECTIONS concurrent, $SLOW_DURATION, $(relay_label "$entry") ==" >&2
    ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    start_core "$name"; start_relay "$entry" "$name"
    local rss0 thr0
    bench "$name-warm" --to "$HUB_ADDR" -c 8 -n 1000
    rss0=$(status "$HUB_PID" VmRSS); thr0=$(status "$HUB_PID" Threads)
    # new_guid: today's date, then the prefix; the rule matches this run's GUIDs only.
    local prefix; prefix="$(date +%Y%m%d)SLOW"
    http_post "$CORE_ADDR" /_admin/faults \
        "{\"match\":{\"guid_prefix\":\"$prefix\",\"method\":\"POST\"},\"action\":{\"delay_ms\":200,\"phase\":\"before_apply\"}}"
    sample "$HUB_PID" "$WORK/$name-sample" & local sampler=$!
    measured "$name" --to "$HUB_ADDR" -c "$SLOW_CONNECTIONS" -d "$SLOW_DURATION" --guid-prefix SLOW --timeout 5s
    kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
    local hwm peak_thr peak_rss
    hwm=$(status "$HUB_PID" VmHWM)
    read -r peak_thr peak_rss <"$WORK/$name-sample"
    stop_all
    local f="$WORK/$name.json" bound
    bound=$(calc "$SLOW_CONNECTIONS / 0.2" 0)
    echo
    echo "$(relay_label "$entry") with a slow core: 200 ms per transfer, $SLOW_CONNECTIONS concurrent transfers, $SLOW_DURATION"
    printf '%-44s %14s\n' "throughput (transfers/s)" "$(calc "$(num "$f" throughput)" 0)"
    printf '%-44s %14s\n' "Little's-law bound (concurrency / 0.2 s)" "$bound"
    printf '%-44s %14s\n' "share of the bound" "$(calc "100 * $(num "$f" throughput) / $bound" 1) %"
    for p in p50 p99 max; do
        printf '%-44s %14s\n' "latency $p (ms)" "$(calc "$(num "$f" ${p}_us) / 1000" 1)"
    done
    printf '%-44s %14s\n' "codes" "$(tr -d '\n ' <"$f" | sed -n 's/.*"codes":{\([^}]*\)}.*/\1/p')"
    printf '%-44s %14s\n' "wrong / no answer" "$(num "$f" wrong) / $(num "$f" errors)"
    printf '%-44s %14s\n' "relay RSS before -> peak (MB)" "$(calc "$rss0 / 1024" 1) -> $(calc "$peak_rss / 1024" 1)"
    printf '%-44s %14s\n' "relay VmHWM (MB)" "$(calc "$hwm / 1024" 1)"
    printf '%-44s %14s\n' "relay threads before -> peak" "$thr0 -> $peak_thr"
    printf '%-44s %14s\n' "relay RSS per concurrent transfer (KB)" \
        "$(calc "($peak_rss - $rss0) / $SLOW_CONNECTIONS" 1)"
    printf '%-44s %14s\n' "relay CPU s per 1,000 telegrams" "$(per1000 "$HUB_TICKS" "$f")"
    printf '%-44s %14s\n' "core CPU s per 1,000 telegrams" "$(per1000 "$CORE_TICKS" "$f")"
}

run_scale() {
    echo "== $IDLE idle connections, then a load through 10 more ==" >&2
    ulimit -n $(( IDLE * 2 + 4096 )) 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt $(( IDLE + 1024 )) ]; then
        echo "compare.sh: ulimit -n is $(ulimit -n); $IDLE connections need more" >&2
        return 1
    fi
    start_core scale; start_hub scale
    bench scale-warm --to "$HUB_ADDR" -c 10 -n 2000
    local rss0 thr0; rss0=$(status "$HUB_PID" VmRSS); thr0=$(status "$HUB_PID" Threads)
    "$HUB_BIN" bench --json --to "$HUB_ADDR" -c 10 -n 20000 --idle-connections "$IDLE" \
        --idle-hold 3s >"$WORK/scale.json" 2>"$WORK/scale.err" & local bpid=$!
    local i
    for i in $(seq 1 600); do
        grep -q 'idle connections open' "$WORK/scale.err" 2>/dev/null && break
        kill -0 "$bpid" 2>/dev/null || break
        sleep 0.1
    done
    sleep 2   # let the hub settle its buffers for the last connections
    local rss_idle thr_idle; rss_idle=$(status "$HUB_PID" VmRSS); thr_idle=$(status "$HUB_PID" Threads)
    wait "$bpid" || echo "compare.sh: the scale bench reported wrong or missing answers" >&2
    local rss_end hwm; rss_end=$(status "$HUB_PID" VmRSS); hwm=$(status "$HUB_PID" VmHWM)
    stop_all
    local f="$WORK/scale.json"
    echo
    echo "relayhub with $IDLE idle channel connections"
    printf '%-44s %14s\n' "hub RSS before (MB)" "$(calc "$rss0 / 1024" 1)"
    printf '%-44s %14s\n' "hub RSS with $IDLE idle connections (MB)" "$(calc "$rss_idle / 1024" 1)"
    printf '%-44s %14s\n' "RSS per idle connection (KB)" "$(calc "($rss_idle - $rss0) / $IDLE" 2)"
    printf '%-44s %14s\n' "hub threads before / with idle connections" "$thr0 / $thr_idle"
    printf '%-44s %14s\n' "throughput through 10 more (req/s)" "$(calc "$(num "$f" throughput)" 0)"
    printf '%-44s %14s\n' "latency p50 / p99 (ms)" \
        "$(calc "$(num "$f" p50_us) / 1000" 3) / $(calc "$(num "$f" p99_us) / 1000" 3)"
    printf '%-44s %14s\n' "hub RSS after the load / VmHWM (MB)" \
        "$(calc "$rss_end / 1024" 1) / $(calc "$hwm / 1024" 1)"
    printf '%-44s %14s\n' "wrong / no answer" "$(num "$f" wrong) / $(num "$f" errors)"
}

# make_certs DIR: a throwaway CA and one leaf certificate (localhost and
# 127.0.0.1, for the hub's tls_listen and the core's HTTPS) with TLS_KEY keys.
make_certs() {
    local d=$1 alg=()
    if ! command -v openssl >/dev/null; then
        echo "compare.sh: --tls makes its certificates with openssl, which is not on the PATH" \
            "(Debian, Ubuntu: apt-get install openssl; RHEL, Fedora: dnf install openssl)" >&2
        return 1
    fi
    case "$TLS_KEY" in
        ec) alg=(-algorithm EC -pkeyopt ec_paramgen_curve:P-256) ;;
        rsa) alg=(-algorithm RSA -pkeyopt rsa_keygen_bits:2048) ;;
        *) echo "compare.sh: TLS_KEY is ec or rsa, not $TLS_KEY" >&2; return 1 ;;
    esac
    mkdir -p "$d"
    # No system openssl.cnf: its defaults differ between distributions.
    printf '%s\n' '[req]' 'distinguished_name = dn' 'x509_extensions = ca' 'prompt = no' '[dn]' \
        '[ca]' 'basicConstraints = critical, CA:TRUE' 'keyUsage = critical, keyCertSign, cRLSign' \
        'subjectKeyIdentifier = hash' >"$d/openssl.cnf"
    printf '%s\n' 'basicConstraints = critical, CA:FALSE' 'keyUsage = critical, digitalSignature' \
        'extendedKeyUsage = serverAuth' 'subjectAltName = DNS:localhost, IP:127.0.0.1' >"$d/leaf.ext"
    {
        openssl genpkey "${alg[@]}" -out "$d/ca.key" &&
        openssl req -config "$d/openssl.cnf" -x509 -new -key "$d/ca.key" -days 2 \
            -subj "/CN=relayhub bench CA" -out "$d/ca.pem" &&
        openssl genpkey "${alg[@]}" -out "$d/leaf.key" &&
        openssl req -config "$d/openssl.cnf" -new -key "$d/leaf.key" -subj "/CN=localhost" \
            -out "$d/leaf.csr" &&
        openssl x509 -req -in "$d/leaf.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
            -days 2 -extfile "$d/leaf.ext" -out "$d/leaf.pem"
    } >"$d/openssl.log" 2>&1 || {
        echo "compare.sh: openssl could not make the certificates; see $d/openssl.log" >&2
        return 1
    }
}

# start_tls_hub VARIANT NAME -> sets HUB_PID, HUB_ADDR (the listener the
# variant's channels use), PLAIN_ADDR, TLS_ADDR. VARIANT: plain, tls-channel,
# https-core or tls-both; CORE_ADDR must be up (HTTPS for https-core, tls-both).
start_tls_hub() {
    local v=$1 name=$2 t=$WORK/tls conf=$WORK/$2.toml scheme=http line
    {
        echo '[server]'
        echo 'listen = "127.0.0.1:0"'
        case "$v" in tls-channel|tls-both)
            echo 'tls_listen = "127.0.0.1:0"'
            echo "tls_cert_file = \"$t/leaf.pem\""
            echo "tls_key_file = \"$t/leaf.key\"" ;;
        esac
        echo
        echo '[[target]]'
        echo 'name = "core"'
        case "$v" in https-core|tls-both) scheme=https ;; esac
        echo "urls = [\"$scheme://$CORE_ADDR\"]"
        if [ "$scheme" = https ]; then echo "ca_file = \"$t/ca.pem\""; fi
    } >"$conf"
    RUST_LOG=$LOG "$HUB_BIN" serve --config "$conf" --journal memory \
        >"$WORK/$name-relay.out" 2>"$WORK/$name-relay.log" &
    HUB_PID=$!; PIDS+=("$HUB_PID")
    PLAIN_ADDR=$(wait_ready "$WORK/$name-relay.out")
    line=$(grep -m1 'listening on' "$WORK/$name-relay.out")
    TLS_ADDR=$(sed -n 's/.* tls on \([^ ]*\).*/\1/p' <<<"$line")
    HUB_ADDR=$PLAIN_ADDR
    case "$v" in tls-channel|tls-both)
        [ -n "$TLS_ADDR" ] || { echo "compare.sh: no tls address in: $line" >&2; return 1; }
        HUB_ADDR=$TLS_ADDR ;;
    esac
}

# One closed-loop run of a TLS variant at C connections, with a core of its
# own; appends a row to $WORK/tls-rows.
measure_tls() {
    local v=$1 c=$2 round=$3 name="r$round-c$c-tls-$1" core_tls=() chan_tls=()
    case "$v" in https-core|tls-both) core_tls=(--tls-cert "$WORK/tls/leaf.pem" --tls-key "$WORK/tls/leaf.key") ;; esac
    case "$v" in tls-channel|tls-both) chan_tls=(--tls --ca "$WORK/tls/ca.pem") ;; esac
    start_core "$name" "${core_tls[@]}"
    start_tls_hub "$v" "$name"
    bench "$name-warm" --to "$HUB_ADDR" "${chan_tls[@]}" -c "$c" -n "$WARMUP"
    measured "$name" --to "$HUB_ADDR" "${chan_tls[@]}" -c "$c" -d "$DURATION"
    local f="$WORK/$name.json" n
    n=$(num "$f" sent)
    [ "${n:-0}" -gt 0 ] || n=1
    echo "$round $c $v $(num "$f" throughput) $HUB_TICKS $CORE_TICKS $n" \
        "$(num "$f" p50_us) $(num "$f" p99_us) $(num "$f" wrong) $(num "$f" errors)" >>"$WORK/tls-rows"
    stop_all
}

# fresh ROUND LABEL ADDR [TLS ARGS...]: FRESH telegrams one after another, each
# a `relayhub send` on a connection of its own; appends a row to
# $WORK/fresh-rows with the hub's and the core's CPU ticks, the count answered
# and the seconds.
fresh() {
    local round=$1 label=$2 addr=$3 i ok=0 h0 c0 t0 t1
    shift 3
    h0=$(cpu "$HUB_PID"); c0=$(cpu "$CORE_PID"); t0=$(date +%s%N)
    for i in $(seq 1 "$FRESH"); do
        if "$HUB_BIN" send --to "$addr" "$@" --channel BENCH \
            --json '{"from_account":"1002003004005","to_bank":"088","to_account":"1002003004006","amount":1,"memo":"fresh"}' \
            >>"$WORK/fresh-$label.out" 2>>"$WORK/fresh-$label.err"; then
            ok=$(( ok + 1 ))
        fi
    done
    t1=$(date +%s%N)
    echo "$round $label $(( $(cpu "$HUB_PID") - h0 )) $(( $(cpu "$CORE_PID") - c0 )) $ok $(calc "($t1 - $t0) / 1e9" 2)" \
        >>"$WORK/fresh-rows"
}

run_tls() {
    make_certs "$WORK/tls"
    : >"$WORK/tls-rows"
    local round c v variants="plain tls-channel https-core tls-both"
    for round in $(seq 1 "$ROUNDS"); do
        for c in $CONNECTIONS; do
            echo "== TLS round $round, $c connections, $DURATION closed loop each: $variants ==" >&2
            for v in $variants; do measure_tls "$v" "$c" "$round"; done
        done
    done
    echo
    echo "the cost of TLS ($TLS_KEY keys): closed loop on keep-alive connections, $DURATION per row," \
        "each hub with a fresh corebank; CPU from /proc/PID/stat"
    print_rows "$WORK/tls-rows" plain "x plain"
    [ "$FRESH" != 0 ] || return 0
    echo "== $FRESH telegrams each on a fresh connection, plain then TLS, to one hub ==" >&2
    : >"$WORK/fresh-rows"
    start_core fresh
    start_tls_hub tls-channel fresh
    "$HUB_BIN" send --to "$TLS_ADDR" --tls --ca "$WORK/tls/ca.pem" --channel BENCH \
        --json '{"from_account":"1002003004005","to_bank":"088","to_account":"1002003004006","amount":1,"memo":"warm"}' \
        >/dev/null 2>&1 || true
    for round in $(seq 1 "$ROUNDS"); do
        fresh "$round" plain "$PLAIN_ADDR"
        fresh "$round" tls "$TLS_ADDR" --tls --ca "$WORK/tls/ca.pem"
    done
    stop_all
    echo
    echo "$FRESH telegrams, each on a new channel connection (one relayhub send each, one after" \
        "another), one hub and its corebank (plain HTTP to it, keep-alive)"
    printf '%-5s %-8s %9s %12s %12s %12s\n' round channel answered "hub us" "core us" "wall ms"
    printf '%-5s %-8s %9s %12s %12s %12s\n' "" "" "" "/telegram" "/request" "/telegram"
    awk -v tck="$TCK" '{
        n = ($5 > 0 ? $5 : 1); us = $3 / tck / n * 1e6
        printf "%-5s %-8s %9s %12.1f %12.1f %12.2f\n", $1, $2, $5, us, $4 / tck / n * 1e6, $6 / n * 1000
        hub[$1 " " $2] = us; if ($1 > rounds) rounds = $1
    }
    END { for (r = 1; r <= rounds; r++) if ((r " plain") in hub && (r " tls") in hub)
        printf "round %d: a TLS handshake costs the hub about %.0f us of CPU (tls - plain, per telegram)\n",
            r, hub[r " tls"] - hub[r " plain"] }' \
        "$WORK/fresh-rows"
}

for m in "${modes[@]}"; do
    case "$m" in
        compare) run_compare ;;
        slow) run_slow ;;
        scale) run_scale ;;
        tls) run_tls ;;
    esac
done
