#!/usr/bin/env bash
# FlagGems' Triton attention (--target flaggems) on an NVIDIA GPU, then, as time allows, the
# bundled library (--repeat 2) and torch SDPA for comparison on the same machine.
#
# Here, once: copy the wheels into the git-ignored .cache/wheels/:
#   flag_gems-*.whl (py3-none-any), and the two it imports that the GPU image lacks:
#   sqlalchemy-*.whl and greenlet-*.whl (cp312, manylinux x86_64)
# There (repo root, .cache/wheels carried, no network):
#   bash benchmarks/gpu_flaggems.sh
#
# Steps, each under what is left of DEADLINE_S (default 420 s, inside the machine's
# 10 minutes a command):
#   setup     pip install --no-deps the wheels into $SITE; versions; import the target
#   smoke     `harness repro` of two cases; stops here when the target cannot load or the
#             adapter errs (harness_error), so a broken setup costs seconds, not minutes
#   flaggems  every family, --target flaggems -n $WORKERS   -> $OUT/flaggems-sm_90.jsonl
#   bundled   kernels.build, every family, --repeat 2        -> $OUT/bundled-sm_90.jsonl
#   sdpa      every family, --target torch-sdpa              -> $OUT/sdpa-sm_90.jsonl
#   summary   outcome counts per target x route x family, every failing-row class with
#             one case id, skip reasons                      -> $OUT/summary.md
#
# Triton compiles FlagGems' kernel per head count, head_dim, scale, window, page size and
# block-table width (they are constexpr), so most cases pay a first compile of seconds:
# CASE_TIMEOUT (default 120 s) keeps a compile from reading as a hang.
# Knobs: DEADLINE_S, WORKERS (8), CASE_TIMEOUT (120), FAMILIES (comma list, all), SITE,
# STEPS (default "flaggems bundled sdpa"), PY (python3: the image's own torch and Triton).
set -uo pipefail

START=$(date +%s)
DEADLINE_S=${DEADLINE_S:-420}
WORKERS=${WORKERS:-8}
CASE_TIMEOUT=${CASE_TIMEOUT:-120}
FAMILIES=${FAMILIES:-}
STEPS=${STEPS:-flaggems bundled sdpa}
SITE=${SITE:-/tmp/fg_site}
PY=${PY:-python3}
OUT=${OUT:-$PWD/gpu_out}
WHEELS=.cache/wheels

cd "$(dirname "$0")/.."
mkdir -p "$OUT"
LOG="$OUT/log.txt"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"

source "$(dirname "${BASH_SOURCE[0]}")/gpu_common.sh"   # say, left, timed
family_opt() { [ -n "$FAMILIES" ] && echo "--family $FAMILIES"; }

setup() {
  ls "$WHEELS"/flag_gems-*.whl >/dev/null 2>&1 || { say "setup: no $WHEELS/flag_gems-*.whl"; return 1; }
  rm -rf "$SITE" && mkdir -p "$SITE"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
    "$WHEELS"/*.whl >>"$LOG" 2>&1 || { say "setup: pip install failed"; return 1; }
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    $PY - <<'EOF'
import sys, time
import torch, triton
print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__,
      "device", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0))
t0 = time.perf_counter()
from harness.targets import load_target
t = load_target("flaggems")
print(f"flaggems {t.version()} via {t.where} ({t.module.__file__}), loaded in "
      f"{time.perf_counter() - t0:.1f} s; routes: {' '.join(t.routes)}")
EOF
  } >>"$LOG" 2>&1
  local rc=$?
  say "setup: rc=$rc"
  return $rc
}

smoke() {   # the adapter end to end on two cases; harness_error or no row stops the run
  local bad=0 id
  for id in 'fg.paged_prefill/valid.grid/bf16-d256-h4x1-p1-nhd-tuple-b7-causal-w31' \
            'fg.mixed_batch/mixed_batch.decodes3/bf16-d64-h4x2-p16-b5'; do
    local row
    row=$(timeout 180 $PY -m harness repro "$id" --target flaggems --json 2>>"$LOG" | grep '^{' | tail -1)
    say "smoke: $id -> $(echo "$row" | $PY -c 'import json,sys; r=json.loads(sys.stdin.read() or "{}"); print(r.get("outcome"), round(r.get("duration_s") or 0, 1), "s", (r.get("message") or "")[:300])')"
    case "$row" in ""|*'"harness_error"'*) bad=1 ;; esac
  done
  return $bad
}

run_check() {   # run_check TARGET RESULTS RESERVE [extra args]: leaves RESERVE s for what follows
  local target=$1 results=$2 reserve=$3; shift 3
  local budget; budget=$(( $(left) - reserve ))
  if [ "$budget" -lt 30 ]; then say "$target: no time left, skipped"; return 0; fi
  local t0; t0=$(date +%s)
  say "$target: check, $budget s budget: $*"
  timeout --signal=INT --kill-after=20 "$budget" $PY -m harness check --target "$target" \
    -n "$WORKERS" --case-timeout "$CASE_TIMEOUT" --results "$results" "$@" >>"$LOG" 2>&1
  local rc=$?
  say "$target: rc=$rc, wall $(( $(date +%s) - t0 )) s, $(wc -l < "$results" 2>/dev/null || echo 0) rows"
}

step_flaggems() { run_check flaggems "$OUT/flaggems-sm_90.jsonl" 90 $(family_opt); }

step_bundled() {
  local t0; t0=$(date +%s)
  timeout 120 $PY -m kernels.build >>"$LOG" 2>&1
  say "bundled: kernels.build rc=$?, $(( $(date +%s) - t0 )) s"
  run_check bundled "$OUT/bundled-sm_90.jsonl" 40 --repeat 2 $(family_opt)
}

step_sdpa() { run_check torch-sdpa "$OUT/sdpa-sm_90.jsonl" 10 $(family_opt); }

summary() {
  $PY benchmarks/gpu_summary.py "$OUT" "$OUT" >>"$LOG" 2>&1
  say "summary: rc=$? -> $OUT/summary.md"
}

rc=0
if setup && smoke; then
  for s in $STEPS; do "step_$s"; done
else
  say "stopped after setup/smoke (see $LOG)"; rc=1
fi
summary
tail -n 400 "$LOG" | grep -v '^\s*$' | tail -n 150
exit $rc
