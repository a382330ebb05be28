#!/usr/bin/env bash
# The GPU checks of issue 40, prepared for a session that is lent one GPU (an H100 or H200): about 9 minutes.
#
#   here, once:          bash perf/gpu_check.sh prepare      # the default tokenizer's files into .gpu/ (ignored)
#   on the GPU machine:  bash perf/gpu_check.sh run          # the device tool: carry [".gpu"], timeout_s 600
#
# The GPU machine has no gguf package, so the Llama shapes take the default model's tokenizer from .gpu/tokenizer
# (`prepare` copies the converted model's tokenizer files there, ~33 MB; .gpu/ is listed in .git/info/exclude
# and travels with `carry`). Every step has its own time limit, prints its table as it finishes and writes it to
# $OUT (what comes back), so a step cut off by its limit leaves the others' results. Expected durations on an
# H200 (from the simulated device's rates and the 2026-11-26 H200 run; an H100 is about 1.2x slower):
#
#   A  perf/workflow.py --pairs 135 (9,180 pairs), every floor (replay; bare forward at 5 budgets on 100k-token
#      samples; arithmetic), MFU, GPU busy                                                    ~3 min (limit 240 s)
#   B  perf/probe_solver.py --gpu: 20,000 items x 33 layers x 4096 dims on the GPU, against the CPU
#      (torch, 1 layer scaled) and scikit-learn (1 fold x 1 layer scaled)                     ~1.5 min (limit 120 s)
#   C  perf/workflow.py --pairs quarter (61,064 pairs, a quarter of XCOMPS), bfloat16 store (33 GB: float32's
#      66 GB would not fit the 64 GiB disk), no measured floors (A's ratios hold per token), end-to-end time,
#      MFU and GPU busy                                                                        ~4 min (limit 220 s)
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

OUT="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 BABELPROBE_CACHE=/tmp/babelprobe-cache TOKENIZERS_PARALLELISM=true
PY=python3
TOK=.gpu/tokenizer
START=$(date +%s)
say() { echo "== $(( $(date +%s) - START )) s: $*"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
[ -f "$TOK/tokenizer.json" ] || { echo "no $TOK: run 'bash perf/gpu_check.sh prepare' here and carry .gpu"; exit 2; }
COMMON=(--shape llama-3.1-8b --device cuda --tokenizer "$TOK" --batch-tokens 16384 --no-progress --tmp /tmp)

say "A: the workflow at 9,180 pairs with every floor"
timeout 240 $PY perf/workflow.py "${COMMON[@]}" --pairs 135 --sweep-tokens 100000 --store-dtype bfloat16 \
    --json "$OUT/workflow-135.json" --markdown "$OUT/workflow-135.md" 2>&1 | grep -v Warning
say "B: the probe solver at 20,000 x 33 x 4096"
timeout 120 $PY perf/probe_solver.py --gpu --threads 16 2>&1 | tee "$OUT/probe-solver-gpu.txt"
say "C: the workflow at a quarter of XCOMPS (61,064 pairs)"
timeout 220 $PY perf/workflow.py "${COMMON[@]}" --pairs quarter --no-floors --store-dtype bfloat16 \
    --json "$OUT/workflow-quarter.json" --markdown "$OUT/workflow-quarter.md" 2>&1 | grep -v Warning
say "done"
