#!/usr/bin/env bash
# The bundled library on an NVIDIA GPU, in one device call: build, the GPU tests (CUDA-graph
# capture and replay, the sanitizer), throughput with and without MPS, the full profile, the
# captured-graph guards-off rows, the sanitizer on guards-off crash rows, the past-2^31 case's
# build time, and `make bench`.
#
# Run from the repo root on the GPU machine (no network; .whl/ may carry pytest-rerunfailures):
#   bash benchmarks/gpu_bundled.sh [STEP ...]
# Steps (default: all, in this order; each is skipped once DEADLINE_S is near):
#   build tests throughput full graphs offset sanitizer bench
# and, only when named: profiles (the ci profile at 1-16 workers, the full at 4 and 8), profile (cProfile of every process of a 16-worker valid run), heavy
# (the full profile's long_kv_full cases in one process, stage by stage) and chain (when each
# process of a check reaches each start-up step, at 4 and 16 workers).
# Knobs: WORKERS (16), THRU_WORKERS (1 4 8 16), DEADLINE_S (560), OUT (./gpu_out), MPS (0: throughput without MPS only),
# BENCH_ONLY (bench sections, comma-separated; all).
# Writes log.txt, the tables and reports to $OUT.
set -uo pipefail
START=$(date +%s)
OUT=${OUT:-$PWD/gpu_out}
WORKERS=${WORKERS:-16}
DEADLINE_S=${DEADLINE_S:-560}
RES=/tmp/bundled_res
mkdir -p "$OUT" "$RES"
LOG="$OUT/log.txt"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH="/usr/local/cuda/bin:$PATH"
if ls .whl/pytest_rerunfailures-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/pytest_rerunfailures-*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

source "$(dirname "${BASH_SOURCE[0]}")/gpu_common.sh"   # say, left, timed
CHECK="python3 -m harness check --reruns 0"

mps_on() {   # one shared GPU context for every worker: no time-slicing between processes
  command -v nvidia-cuda-mps-control >/dev/null || { say "mps: nvidia-cuda-mps-control not found"; return 1; }
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p /tmp/mps /tmp/mps-log
  nvidia-cuda-mps-control -d && sleep 1 && say "mps: on"
}
mps_off() {
  [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] || return 0
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1; sleep 1
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; say "mps: off"
}

step_build() {
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
  } >>"$LOG" 2>&1
  timed 20 python3 -m kernels.build
}
step_tests() {
  timed 60 python3 -m pytest tests/test_draws.py tests/test_kernels_gpu.py tests/test_graph_capture.py \
      tests/test_host_reference.py tests/test_builders.py -q -p no:cacheprovider
}
step_sanitizer() {
  mps_off   # compute-sanitizer does not run under MPS
  timed 60 python3 -m pytest tests/test_sanitizer.py -q -p no:cacheprovider -k names_the_library_kernel
  timed 40 $CHECK --target bundled --disable-guards partial_state_needs_lse --family graph_replan \
      --case-id partial_state_without_lse --sanitizer memcheck -n 1 --results "$OUT/sanitizer.jsonl" \
      --html "$OUT/sanitizer.html"
  timed 40 $CHECK --target bundled --disable-guards gqa_divisible --family gqa \
      --case-id fa2.single_prefill/gqa.kv0/bf16-d128-h8x0-nolse --sanitizer memcheck -n 1 \
      --results "$OUT/sanitizer_kv0.jsonl"
}
# timeline RESULTS START: when each worker's rows came (benchmarks/timeline.py), into the log.
timeline() { python3 -m benchmarks.timeline "$1" --start "$2" >>"$LOG" 2>&1; }
# The ci profile's valid family (577 cases), --repeat 1, at THRU_WORKERS without MPS,
# each with its timeline; with MPS=1 also at 16, 8, 4, 1 with it (MPS then stays on for the
# steps after).
THRU="--profile ci --family valid --repeat 1"
step_throughput() {
  local t0
  for n in ${THRU_WORKERS:-1 4 8 16}; do
    t0=$(date +%s.%N)
    timed 40 $CHECK $THRU -n "$n" --results "$RES/valid-n$n.jsonl" && timeline "$RES/valid-n$n.jsonl" "$t0"
  done
  [ "${MPS:-0}" = 1 ] && mps_on || return 0
  for n in 16 8 4 1; do timed 40 $CHECK $THRU -n "$n" --results "$RES/valid-mps-n$n.jsonl"; done
}
step_profiles() {   # whole-run throughput: the ci profile at 1, 4, 8, 16 workers, the full at 4, 8
  local t0
  for spec in "ci 1" "ci 4" "ci 8" "ci 16" "full 4" "full 8"; do
    set -- $spec
    t0=$(date +%s.%N)
    timed 40 $CHECK --profile "$1" -n "$2" --results "$RES/$1-n$2.jsonl" && timeline "$RES/$1-n$2.jsonl" "$t0"
  done
}
step_mps() {   # the ci profile at 8 and 16 workers under MPS (one shared context), for comparison
  local t0
  mps_on || return 0
  for n in 8 16; do
    t0=$(date +%s.%N)
    timed 40 $CHECK --profile ci -n "$n" --results "$RES/ci-mps-n$n.jsonl" && timeline "$RES/ci-mps-n$n.jsonl" "$t0"
  done
  mps_off
}
step_full() {   # the full profile (the GPU's default), --repeat 2 (the GPU's default)
  local t0; t0=$(date +%s.%N)
  timed 120 $CHECK -n "$WORKERS" --html "$OUT/full.html" --markdown "$OUT/full.md" \
      --results "$RES/full.jsonl"
  timeline "$RES/full.jsonl" "$t0"
}
step_graphs() {   # the captured graph's merge past the smaller batch, with its guard off
  timed 20 $CHECK --family graph_replan --disable-guards merge_live_rows -n 4 \
      --results "$OUT/graphs_merge_live_rows.jsonl"
  timed 20 $CHECK --family graph_replan --disable-guards graph_capacity -n 4 \
      --results "$OUT/graphs_graph_capacity.jsonl"
}
step_offset() {   # the past-2^31 cases alone: the row's duration is the build and the run
  timed 30 $CHECK --profile full --family scale --case-id offset_past_2_31 -n 4 --repeat 1 \
      --results "$OUT/offset.jsonl"
}
step_profile() {   # where 16 workers' time goes: cProfile per process
  timed 40 python3 -m benchmarks.engine_profile -n "$WORKERS" --family valid --top 30 \
      --profile ci --repeat 1
}
step_heavy() {   # each long_kv_full case's stages, one process, streamed as they finish
  timed 60 python3 -m benchmarks.bare_loop --family scale --case-id long_kv_full --per-case
  timed 30 python3 -m benchmarks.bare_loop --family scale --case-id offset_past_2_31 --per-case
}
step_chain() {   # the start-up chain of a real check: parent, controller, workers
  for n in 4 16; do
    timed 30 python3 -m benchmarks.startup_chain -n "$n" --family valid --profile ci --repeat 1
  done
}
step_bench() {   # BENCH_ONLY: the sections (all)
  timed 120 python3 -m benchmarks.bench --quick --out "$OUT/bench" ${BENCH_ONLY:+--only $BENCH_ONLY}
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(build tests throughput full graphs offset sanitizer bench)
for s in "${steps[@]}"; do say "== $s"; "step_$s"; done
mps_off
python3 - "$RES" >>"$LOG" 2>&1 <<'EOF'
import json, sys, pathlib
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.jsonl")):
    rows = [json.loads(l) for l in p.open()]
    bad = [r for r in rows if not r.get("pass")]
    print(f"{p.name}: {len(rows)} rows, {len(bad)} failing")
    for r in bad[:10]:
        print("  ", r["outcome"], r["case_id"], r["message"][:200])
    slow = sorted(rows, key=lambda r: -(r.get("duration_s") or 0))[:8]
    print("   slowest:", ", ".join(f"{r['case_id']} {r.get('duration_s') or 0:.1f} s" for r in slow))
EOF
cp "$RES"/full.jsonl "$OUT"/ 2>/dev/null
say "done"
exit 0
