#!/usr/bin/env bash
# Builds relayhub and the corebank fixture, starts the fixture, then the hub in
# front of it, ready to take telegrams. Ctrl-C (or SIGTERM) stops both.
#
#   HUB_LISTEN   telegram address     (default 127.0.0.1:9100)
#   ADMIN_LISTEN admin endpoints      (default 127.0.0.1:9101)
#   CORE_LISTEN  the fixture's address (default 127.0.0.1:8080)
#   JOURNAL      journal file or memory (default ./relayhub-journal.db)
set -euo pipefail
cd "$(dirname "$0")/.."

HUB_LISTEN=${HUB_LISTEN:-127.0.0.1:9100}
ADMIN_LISTEN=${ADMIN_LISTEN:-127.0.0.1:9101}
CORE_LISTEN=${CORE_LISTEN:-127.0.0.1:8080}
JOURNAL=${JOURNAL:-relayhub-journal.db}

if ! command -v cargo >/dev/null 2>&1; then
  echo "start-demo: cargo is needed (https://rustup.rs)" >&2
  exit 1
fi
cargo build --release --workspace --bins

pids=()
stop() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop EXIT INT TERM

# Start a program and wait for its "listening on" line (no sleeps). Its stdout
# stays open on a descriptor of this shell, so later output never hits a closed pipe.
start() {
  local name=$1; shift
  local fifo fd line
  fifo=$(mktemp -u)
  mkfifo "$fifo"
  exec {fd}<>"$fifo"
  rm -f "$fifo"
  "$@" >&"$fd" &
  local pid=$!
  pids+=("$pid")
  while kill -0 "$pid" 2>/dev/null; do
    if IFS= read -r -t 1 -u "$fd" line; then
      echo "$name: $line"
      case $line in *"listening on"*) return 0 ;; esac
    fi
  done
  echo "start-demo: $name exited before it was ready (see its messages above)" >&2
  exit 1
}

start corebank ./target/release/corebank --listen "$CORE_LISTEN" --accounts fixtures/accounts.json
start relayhub ./target/release/relayhub serve --listen "$HUB_LISTEN" --core-url "http://$CORE_LISTEN" \
  --admin-listen "$ADMIN_LISTEN" --journal "$JOURNAL"

cat <<TXT

relayhub takes telegrams on $HUB_LISTEN (admin: http://$ADMIN_LISTEN/metrics), the
corebank fixture answers on http://$CORE_LISTEN. Try, in another terminal:

  ./target/release/relayhub send --to $HUB_LISTEN \\
    --json '{"from_account":"1002003004001","to_bank":"088","to_account":"1002003004002","amount":50000,"memo":"월세 11월"}'

Ctrl-C stops both.
TXT
wait
