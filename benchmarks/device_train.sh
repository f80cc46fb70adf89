#!/usr/bin/env bash
# Issue 27's open GPU figures in one device call (sized from the 2026-12-04 warm-ups, 215 s and 42 s, to fit a
# 10-minute call): train.py against the compiled peer at batch 64 (review lengths) and at batch 256 with every row
# 128 tokens (the 40% MFU target), 200 steps each.
# Writes the JSON and tables under $OUT (the device tool's folder; else ./bench-out). torch.compile's cache is shared
# by the runs (TORCHINDUCTOR_CACHE_DIR): the first train.py and peer runs compile cold, the second ones show what the
# Train step's cache in its checkpoint folder saves a restarted job. Extra arguments go to every benchmark run
# (on CPU, to try the script: --model tiny --steps 20 --log-interval 5).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench-out}"
mkdir -p "$out"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$(mktemp -d)}"
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo cpu
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} | tee "$out/machine.txt"
python3 benchmarks/bench_train_peer.py --batch-sizes 64 --steps 200 --contenders train.py peer+compile \
    --json "$out/reviews-64.json" "$@" | tee "$out/reviews-64.txt"
python3 benchmarks/bench_train_peer.py --batch-sizes 256 --lengths full --steps 200 --contenders train.py peer+compile \
    --json "$out/full-256.json" "$@" | tee "$out/full-256.txt"
