#!/usr/bin/env bash
# The GPU checks of issue 40, prepared for a session that is lent one GPU (an H100 or H200). A session has 15
# minutes of device time and one command runs at most 10, so the checks come in calls of their own:
#
#   here, once:         bash perf/gpu_check.sh prepare   # the default tokenizer's files into .gpu/ (ignored)
#   there, first call:  bash perf/gpu_check.sh run       # the device tool: carry [".gpu"], timeout_s 600
#   there, if time is left (a fresh start costs ~30 s):  bash perf/gpu_check.sh floors   (or: solver)
#   or, split: `look` first (both model phases profiled at 2,040 pairs, then every floor at 9,180: ~5.5 min;
#   its floors did not finish in 330 s on 2026-11-27), then `LIMIT=S bash perf/gpu_check.sh quarter` (C alone,
#   in a call of S seconds).
#   `profiles`: both model phases under torch's profiler at 2,040 pairs (~2.5 min; each trace's gaps and the device
#   time by launching operator in meta-trace.json.gz.txt and direct-trace.json.gz.txt); delete the steps' .json
#   and .md files in the same command, or more than 8 files come back. On 2026-11-28 evening `quarter` then
#   `floors` in one call took 410 s (quarter 264 s), `profiles` 183 s: for the next session, `before 6b9f844`
#   here and `ab` there first (packed grouped-query attention, unmeasured on a GPU), with `matmul` in the same
#   call (perf/matmul_shapes.py: what a new matmul shape costs the host, ~30 s) and `probe` (the probe phase at a
#   quarter's group sizes from a bfloat16 store, profiled, ~1.5 min), then `quarter`. Since 2026-11-29 also
#   `wait` in that first call (perf/event_wait.py, ~30 s: the read backs' events now block instead of spinning;
#   a synchronising read, and both with the context's flag set to blocking).
#   before and after a change, in one call of ~4 min: here `bash perf/gpu_check.sh before REV` (REV's babelprobe/
#   and this tree's perf/ into .gpu/before), there `bash perf/gpu_check.sh ab` (9,180 pairs, no floors, the probe phase on
#   layer 0 only: the current tree, REV's twice, the current tree again, on the same GPU). On 2026-11-29 `ab`, `wait`,
#   `matmul` and `probe` took 218 s in one call, then `LIMIT=330 ... quarter` 242 s and `probe` plus `solver` 130 s
#   (perf/README.md "An H200 again"); the next session: `before 6b9f844` here, the same calls, `ab` now 4 runs.
#   Since 2026-11-30 also `pages` (perf/store_pages.py, ~2-3 min): whether this machine's store writes are faster
#   with each shard's pages dropped from the page cache, what that costs the probe phase's reads, and what the
#   shards' fsyncs cost (whether the disk sets direct's pace), and `tests` (~1-2 min): the family suite's model checks
#   with babelprobe on the GPU against HF on the CPU, the first check of the engine's numbers on a GPU. `budgets`
#   (~2 min): the workflow at 9,180 pairs at babelprobe's default budget (4,096 tokens, the acceptance command's)
#   and at the 16,384 these steps use, twice each in turns: whether the default should depend on the device.
#   On 2026-11-30 `tests; ab` (258 s: the suite passed on the GPU), `LIMIT=380 ... quarter` (202 s) and `budgets`
#   (174 s; meta 5-7% faster at 16,384, direct the same). Next: `workers` (~2.5 min: the probe phase with 2, 3 and 4
#   groups in flight, in turn on one store), `segments` (~3 min: the CUDA allocator as it is and with expandable
#   segments, its calls counted), then `profiles` (now with each thread's CUDA runtime calls), `floors`, `quarter`.
#   Since 2026-12-01 (fewer reads back: extraction's pooler, StableLM's SDPA, the probe solvers), `tests` first
#   (the suite now also checks that the passes read nothing back), and `probe-ab` (~2.5 min: the probe phase of
#   this tree against `before f323d53`'s, whose solvers read ~3 values an iteration, in turns on one store).
#
# The GPU machine has no gguf package, so the Llama shapes take the default model's tokenizer from .gpu/tokenizer
# (`prepare` copies the converted model's tokenizer files there, ~33 MB; .gpu/ is listed in .git/info/exclude
# and travels with `carry`). Every step has its own time limit and writes its table and the tail of its log to
# $OUT (what comes back); run directories go to /tmp/bp-work, emptied after each step (a full disk once made
# a step crash and kept $OUT from coming back). Durations from the H200 run of 2026-11-27 (an H100: ~1.2x):
#
#   run     P  perf/workflow.py --pairs 30 (2,040 pairs), the meta phase under torch's profiler: a Chrome
#              trace (gzipped) and the operators' totals (where the GPU waits; meta was busy 49%)     ~1 min
#           C  perf/workflow.py --pairs quarter (61,064 pairs, a quarter of XCOMPS, the acceptance's size),
#              bfloat16 store (18.8 GB on disk since a text is stored once; 33 GB before), no measured floors, end-to-end
#              time, MFU, GPU busy
#              (9,180 pairs took 76 s: ~8 min at that rate)               (limit: the rest of 585 s)
#   floors  A  perf/workflow.py --pairs 135 (9,180 pairs), every floor (replay; bare forward at 5 budgets on
#              100k-token samples; arithmetic), MFU, GPU busy                          ~3 min (limit 240 s)
#   solver  B  perf/probe_solver.py --gpu: 20,000 items x 33 layers x 4096 dims on the GPU, against the CPU
#              (torch, 1 layer scaled) and scikit-learn (1 fold x 1 layer scaled)       ~1.1 min (limit 90 s)
#
# A reads: each model phase >= 0.8 of its floor, GPU busy >= 0.8 (issue 40's GPU goals); C: the end-to-end
# minutes of a quarter of XCOMPS (x4 for the whole, against the goal of 15 min) and its MFU.
set -u
cd "$(dirname "$0")/.."
STEP="${1:-run}"

if [ "$STEP" = "prepare" ]; then
    EXCLUDE="$(git rev-parse --git-path info/exclude)"
    mkdir -p "$(dirname "$EXCLUDE")"
    grep -qxF "/.gpu/" "$EXCLUDE" 2>/dev/null || echo "/.gpu/" >> "$EXCLUDE"
    mkdir -p .gpu/tokenizer
    PYTHON="${PYTHON:-.venv/bin/python}"
    "$PYTHON" - <<'EOF'
from babelprobe.models import _converted_default
from transformers import AutoTokenizer

AutoTokenizer.from_pretrained(_converted_default()).save_pretrained(".gpu/tokenizer")
print("tokenizer files in .gpu/tokenizer; carry .gpu on the device call")
EOF
    exit $?
fi

if [ "$STEP" = "before" ]; then
    REV="${2:?usage: bash perf/gpu_check.sh before REV}"
    rm -rf .gpu/before && mkdir -p .gpu/before
    # REV's babelprobe with this tree's perf/: both runs build the same items and take the same measures
    git archive "$REV" babelprobe | tar -x -C .gpu/before && cp -r perf .gpu/before/ && echo "$REV" > .gpu/before/REV
    echo "$(git rev-parse --short "$REV")'s babelprobe (and this tree's perf) in .gpu/before; carry .gpu, then: bash perf/gpu_check.sh ab"
    exit $?
fi

OUT="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 BABELPROBE_CACHE=/tmp/babelprobe-cache TOKENIZERS_PARALLELISM=true
PY="${PY:-python3}"
TOK=.gpu/tokenizer
START=$(date +%s)
say() { echo "== $(( $(date +%s) - START )) s: $*"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
case "$STEP" in  # the steps that run the Llama shapes need the tokenizer
tests|pages|wait|matmul|solver|probe|probe-ab|workers) ;;
*) [ -f "$TOK/tokenizer.json" ] || { echo "no $TOK: run 'bash perf/gpu_check.sh prepare' here and carry .gpu"; exit 2; } ;;
esac
WORK=/tmp/bp-work
# DEVICE=simulated-gpu (or simulated) tries the steps on a machine without a GPU (perf/simulated.py)
COMMON=(--shape llama-3.1-8b --device "${DEVICE:-cuda}" --tokenizer "$TOK" --batch-tokens 16384 --tmp "$WORK")
# step NAME LIMIT ARGS...: one workflow run, its table and log tail in $OUT, its run directory removed after
step() {
    local name=$1 limit=$2; shift 2
    mkdir -p "$WORK"
    timeout "$limit" $PY "${PERF:-perf}/workflow.py" "${COMMON[@]}" "$@" --json "$OUT/$name.json" --markdown "$OUT/$name.md" \
        2> "$WORK/$name.log"
    local rc=$?
    # the log's last lines, a progress bar's last state only
    tr '\r' '\n' < "$WORK/$name.log" | grep -v '^\s*$' | cut -c1-240 \
        | awk -F: '{ if (NR > 1 && $1 != key) print last; key = $1; last = $0 } END { print last }' \
        | tail -n 80 > "$OUT/$name.log"
    tail -n 8 "$OUT/$name.log"
    rm -rf "${WORK:?}"/*
    say "$name: rc $rc"
    return $rc
}

# gather NAME INTO: step NAME's table and log appended to INTO.md and INTO.log under a heading, its own files removed
# (at most 8 files come back from a call)
gather() {
    local kind
    for kind in md log; do { echo "## $1"; cat "$OUT/$1.$kind"; echo; } >> "$OUT/$2.$kind"; done
    rm -f "$OUT/$1".{md,log,json}
}

# both model phases under torch's profiler at 2,040 pairs (`look`, `profiles`)
profile_both() {
    say "P: the meta phase profiled at 2,040 pairs"
    step profile-meta 110 --pairs 30 --no-floors --store-dtype bfloat16 --profile "$OUT/meta-trace.json.gz"
    say "P: the direct phase (with its fused extraction) profiled at 2,040 pairs"
    step profile-direct 110 --pairs 30 --no-floors --store-dtype bfloat16 --profile "$OUT/direct-trace.json.gz" \
        --profile-phase direct
}

case "$STEP" in
run)
    say "P: the meta phase profiled at 2,040 pairs"
    step profile 150 --pairs 30 --no-floors --store-dtype bfloat16 --profile "$OUT/meta-trace.json.gz"
    RC=$?
    # a failure in the first minute (a broken path, not a slow one) ends the call, leaving device time to rerun
    if [ $RC -ne 0 ] && [ $RC -ne 124 ]; then say "P failed: stopping here"; exit $RC; fi
    # C gets what is left of the call's 600 s (the device tool's limit), less 15 s to write its files back
    say "C: the workflow at a quarter of XCOMPS (61,064 pairs)"
    step quarter $(( 585 - $(date +%s) + START )) --pairs quarter --no-floors --store-dtype bfloat16
    ;;
quarter)
    # C alone, in a call of LIMIT seconds (default 585; a session with less device time left gives less)
    say "C: the workflow at a quarter of XCOMPS (61,064 pairs)"
    step quarter $(( ${LIMIT:-585} - $(date +%s) + START )) --pairs quarter --no-floors --store-dtype bfloat16
    ;;
look)
    # before changing the engine: where both model phases wait, and every floor, in one call of ~5 min
    profile_both
    say "A: the workflow at 9,180 pairs with every floor"
    step floors-135 $(( 330 - $(date +%s) + START )) --pairs 135 --sweep-tokens 100000 --store-dtype bfloat16
    ;;
profiles)
    # where both model phases wait now, without the floors (~2.5 min)
    profile_both
    ;;
probe)
    # the probe phase alone at a quarter's group sizes (1,796 items × 33 layers × 4096), one language's 4 groups
    # written to a bfloat16 store (~35 s here) and probed from it, the first of 2 rounds profiled (~1.5 min; the
    # phase was busy 0.53 at the quarter)
    mkdir -p "$WORK"
    timeout 200 $PY perf/probe_phase.py --pairs quarter --languages 1 --d-model 4096 --on-disk bfloat16 --repeat 2 \
        --profile "$OUT/probe-trace.json.gz" --tmp "$WORK" > "$OUT/probe-phase.txt" 2>&1
    tail -n 6 "$OUT/probe-phase.txt"; head -n 30 "$OUT/probe-trace.json.gz.txt" 2>/dev/null
    rm -rf "${WORK:?}"/*
    # one 8B shard read back to the GPU as a probe group is (staged, page-locked) against HDF5's read, ~10 s
    timeout 60 $PY perf/store_floor.py --repeat 3 --read-device cuda --tmp "$WORK" 2>&1 | tail -n 7
    ;;
workers)
    # the probe phase with 2, 3 and 4 groups in flight, in turn, on one store of two languages' 8 groups at a
    # quarter's size (1,796 items × 33 layers × 4096, bfloat16; ~70 s to write): on 2026-11-30 a quarter's phase
    # took 40.4 s with the H200 busy 0.59, ~0.59 s a group against ~0.35 s of fits, as if each group's read and
    # tables took twice its fits and 2 in flight could not hide them, ~2.5 min
    mkdir -p "$WORK"
    timeout 240 $PY perf/probe_phase.py --pairs quarter --languages 2 --d-model 4096 --on-disk bfloat16 --repeat 3 \
        --workers 2,3,4 --tmp "$WORK" 2>&1 | tee "$OUT/probe-workers.txt"
    rm -rf "${WORK:?}"/*
    ;;
probe-ab)
    # the probe phase of this tree and of .gpu/before's (`before REV`), in turns on one store of one language's 4
    # groups at a quarter's size (1,796 items × 33 layers × 4096, bfloat16, written once, ~35 s), 2 rounds each: the
    # solvers' reads back (one an iteration since 2026-12-01, ~3 a group's iteration before) against REV's, ~2.5 min;
    # PROBE_PAIRS and PROBE_D make it small enough to try here
    [ -f .gpu/before/REV ] || { echo "no .gpu/before: run 'bash perf/gpu_check.sh before REV' here"; exit 2; }
    mkdir -p "$WORK"
    timeout 120 $PY - "$WORK/acts" "${PROBE_PAIRS:-898}" "${PROBE_D:-4096}" <<'EOF'
import sys
from pathlib import Path

sys.path.insert(0, "perf")
from probe_phase import on_disk, synthetic_store

on_disk(synthetic_store(int(sys.argv[2]), 33, int(sys.argv[3]), languages=1), Path(sys.argv[1]), "bfloat16")
EOF
    for name in after before-1 before-2 after-2; do
        tree=perf; [ "${name%%-*}" = before ] && tree=.gpu/before/perf
        say "$name ($tree): the probe phase on that store, 2 rounds"
        { echo "## $name"; timeout 100 $PY "$tree/probe_phase.py" --acts "$WORK/acts" --repeat 2 --tmp "$WORK" 2>&1; } \
            | tee -a "$OUT/probe-ab.txt"
    done
    rm -rf "${WORK:?}"/*
    ;;
wait)
    # what a thread waiting on the device costs the host: CUDA's default event against babelprobe's blocking one
    # and a synchronising read (perf/event_wait.py: the waiting thread's CPU per second of waiting, the driver calls
    # beside it), then the same with the context's scheduling flag set to blocking (a process of its own: the flag
    # is set before the context is made), ~30 s
    timeout 60 $PY perf/event_wait.py 2>&1 | tee "$OUT/event-wait.txt"
    timeout 60 $PY perf/event_wait.py --context-flag blocking 2>&1 | tee -a "$OUT/event-wait.txt"
    ;;
matmul)
    # the host cost of a matmul shape not seen before (a prefix tree's passes each have their own M), ~30 s
    timeout 120 $PY perf/matmul_shapes.py --device cuda 2>&1 | tee "$OUT/matmul-shapes.txt"
    ;;
ab)
    # the current tree and an earlier commit's (.gpu/before, from `before REV`), in turn on the same GPU
    [ -f .gpu/before/REV ] || { echo "no .gpu/before: run 'bash perf/gpu_check.sh before REV' here"; exit 2; }
    # in the order after, before, before, after: the first run on a fresh machine pays the first touch of the
    # page cache its store fills (2026-11-29: direct's system time 0.47 ms/pair in the first run, 0.32 in the second)
    for name in after before-1 before-2 after-2; do
        tree=perf; [ "${name%%-*}" = before ] && tree=.gpu/before/perf
        say "$name ($tree): the workflow at 9,180 pairs, no floors"
        PERF=$tree step "$name" 100 --pairs 135 --no-floors --probe-layers 0 --store-dtype bfloat16
        gather "$name" ab
    done
    ;;
segments)
    # the CUDA caching allocator as it is and with expandable segments (PYTORCH_CUDA_ALLOC_CONF), in turns: the phases'
    # lines and tables count its cudaMalloc/cudaFree calls and retries (a cudaFree waits for the device), ~3 min
    for name in plain-1 expandable-1 expandable-2 plain-2; do
        conf=""; [ "${name%%-*}" = expandable ] && conf="expandable_segments:True"
        say "$name (PYTORCH_CUDA_ALLOC_CONF=$conf): the workflow at 9,180 pairs, no floors"
        PYTORCH_CUDA_ALLOC_CONF="$conf" step "segments-$name" 100 --pairs 135 --no-floors --probe-layers 0 \
            --store-dtype bfloat16
        gather "segments-$name" segments
    done
    ;;
budgets)
    # babelprobe's default budget against the one these steps use, in turns (4096, 16384, 16384, 4096)
    for name in 4096-1 16384-1 16384-2 4096-2; do
        say "budget ${name%%-*}: the workflow at 9,180 pairs, no floors"
        step "budget-$name" 100 --pairs 135 --no-floors --probe-layers 0 --store-dtype bfloat16 \
            --batch-tokens "${name%%-*}"
        gather "budget-$name" budgets
    done
    ;;
floors)
    say "A: the workflow at 9,180 pairs with every floor"
    step floors-135 240 --pairs 135 --sweep-tokens 100000 --store-dtype bfloat16
    ;;
tests)
    # the engine's numbers on the GPU, never checked there before 2026-11-30: the family suite's model checks
    # (extraction through hf, direct in plain batches and as a prefix tree, meta's tree, compare's one pass; eager
    # attention and SDPA) with babelprobe on CUDA in float32 against HF's forward on the CPU (tests/families.py
    # DEVICE; the image has no nnsight or transformer_lens), and their passes' reads back of device values (none
    # allowed: HostReads), then the CUDA-only tests, ~1-2 min
    BABELPROBE_TEST_DEVICE=cuda timeout 300 $PY -m pytest -q -p no:cacheprovider tests/test_families.py \
        -k "extract_equals and not nnsight and not transformer_lens or direct_scores or meta_answer or one_pass or wait_for_no_value" \
        2>&1 | tail -n 40 | tee "$OUT/tests.txt"
    timeout 200 $PY -m pytest -q -p no:cacheprovider tests/test_probe_sweep.py tests/test_perf_workflow.py tests/test_sae_train.py \
        -k "cuda or gpu" 2>&1 | tail -n 15 | tee -a "$OUT/tests.txt"
    ;;
pages)
    # the store's pages kept in the page cache (babelprobe), dropped after each shard's fsync, or kept without the
    # fsyncs (what waiting for the disk costs): 12 GB of 8B shards written by the background writer's threads and
    # read back, each way twice (perf/store_pages.py; on the 2-core development machine dropping wrote 2.5-4x faster
    # and read 2.5-6x slower), ~2-3 min
    mkdir -p "$WORK"
    timeout 240 $PY perf/store_pages.py --gb 12 --modes kept,dropped,unsynced --rounds 6 --tmp "$WORK" 2>&1 \
        | tee "$OUT/store-pages.txt"
    rm -rf "${WORK:?}"/*
    # a probe group's reads when a text is stored once (half its rows in another group's chunks) against every
    # row stored: one language at a quarter's size, 8B width, pages cached and dropped (perf/store_reads.py)
    timeout 150 $PY perf/store_reads.py --pairs quarter --languages 1 --rounds 2 --tmp "$WORK" 2>&1 \
        | tee "$OUT/store-reads.txt"
    rm -rf "${WORK:?}"/*
    ;;
solver)
    say "B: the probe solver at 20,000 x 33 x 4096"
    timeout 90 $PY perf/probe_solver.py --gpu --threads 16 2>&1 | tee "$OUT/probe-solver-gpu.txt"
    ;;
*)
    echo "unknown step $STEP: prepare, before, run, quarter, look, profiles, probe, workers, matmul, wait, tests, pages, ab, segments, budgets, floors or solver"; exit 2
    ;;
esac
say "done"
