# Shell helpers shared by the bench scripts (sourced, not run).

# wait_ready FILE: the HOST:PORT of the `listening on` line, within 10 s.
wait_ready() {
    local i
    for i in $(seq 1 200); do
        if grep -q 'listening on' "$1" 2>/dev/null; then
            sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$1" | head -n1
            return 0
        fi
        sleep 0.05
    done
    echo "${0##*/}: no ready line in $1" >&2
    return 1
}

# num FILE KEY: the first `"KEY": number` in a JSON report.
num() { sed -n "s/^ *\"$2\": \([-0-9.e+]*\),\{0,1\}$/\1/p" "$1" | head -n1; }
