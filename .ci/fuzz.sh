#!/usr/bin/env bash
# Coverage-guided fuzzing of the frame decoder and the layout conversion
# (fuzz/, cargo fuzz on nightly), FUZZ_SECONDS (30) per target.
#
# Runs only where a nightly toolchain and cargo-fuzz are already installed: the
# fuzz build (every dependency instrumented) costs minutes that CI on 2 cores
# cannot spare on top of installing cargo-fuzz. FUZZ_INSTALL=1 installs
# cargo-fuzz when missing. Elsewhere it says so and exits 0: the property tests
# (tests/props/prop_frame.rs, tests/props/prop_layout.rs) cover the same code in cargo test.
# See docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET="${FUZZ_SECONDS:-30}"
BUILD_TIMEOUT="${FUZZ_BUILD_TIMEOUT:-900}"
TARGETS=(frame_decode layout_decode layout_encode)

skip() {
    echo "fuzz: skipped ($1); proptest fallback runs in cargo test"
    exit 0
}

rustup toolchain list 2>/dev/null | grep -q '^nightly' || skip "no nightly/cargo-fuzz"
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    if [ "${FUZZ_INSTALL:-0}" = 1 ]; then
        echo "fuzz: installing cargo-fuzz"
        timeout 600 cargo install cargo-fuzz --locked || skip "cargo-fuzz did not install"
    else
        skip "no nightly/cargo-fuzz"
    fi
fi
cargo +nightly fuzz --version

# Safe Rust throughout (src/ has no `unsafe`), so no sanitizer: the targets'
# assertions and Rust's own panics (overflow checks on, -a) are the oracle,
# and the build and runs are several times faster.
FLAGS=(-O -a -s none)

echo "== fuzz build"
set +e
timeout "$BUILD_TIMEOUT" cargo +nightly fuzz build "${FLAGS[@]}"
status=$?
set -e
if [ "$status" = 124 ]; then
    skip "the fuzz build took longer than ${BUILD_TIMEOUT} s"
elif [ "$status" != 0 ]; then
    echo "fuzz: the fuzz targets do not build" >&2
    exit "$status"
fi

for t in "${TARGETS[@]}"; do
    echo "== fuzz $t (${SECONDS_PER_TARGET} s)"
    # New inputs go to fuzz/work/ (ignored by git); the committed seeds stay as they are.
    mkdir -p "fuzz/work/$t"
    cargo +nightly fuzz run "${FLAGS[@]}" "$t" "fuzz/work/$t" "fuzz/corpus/$t" -- \
        -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
done
echo "fuzz: ${#TARGETS[@]} targets, ${SECONDS_PER_TARGET} s each, no crash, no hang"
