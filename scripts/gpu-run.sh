#!/usr/bin/env bash
# The GPU-side runner packed into .gpu-bundle/run.sh by scripts/gpu-bundle.
#   run.sh tests [FILTER [ARGS...]]  every test executable (whose name contains FILTER) with
#                                LADDER_REQUIRE_GPU=1 and ARGS (a test-name filter, --skip NAME),
#                                TEST_JOBS (default 4) executables at once; one line each as it ends
#                                (a test the harness ignored is flagged: none should be, with a
#                                device), then "N passed, N failed"; logs in $LOG_DIR/tests/
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
    # One executable: its log, and one status line in $LOG_DIR/tests/NAME.status.
    run_one() {
        local t=$1 name start status summary ignored flag
        shift
        name=$(basename "$t")
        start=$(date +%s)
        if timeout "${TEST_TIMEOUT:-300}" "$t" --test-threads=1 "$@" >"$LOG_DIR/tests/$name.log" 2>&1; then
            status=ok
        else
            status=FAILED
        fi
        summary=$(grep -E "^test result" "$LOG_DIR/tests/$name.log" | tail -1)
        ignored=$(echo "$summary" | grep -oE "[0-9]+ ignored" | cut -d' ' -f1)
        flag=""
        [ "${ignored:-0}" -gt 0 ] && flag=" (IGNORED TESTS)"
        echo "$status $name ($(($(date +%s) - start)) s): ${summary:-no test result line}$flag" | tee "$LOG_DIR/tests/$name.status"
    }
    # TEST_JOBS executables at once (each still one test at a time): the tests check results, not
    # time, and most of an executable's wall time is NVRTC on the CPU, which the others' GPU work
    # does not slow. The kernel cache is written by rename, so they share it safely. gpu_runner
    # runs first and alone: it may measure the device's ceilings, which the session caches.
    rm -f "$LOG_DIR"/tests/*.status
    for t in "$here"/tests/*; do
        name=$(basename "$t")
        [ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
        if [[ "$name" == *gpu_runner* ]]; then
            run_one "$t" "$@"
        fi
    done
    for t in "$here"/tests/*; do
        name=$(basename "$t")
        [ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
        [[ "$name" == *gpu_runner* ]] && continue
        while [ "$(jobs -rp | wc -l)" -ge "${TEST_JOBS:-4}" ]; do wait -n; done
        run_one "$t" "$@" &
    done
    wait
    passed=$(cat "$LOG_DIR"/tests/*.status 2>/dev/null | grep -c "^ok ")
    failed=$(cat "$LOG_DIR"/tests/*.status 2>/dev/null | grep -vc "^ok ")
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
