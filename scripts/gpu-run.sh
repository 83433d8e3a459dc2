#!/usr/bin/env bash
# The GPU-side runner packed into .gpu-bundle/run.sh by scripts/gpu-bundle.
#   run.sh tests [FILTER [ARGS...]]  every test executable (whose name contains FILTER) with
#                                LADDER_REQUIRE_GPU=1 and ARGS (a test-name filter, --skip NAME);
#                                one line each (a test the harness ignored is flagged: none should
#                                be, with a device), then "N passed, N failed"; logs in $LOG_DIR/tests/
#   run.sh ladder ARGS...        the ladder CLI
#   run.sh bench NAME [ARGS...]  one criterion bench executable (NAME as in benches/, e.g.
#                                norm.bench.norm), with criterion's output under $LOG_DIR/criterion
# LOG_DIR defaults to $OUT (the device tool's folder) or ./gpu-logs.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
LOG_DIR="${LOG_DIR:-${OUT:-$PWD/gpu-logs}}"
mkdir -p "$LOG_DIR"

# NVRTC, cuBLAS and the CUDA headers from the machine's CUDA install or its Python packages.
libdirs=""
for lib in libnvrtc.so.13 libnvrtc.so.12 libcublas.so.13 libcublas.so.12 libcublasLt.so.13; do
    d=$(find /usr/local/cuda*/ /opt /usr/lib/x86_64-linux-gnu -name "$lib" -print -quit 2>/dev/null | xargs -r dirname)
    [ -n "$d" ] && libdirs="$libdirs:$d"
done
export LD_LIBRARY_PATH="${libdirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LADDER_CACHE_DIR="${LADDER_CACHE_DIR:-/tmp/ladder-cache}"
export LADDER_REQUIRE_GPU=1 LADDER_REQUIRE_NVRTC=1

cmd="${1:-tests}"
shift || true
case "$cmd" in
tests)
    filter="${1:-}"
    shift || true
    mkdir -p "$LOG_DIR/tests"
    passed=0
    failed=0
    for t in "$here"/tests/*; do
        name=$(basename "$t")
        [ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
        start=$(date +%s)
        if timeout "${TEST_TIMEOUT:-300}" "$t" --test-threads=1 "$@" >"$LOG_DIR/tests/$name.log" 2>&1; then
            status=ok
            passed=$((passed + 1))
        else
            status=FAILED
            failed=$((failed + 1))
        fi
        summary=$(grep -E "^test result" "$LOG_DIR/tests/$name.log" | tail -1)
        ignored=$(echo "$summary" | grep -oE "[0-9]+ ignored" | cut -d' ' -f1)
        flag=""
        [ "${ignored:-0}" -gt 0 ] && flag=" (IGNORED TESTS)"
        echo "$status $name ($(($(date +%s) - start)) s): ${summary:-no test result line}$flag"
    done
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    ;;
ladder)
    exec "$here/ladder" "$@"
    ;;
bench)
    name="$1"
    shift
    export CRITERION_HOME="$LOG_DIR/criterion"
    exec "$here/benches/$name" --bench "$@"
    ;;
*)
    echo "usage: run.sh tests [FILTER] | ladder ARGS... | bench NAME [ARGS...]" >&2
    exit 2
    ;;
esac
