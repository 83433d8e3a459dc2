#!/usr/bin/env bash
# One device call that gathers everything the families' acceptance needs on the GPU, from the bundle
# built by scripts/gpu-bundle. Steps run in the order given, each under its own time limit and all
# under one deadline, so the call ends inside the device tool's 10 minutes with whatever finished.
# Logs and tables are packed into $OUT/logs.tgz after every step (the tool returns at most 8 files);
# a summary is printed last.
#
#   scripts/gpu-session.sh [STEP ...]     (default: device anchors tests tables benches)
#   steps: device | anchors[:FAMILIES] | tests[:FILTER] | tables[:FAMILY[:ARGS]] | loo:FAMILY | benches[:NAME]
#          | bench:NAME:REGEX (one bench, criterion filter) | lmhead-padded | splits-sweep
#          | gpt2-check (Hugging Face reference, every named plan and a paged one) | gpt2-generate (text,
#            each plan; sampled on the device, contiguous and paged cache)
#          | overhead (host cost of a launch) | graph (every family, --graph --quick)
#          | timeline:FAMILY:ARGS (ladder timeline) | verify:FAMILY[:ARGS] (ladder verify)
#          | sweep:FAMILY[:ARGS] (ladder sweep) | report-sweep (the report's block-size sweep, best saved)
#          | counters:FAMILY[:ARGS] (ladder run --counters: Nsight Compute per stage)
#          | sanitize[:TARGETS] (scripts/sanitize: verification only under compute-sanitizer's four tools)
#          | runall (wall time of `ladder run all` from an empty cache, and of the previous commit's
#            ladder in .gpu-old/ when carried) | cmp:FAMILY[:ARGS] (full tables of FAMILY by both binaries)
#   DEADLINE_S (default 570): seconds the whole session may take.
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=.gpu-bundle
logs=/tmp/logs
mkdir -p "$logs/tables"
export LOG_DIR="$logs"
start=$(date +%s)
deadline=$((start + ${DEADLINE_S:-570}))
summary="$logs/summary.txt"
: >"$summary"

pack() { [ -n "${OUT:-}" ] && tar czf "$OUT/logs.tgz" -C /tmp logs 2>/dev/null; }

# step NAME LIMIT COMMAND: runs the shell COMMAND under min(LIMIT, time left), logs to $logs/NAME.log.
step() {
    local name=$1 limit=$2 cmd=$3
    local left=$((deadline - $(date +%s) - 5))
    if [ "$left" -le 5 ]; then
        echo "SKIPPED $name (deadline)" | tee -a "$summary"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local t0
    t0=$(date +%s)
    timeout "$limit" bash -c "$cmd" >"$logs/$name.log" 2>&1
    local rc=$?
    local verdict=ok
    [ $rc -ne 0 ] && verdict="FAILED rc=$rc"
    [ $rc -eq 124 ] && verdict="TIMEOUT after ${limit}s"
    echo "$verdict $name ($(($(date +%s) - t0)) s)" | tee -a "$summary"
    pack
}

tables() { # FAMILY [extra ladder args]: the ladder command line, with the anchors once measured
    local anchors=""
    [ -s "$logs/anchors.json" ] && anchors="--anchors $logs/anchors.json"
    echo "$bundle/run.sh ladder run $* $anchors --out $logs/tables${tables_dir:+/$tables_dir}"
}
family_args() { # sets fam and extra from a step's argument FAMILY[:ARGS], and tag: both, fit for a log name
    fam=${arg%%:*}
    extra=""
    [ "$fam" != "$arg" ] && extra=${arg#*:}
    tag="$fam$(printf '%s' "${extra:+-$extra}" | tr -c 'A-Za-z0-9=.-' '_')"
}
export LADDER_BENCH_SMOKE=1

[ $# -eq 0 ] && set -- device anchors tests tables benches
for s in "$@"; do
    arg=${s#*:}
    [ "$arg" = "$s" ] && arg=""
    case "$s" in
    device) step device 90 "nvidia-smi; $bundle/run.sh ladder device --remeasure" ;;
    anchors) step anchors 240 "PYTHONUNBUFFERED=1 python3 scripts/anchors.py --out $logs/anchors.json" ;;
    anchors:*) step "anchors-$arg" 300 "PYTHONUNBUFFERED=1 python3 scripts/anchors.py --family $arg --out $logs/anchors.json" ;;
    tests*) step "tests${arg:+-$arg}" 300 "$bundle/run.sh tests $arg" ;;
    tables)
        for fam in norm attention gpt2; do step "tables-$fam" 150 "$(tables "$fam")"; done
        step tables-matmul 200 "$(tables matmul --leave-one-out)"
        step tables-quant-int4 300 "$(tables quant-int4 --leave-one-out)"
        ;;
    tables:*)
        family_args
        # The extra arguments name the log and the JSON tables' folder, so several tables steps of
        # one family (other stages, timing modes) keep their logs and tables apart.
        tables_dir=$tag
        step "tables-$tag" 300 "$(tables "$fam" $extra)"
        tables_dir=
        ;;
    loo:*) step "tables-$arg-loo" 300 "$(tables "$arg" --leave-one-out)" ;;
    benches*)
        for b in "$bundle"/benches/*; do
            name=$(basename "$b")
            [ -n "$arg" ] && [[ "$name" != *"$arg"* ]] && continue
            step "bench-$name" 150 "$bundle/run.sh bench $name"
        done
        ;;
    bench:*)
        name=${arg%%:*}
        filter=${arg#*:}
        step "bench-$name-filtered" 300 "$bundle/run.sh bench $name '$filter'"
        ;;
    lmhead-padded)
        # The LM head with the vocabulary padded to 50304 (as llm.c does): every leading dimension a
        # multiple of 8, so cuBLAS takes its aligned tensor-core path.
        step tables-matmul-lmhead-padded 120 "$(tables matmul --op linear --shape N=50304)"
        ;;
    splits-sweep)
        # The reference swept the split count 2..128 and reported the best; the heuristic default
        # (splits=0) is in the main tables.
        for b in 32 512; do
            for fmt_stages in 1:0..10 4:11..15; do
                fmt=${fmt_stages%%:*}
                for sp in 2 4 8 16 32 64 128; do
                    step "sweep-B$b-fmt$fmt-s$sp" 60 "$(tables quant-int4 --op decode \
                        --shape B=$b,fmt=$fmt,splits=$sp --stages ${fmt_stages#*:} --quick)"
                done
            done
        done
        ;;
    gpt2-check)
        # Hugging Face's GPT-2 (seeded, no download) as the reference, then every named plan against it,
        # whole-sequence and through the KV cache, eager and graph-replayed.
        step gpt2-check 300 "python3 scripts/gpt2_reference.py --out /tmp/gpt2-ref && $bundle/run.sh ladder gpt2 check \
            --reference /tmp/gpt2-ref --plan naive report fp32 cublas cublas-gemv bf16 fp8 fp8:gemv-fp8=4 pdl megakernel fastest fastest-bf16 fastest-bf16:decode=4 \
            --kv-cache --graph"
        ;;
    gpt2-check:*)
        # The same check for the plans after the colon (comma-separated).
        step "gpt2-check-${arg//[^A-Za-z0-9=.-]/_}" 300 "[ -f /tmp/gpt2-ref/model.safetensors ] || python3 scripts/gpt2_reference.py --out /tmp/gpt2-ref; \
            $bundle/run.sh ladder gpt2 check --reference /tmp/gpt2-ref --plan ${arg//,/ } --kv-cache --graph"
        ;;
    gpt2-generate)
        # Text from the reference weights and from random ones, batch 1 and a ragged batch, each plan.
        step gpt2-generate 200 "[ -f /tmp/gpt2-ref/model.safetensors ] || python3 scripts/gpt2_reference.py --out /tmp/gpt2-ref; for p in report cublas-gemv bf16 pdl megakernel fastest fastest-bf16; do for g in '' --graph; do \
            $bundle/run.sh ladder generate --prompt 'The meaning of life is' --weights /tmp/gpt2-ref/model.safetensors \
            --temperature 0 --max-new-tokens 128 --plan \$p \$g; done; done; \
            $bundle/run.sh ladder generate --prompt Hello --prompt 'A much longer prompt about the city' --batch 2 \
            --max-new-tokens 64 --top-k 40 --top-p 0.9 --temperature 0.8 --seed 3 --plan fastest-bf16 --graph; \
            $bundle/run.sh ladder generate --prompt Hello --prompt 'A much longer prompt about the city' --batch 2 \
            --max-new-tokens 64 --top-k 40 --top-p 0.9 --temperature 0.8 --seed 3 --plan fastest-bf16:decode=4 --graph"
        ;;
    overhead) step overhead 60 "$bundle/run.sh ladder launch-overhead" ;;
    timeline:*)
        # ladder timeline FAMILY ARGS (colon-separated: FAMILY:ARGS): the kernel's own phase stamps.
        family_args
        step "timeline-$tag" 300 "$bundle/run.sh ladder timeline $fam $extra --format md"
        ;;
    verify:*)
        # ladder verify FAMILY ARGS: every selected stage checked once at each default shape.
        family_args
        step "verify-$tag" 300 "$bundle/run.sh ladder verify $fam $extra"
        ;;
    sweep:*)
        # ladder sweep FAMILY [ARGS] (colon-separated: FAMILY:ARGS), tables and charts under sweeps/.
        family_args
        step "sweep-$tag" 300 \
            "$bundle/run.sh ladder sweep $fam $extra --out $logs/sweeps"
        ;;
    report-sweep)
        # The report's block-size sweep (its config_sweep.py): residual, GELU, encoder, LayerNorm
        # (block reduction), the bias kernel after cuBLAS ("prepare out") and the fp16 conversions,
        # each over its declared sweep space at the model's shape; the best saved for `fastest`.
        for target in "gpt2 --op residual" "gpt2 --op gelu" "gpt2 --op encoder" "norm --op layernorm --stage 4" \
            "matmul --op linear --stage 90" "matmul --op linear --stage 92"; do
            name=$(printf '%s' "$target" | tr -c 'A-Za-z0-9=.-' '_')
            step "report-sweep-$name" 200 "$bundle/run.sh ladder sweep $target --save-best --out $logs/sweeps"
        done
        ;;
    counters:*)
        # ladder run FAMILY [ARGS] --counters: every passed stage once more under Nsight Compute.
        family_args
        step "counters-$tag" 400 \
            "$bundle/run.sh ladder run $fam $extra --counters --out $logs/counters"
        ;;
    sanitize*)
        # scripts/sanitize on the targets after the colon (FAMILY or FAMILY/OP, comma-separated;
        # default every family), its per-run logs under the session's logs.
        step "sanitize$(printf '%s' "${arg:+-$arg}" | tr -c 'A-Za-z0-9=.-' '_')" 540 \
            "LOG_DIR=$logs/sanitize scripts/sanitize ${arg//,/ }" ;;
    graph) step tables-graph 300 "$bundle/run.sh ladder run all --graph --quick --out $logs/tables-graph" ;;
    runall)
        # The README's main job, `ladder run all` with its default timing, from an empty kernel cache
        # (every NVRTC compilation paid), its tables and per-family times saved; with .gpu-old/
        # carried, the same for the older ladder.
        # Its own cache folder, emptied first: a warm machine keeps /tmp between calls.
        step runall 330 "rm -rf /tmp/cache-runall-new; s=\$(date +%s%N); LADDER_CACHE_DIR=/tmp/cache-runall-new $bundle/run.sh ladder run all --out $logs/tables/runall; echo wall \$(( (\$(date +%s%N) - s) / 1000000 )) ms"
        if [ -x .gpu-old/ladder ]; then
            step runall-before 400 "rm -rf /tmp/cache-runall-old; s=\$(date +%s%N); LADDER_CACHE_DIR=/tmp/cache-runall-old .gpu-old/run.sh ladder run all; echo wall \$(( (\$(date +%s%N) - s) / 1000000 )) ms"
        fi
        ;;
    cmp:*)
        family_args
        step "cmp-$fam-after" 200 "$bundle/run.sh ladder run $fam $extra --out $logs/cmp-after"
        [ -x .gpu-old/ladder ] && step "cmp-$fam-before" 200 \
            "LADDER_CACHE_DIR=/tmp/ladder-cache-old .gpu-old/run.sh ladder run $fam $extra --out $logs/cmp-before"
        ;;
    *) echo "unknown step $s" | tee -a "$summary" ;;
    esac
done

echo "=== tests ==="
cat "$logs"/tests*.log 2>/dev/null | grep -E "^(ok|FAILED) |passed, " || true
echo "=== FAILED rows / errors in tables ==="
grep -hE "FAILED|^error" "$logs"/tables-*.log 2>/dev/null | head -40 || true
echo "=== summary ($(($(date +%s) - start)) s) ==="
cat "$summary"
pack
