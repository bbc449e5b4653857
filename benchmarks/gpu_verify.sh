#!/usr/bin/env bash
# One device call that re-checks this round's GPU claims (benchmarks/h200_results.md, 2026-12-03):
#   fg       FlagGems, every family (gpu_flaggems.sh's setup, smoke and check)
#   full16   the bundled full profile at --repeat 2 on 16 workers (heavy cases gated)
#   memcheck one FlagGems crash row and one corrupt row replayed under compute-sanitizer memcheck
#   scripts  standalone scripts of one FlagGems case per failing class kind, run with the
#            harness not importable
# There (repo root, .cache/wheels and .whl carried): OUT=... bash benchmarks/gpu_verify.sh
set -uo pipefail
START=$(date +%s)
DEADLINE_S=${DEADLINE_S:-560}
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
LOG="$OUT/verify.txt"
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1
source "$(dirname "${BASH_SOURCE[0]}")/gpu_common.sh"   # say, left, timed
if ls .whl/pytest_rerunfailures-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/pytest_rerunfailures-*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
CRASH='fg.batch_decode/misplanned.kv_lens_past_table/bf16-d128-h8x2-p16'
CORRUPT='fg.paged_prefill/misplanned.q_rows_fewer/bf16-d128-h8x2-p16-nolse'
WRONG='fg.batch_decode/valid.grid/fp16-d64-h4x1-p1-hnd-single-b7-full'
SILENT='fg.batch_decode/misplanned.block_table_one_past/bf16-d128-h8x2-p16-lib'

step_fg() { STEPS=flaggems DEADLINE_S=200 WORKERS=8 OUT="$OUT" bash benchmarks/gpu_flaggems.sh >/dev/null 2>&1; say "fg: rc=$?"; }
step_full16() {
  timed 20 python3 -m kernels.build
  timed 200 python3 -m harness check --reruns 0 -n 16 --repeat 2 --results "$OUT/full16.jsonl"
}
step_memcheck() {
  local id
  for id in "$CRASH" "$CORRUPT"; do
    timed 120 env PYTHONPATH="/tmp/fg_site:$PWD:${PYTHONPATH:-}" python3 -m harness check --target flaggems \
      --case-id "$id" --sanitizer memcheck --reruns 0 -n 0 --results "/tmp/mc-$RANDOM.jsonl"
  done
}
step_scripts() {
  local id n=0 dir=/tmp/scripts
  mkdir -p "$dir"
  for id in "$WRONG" "$SILENT" "$CORRUPT" "$CRASH"; do
    n=$((n + 1))
    PYTHONPATH="/tmp/fg_site:$PWD" python3 -m harness repro "$id" --target flaggems --standalone \
      -o "$dir/s$n.py" >>"$LOG" 2>&1
    ( cd "$dir" && PYTHONPATH=/tmp/fg_site timeout 120 python3 -I -c \
        "import sys; sys.path.insert(0, '/tmp/fg_site'); import importlib.util as u; assert u.find_spec('harness') is None; sys.argv=['s$n.py']; exec(compile(open('s$n.py').read(), 's$n.py', 'exec'))" \
        >"$dir/s$n.out" 2>&1; echo "rc=$?" >>"$dir/s$n.out" )
    say "script $id: $(grep -E 'VERDICT|rc=' "$dir/s$n.out" | tr '\n' ' ')"
  done
}
for s in ${STEPS:-fg full16 memcheck scripts}; do
  [ "$(left)" -gt 30 ] || { say "$s: no time left"; continue; }
  say "== $s"; "step_$s"
done
python3 - "$OUT" <<'PY' >>"$LOG" 2>&1
import collections, json, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.jsonl")):
    rows = [json.loads(l) for l in p.open() if l.startswith("{")]
    print(p.name, len(rows), dict(collections.Counter(r["outcome"] for r in rows)),
          "failing", sum(not r.get("pass") for r in rows))
PY
tail -n 60 "$LOG"
