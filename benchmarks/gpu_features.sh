#!/usr/bin/env bash
# The bundled library's production-feature paths (cases/features.py: soft cap, sinks, ALiBi,
# fp8 KV caches, multi-token decode, custom masks) on an NVIDIA GPU, in one device call:
# the nvidia build, the ci profile over every family, the features family at the full
# profile, and the features family with every guard off.
#
# Run from the repo root on the GPU machine (no network, nothing to carry):
#   bash benchmarks/gpu_features.sh [STEP ...]
# Steps (default: all, in this order; each is skipped once DEADLINE_S is near):
#   build   python -m kernels.build --platform nvidia
#   ci      harness check --target bundled --profile ci (every family)        -> ci.jsonl
#   full    the same, --family features --profile full                        -> features_full.jsonl
#   off     --family features --profile full --disable-guards all             -> features_guards_off.jsonl
# then a summary per table (benchmarks/gpu_summary.py): outcome counts by route x family and
# each failing class (route, family, outcome) with one case id -> $OUT/summary.md.
# Knobs: WORKERS (8: 16 time-sliced workers are slower than 8 without MPS), DEADLINE_S (540),
# OUT (./gpu_out). No MPS: a fatal fault in one MPS client reaches the others, and the
# guards-off step faults on purpose.
set -uo pipefail
START=$(date +%s)
OUT=${OUT:-$PWD/gpu_out}
WORKERS=${WORKERS:-8}
DEADLINE_S=${DEADLINE_S:-540}
RES=/tmp/features_res
mkdir -p "$OUT" "$RES"
LOG="$OUT/log.txt"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH="/usr/local/cuda/bin:$PATH"

source "$(dirname "${BASH_SOURCE[0]}")/gpu_common.sh"   # say, left, timed
CHECK="python3 -m harness check --target bundled --reruns 0 -n $WORKERS"

step_build() {
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    nvcc --version | tail -1
    python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
    git log -1 --format='commit %h %s' 2>/dev/null
  } >>"$LOG" 2>&1
  timed 20 python3 -m kernels.build --platform nvidia
}
step_ci() {
  timed 60 $CHECK --profile ci --results "$RES/ci.jsonl" --summary-json "$OUT/ci_summary.json"
}
step_full() {
  timed 40 $CHECK --profile full --family features --results "$RES/features_full.jsonl"
}
step_off() {
  timed 40 $CHECK --profile full --family features --disable-guards all \
      --results "$RES/features_guards_off.jsonl"
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(build ci full off)
for s in "${steps[@]}"; do say "== $s"; "step_$s"; done

# One summary per table (gpu_summary.py merges the tables of one target), then the tables.
: > "$OUT/summary.md"
for t in "$RES"/*.jsonl; do
  [ -s "$t" ] || continue
  d=$(mktemp -d); cp "$t" "$d/"
  { echo "# $(basename "$t" .jsonl)"; echo
    python3 benchmarks/gpu_summary.py "$d" "$d" >/dev/null 2>>"$LOG"
    sed 's/^#/##/' "$d/summary.md"; echo; } >>"$OUT/summary.md"
  rm -rf "$d"
done
python3 - "$RES" >>"$LOG" 2>&1 <<'EOF'
import collections, json, sys, pathlib
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.jsonl")):
    rows = [json.loads(l) for l in p.open()]
    bad = [r for r in rows if not r.get("pass")]
    print(f"{p.name}: {len(rows)} rows, {len(bad)} failing;",
          dict(collections.Counter(r["outcome"] for r in rows)))
    slow = sorted(rows, key=lambda r: -(r.get("duration_s") or 0))[:5]
    print("   slowest:", ", ".join(f"{r['case_id']} {r.get('duration_s') or 0:.1f} s" for r in slow))
EOF
for t in "$RES"/*.jsonl; do gzip -c "$t" > "$OUT/$(basename "$t").gz"; done
say "done"
exit 0
