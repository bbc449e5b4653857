#!/usr/bin/env bash
# The bundled library on an NVIDIA GPU: build, the GPU kernel tests (CUDA-graph capture and
# replay after a re-plan included), `make check` over every family, and the guards-off run.
# Run from the repo root on the GPU machine; .whl/ carries pytest-rerunfailures.
# Writes its tables, reports and logs to $OUT (default ./gpu_out).
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
WORKERS=${WORKERS:-8}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ls .whl/pytest_rerunfailures-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/pytest_rerunfailures-*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
t() { local s=$(date +%s.%N); "$@"; local rc=$?; echo "[$(printf '%.1f' "$(echo "$(date +%s.%N) - $s" | bc)") s, rc $rc] $*"; return $rc; }
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
  t python3 -m kernels.build
  t python3 -m pytest tests/test_kernels_gpu.py -q -p no:cacheprovider
  t make check ARGS="-n $WORKERS"
  t python3 -m harness check -n "$WORKERS" --disable-guards all --case-timeout 60 \
      --results "$OUT/before.jsonl" --family strided,misplanned,gqa,graph_replan,restaged_indptr,small_head,mixed_batch
} 2>&1 | tee "$OUT/log.txt"
cp results/*.jsonl reports/out/* "$OUT"/ 2>/dev/null
exit 0
