# Shared by the benchmarks/gpu_*.sh device scripts (sourced, never run): the log line, the
# time left under DEADLINE_S, and a step run under that time. Needs START, DEADLINE_S, LOG.
say() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
left() { echo $(( DEADLINE_S - ($(date +%s) - START) )); }
# timed NEED_S CMD...: runs CMD under the time left, when at least NEED_S are left.
timed() {
  local need=$1; shift
  local budget; budget=$(left)
  if [ "$budget" -lt "$need" ]; then say "skipped (needs ${need}s, ${budget}s left): $*"; return 0; fi
  local s; s=$(date +%s%N)
  timeout --signal=INT --kill-after=15 "$budget" "$@" >>"$LOG" 2>&1
  local rc=$?
  local ms=$(( ($(date +%s%N) - s) / 1000000 ))
  say "$(( ms / 1000 )).$(( ms % 1000 / 100 )) s, rc $rc: $*"
  return $rc
}
