#!/usr/bin/env bash
# Every case family against --target flashinfer and --target torch-sdpa on an NVIDIA GPU.
#
# Here, once:  bash benchmarks/pack_flashinfer.sh        (fills the git-ignored .whl/, ~22 MiB)
# There (repo root, .whl carried, no network):
#   bash benchmarks/gpu_flashinfer.sh [PHASE ...]
#
# Phases (default: setup sdpa prewarm fi summary):
#   setup     unpack .whl/ into $SITE, import flashinfer, record versions and routes
#   sdpa      every family, --target torch-sdpa            -> results/gpu/sdpa.jsonl
#   prewarm   compile FlashInfer's JIT modules: one case per (route, dtype, head dims,
#             window) through `harness repro`, PREWARM_PROCS at a time, fa3 first.
#             The families need ~90 modules with fa3 (~60 without); a fa2 batch-prefill
#             module is 10 nvcc objects, fa3 ones are heavier: expect tens of minutes
#             of 16-core compile in all, so run prewarm in more than one call or set
#             FI_ROUTES to fa2 routes first
#   fi        every family, --target flashinfer            -> results/gpu/flashinfer.jsonl
#             (resumes: cases that already have a row are not run again)
#   summary   outcome counts per target x route x family, every class of failing row
#             with one example case id                     -> $OUT/summary.md, counts.csv
#
# The machine's limit is 10 minutes a command: the script stops starting work at
# DEADLINE_S (default 540 s) and always ends with `summary`, so a phase cut short is
# continued by the next call (rows are kept; the JIT cache lives in $FI_WS, the
# unpacked packages in $SITE, both kept while the machine stays warm). A cold call
# only re-unpacks (~20 s) and recompiles what it needs.
#
# Knobs: FAMILIES (comma list, all), FI_ROUTES (comma list of flashinfer routes, all),
# HEAD_DIMS (comma list: only cases at these head dims, plus every case of the families in
# ANY_DIM_FAMILIES; written once to results/gpu/cases.json, which prewarm and fi then run,
# so the JIT compiles only their modules), PROFILE (full),
# WORKERS (xdist workers, 8), PREWARM_PROCS (8), MAX_JOBS (nvcc jobs per module),
# CASE_TIMEOUT (s per case, 600),
# DEADLINE_S (540), SITE (/tmp/fi_site), FI_WS (/tmp/fi_ws), CUDA_HOME.
set -uo pipefail

START=$(date +%s)
DEADLINE_S=${DEADLINE_S:-540}
WORKERS=${WORKERS:-8}
PREWARM_PROCS=${PREWARM_PROCS:-8}
CASE_TIMEOUT=${CASE_TIMEOUT:-600}
FAMILIES=${FAMILIES:-}
FI_ROUTES=${FI_ROUTES:-}
HEAD_DIMS=${HEAD_DIMS:-}
ANY_DIM_FAMILIES=${ANY_DIM_FAMILIES:-}
PROFILE=${PROFILE:-full}
SITE=${SITE:-/tmp/fi_site}
OUT=${OUT:-$PWD/gpu_out}
RES=results/gpu

export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH="$CUDA_HOME/bin:$PATH"
export FLASHINFER_NO_DOWNLOAD=1
export FLASHINFER_WORKSPACE_BASE=${FI_WS:-/tmp/fi_ws}
export PYTHONUNBUFFERED=1
# nvcc jobs per JIT module: with PREWARM_PROCS modules (or WORKERS xdist workers)
# building at once this keeps ~1 job a core, and nvcc's memory (GBs per cutlass
# fa3 object) inside the machine's 128 GiB.
export MAX_JOBS=${MAX_JOBS:-$(( ($(nproc) + PREWARM_PROCS - 1) / PREWARM_PROCS ))}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

cd "$(dirname "$0")/.."
mkdir -p "$OUT" "$RES"
LOG="$OUT/log.txt"
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"

source "$(dirname "${BASH_SOURCE[0]}")/gpu_common.sh"   # say, left, timed
family_opt() { [ -n "$FAMILIES" ] && echo "--family $FAMILIES"; }
route_opt() { [ -n "$FI_ROUTES" ] && echo "--route $FI_ROUTES"; }
CASES_FILE=$RES/cases.json

select_cases() {   # HEAD_DIMS set: the selection as a cases file (kept for later calls)
  [ -z "$HEAD_DIMS" ] && { rm -f "$CASES_FILE"; return 0; }
  FAMILIES=$FAMILIES FI_ROUTES=$FI_ROUTES HEAD_DIMS=$HEAD_DIMS ANY_DIM=$ANY_DIM_FAMILIES \
    PROFILE=$PROFILE CASES_FILE=$CASES_FILE python3 - >>"$LOG" 2>&1 <<'EOF'
import json, os
from cases import generate
from harness.targets.flashinfer import ROUTES_FA2, ROUTES_FA3

split = lambda name: [x for x in os.environ.get(name, "").split(",") if x]
routes = split("FI_ROUTES") or list(ROUTES_FA2 + ROUTES_FA3)
dims, any_dim = {int(d) for d in split("HEAD_DIMS")}, set(split("ANY_DIM"))
picked = [c for c in generate(split("FAMILIES") or None, routes, profile=os.environ["PROFILE"])
          if c.params.get("dtype", "bf16") != "fp32"
          and (c.family in any_dim or c.params.get("head_dim") in dims)]
with open(os.environ["CASES_FILE"], "w") as f:
    json.dump([c.to_json() for c in picked], f)
print(f"select: {len(picked)} cases (head dims {sorted(dims)}, any dim: {sorted(any_dim)})")
EOF
  say "select: rc=$? -> $CASES_FILE"
}
cases_opt() { [ -s "$CASES_FILE" ] && echo "--cases-file $CASES_FILE"; }

ensure_site() {   # .whl/ unpacked into $SITE once per machine (and again when .whl/ changes)
  local stamp; stamp=$(ls -l .whl | md5sum)
  [ -f "$SITE/.packed" ] && [ "$(cat "$SITE/.packed")" = "$stamp" ] && return 0
  say "setup: unpacking .whl/ into $SITE"
  rm -rf "$SITE" && mkdir -p "$SITE"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl >>"$LOG" 2>&1 || { say "setup: pip install failed"; return 1; }
  tar -xJf .whl/flashinfer_python-*.tar.xz -C "$SITE" || { say "setup: untar failed"; return 1; }
  echo "$stamp" > "$SITE/.packed"
}

phase_setup() {
  ensure_site || return 1
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nvcc --version | tail -2
    command -v ninja || echo "ninja: not on PATH"
    python3 - <<'EOF'
import torch, flashinfer
from harness.targets import load_target
print("python", __import__("sys").version.split()[0], "torch", torch.__version__,
      "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0),
      "capability", torch.cuda.get_device_capability(0))
print("flashinfer", flashinfer.__version__, "at", flashinfer.__file__)
for name in ("flashinfer", "torch-sdpa"):
    t = load_target(name)
    print(name, t.version(), "routes:", " ".join(t.routes))
    notes = getattr(t, "probe_notes", None)
    if notes:
        print("  backends absent:", notes)
EOF
  } >>"$LOG" 2>&1
  local rc=$?
  say "setup: rc=$rc"
  return $rc
}

run_check() {   # run_check TARGET RESULTS [extra args]: one check under the deadline
  local target=$1 results=$2; shift 2
  local budget; budget=$(left)
  if [ "$budget" -lt 30 ]; then say "$target: no time left, skipped"; return 0; fi
  local resume=""; [ -s "$results" ] && resume="--resume"
  say "$target: check ($budget s left) $resume $*"
  timeout --signal=INT --kill-after=20 "$budget" python3 -m harness check --target "$target" \
    -n "$WORKERS" --reruns 0 --case-timeout "$CASE_TIMEOUT" --results "$results" $resume "$@" \
    >>"$LOG" 2>&1
  say "$target: check rc=$? ($(wc -l < "$results" 2>/dev/null || echo 0) rows in $results)"
}

phase_sdpa() { run_check torch-sdpa "$RES/sdpa.jsonl" $(family_opt); }

phase_fi() {
  if [ -s "$CASES_FILE" ]; then run_check flashinfer "$RES/flashinfer.jsonl" $(cases_opt)
  else run_check flashinfer "$RES/flashinfer.jsonl" $(family_opt) $(route_opt); fi
}

phase_prewarm() {
  local budget; budget=$(left)
  [ "$budget" -lt 60 ] && { say "prewarm: no time left, skipped"; return 0; }
  say "prewarm: $PREWARM_PROCS at a time, $budget s left"
  PREWARM_PROCS=$PREWARM_PROCS BUDGET=$budget FAMILIES=$FAMILIES FI_ROUTES=$FI_ROUTES \
    CASES_FILE=$CASES_FILE python3 - >>"$LOG" 2>&1 <<'EOF'
import concurrent.futures as cf, json, os, subprocess, sys, time
from harness.model.case import Case
from harness.targets import load_target

start, budget = time.time(), float(os.environ["BUDGET"]) - 30
fams = [f for f in os.environ.get("FAMILIES", "").split(",") if f] or None
routes = {r for r in os.environ.get("FI_ROUTES", "").split(",") if r}
cases_file = os.environ["CASES_FILE"]
from_file = os.path.exists(cases_file) and os.path.getsize(cases_file) > 0
if from_file:
    with open(cases_file) as f:
        selection = [Case.from_json(c) for c in json.load(f)]
else:
    selection = load_target("flashinfer").cases(fams)
picked, plain = {}, {}
caps = load_target("flashinfer").capabilities
for case in selection:
    p = case.params
    if routes and case.route not in routes or p.get("dtype", "bf16") == "fp32":
        continue
    if caps.lacks(case.op, p, case.requires):   # skipped before any kernel: compiles nothing
        continue
    d = p["head_dim"]
    # FlashInfer's JIT module is also keyed by the soft cap's presence and the KV dtype (the
    # features family's fp8 caches), and a multi-token decode runs the paged prefill module.
    key = (case.route, p.get("dtype", "bf16"), d, p.get("head_dim_vo") or d,
           p.get("window_left", -1) >= 0, bool(p.get("logits_soft_cap")),
           p.get("kv_dtype") or p.get("dtype", "bf16"), int(p.get("q_len_per_req", 1)) > 1)
    # A case that reaches the kernel compiles its module (repro's own case timeout would
    # kill a compile as a hang: it gets the whole budget); prefer one with no
    # adversarial twist (a refusal before the JIT would leave it uncompiled).
    is_plain = case.expect == "match" and not any(
        p.get(k) for k in ("scenario", "mismatch", "strided", "index_dtype", "malformed"))
    if key not in picked or (is_plain and not plain[key]):
        picked[key], plain[key] = case, is_plain
# fa3 modules take longest: start them first.
order = sorted(picked.values(), key=lambda c: ("fa3" not in c.route, c.route))
print(f"prewarm: {len(order)} module keys, one representative case each", flush=True)

def warm(case):
    left = budget - (time.time() - start)
    if left < 20:
        return case.id, "not started (deadline)", 0.0
    t0 = time.time()
    try:
        extra = ["--cases-file", cases_file] if from_file else []
        done = subprocess.run([sys.executable, "-m", "harness", "repro", case.id, "--target",
                               "flashinfer", "--json", "--case-timeout", str(int(left)), *extra],
                              capture_output=True, text=True, timeout=left)
        lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
        row = json.loads(lines[-1]) if lines else {}
        what = row.get("outcome") or f"rc {done.returncode}: {done.stderr.strip()[-200:]}"
    except subprocess.TimeoutExpired:
        what = "cut at the deadline"
    return case.id, what, time.time() - t0

with cf.ThreadPoolExecutor(int(os.environ["PREWARM_PROCS"])) as pool:
    for cid, what, secs in pool.map(warm, order):
        print(f"prewarm {secs:6.1f}s {what}: {cid}", flush=True)
EOF
  say "prewarm: rc=$?"
}

phase_summary() {
  python3 benchmarks/gpu_summary.py "$RES" "$OUT" >>"$LOG" 2>&1
  cp "$RES"/*.jsonl "$OUT"/ 2>/dev/null
  say "summary: $OUT/summary.md, counts.csv, $(ls "$RES" | tr '\n' ' ')"
}

phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(setup sdpa prewarm fi)
rc=0
for ph in "${phases[@]}"; do
  case "$ph" in
    setup) phase_setup || { rc=1; break; }; select_cases ;;
    sdpa|prewarm|fi) ensure_site || { rc=1; break; }
                     [ -n "$HEAD_DIMS" ] && [ ! -s "$CASES_FILE" ] && select_cases
                     "phase_$ph" ;;
    summary) ;;
    *) say "unknown phase $ph (setup sdpa prewarm fi summary)"; rc=2 ;;
  esac
done
phase_summary
exit $rc
