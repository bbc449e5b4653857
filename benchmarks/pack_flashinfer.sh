#!/usr/bin/env bash
# Packs FlashInfer for a GPU machine that has no package registry: run it HERE,
# then carry .whl/ (git-ignored) with the run that calls benchmarks/gpu_flashinfer.sh.
#
# What goes into .whl/ (Python 3.12, manylinux x86_64, the H200 image's interpreter):
#   flashinfer_python-<v>-attn.tar.xz  flashinfer-python unpacked, minus the kernel
#                                      sources attention never compiles, xz-compressed
#                                      (the wheel itself is ~101 MB, over the 64 MiB carry)
#   apache_tvm_ffi-*.whl               FlashInfer's JIT modules bind through TVM FFI
#   pytest_rerunfailures-*.whl         `python -m harness check` reruns failing rows with it
#
# Why only these: `import flashinfer` and its fa2/fa3 attention wrappers need, of
# its Requires-Dist, apache-tvm-ffi, click, einops, ninja, numpy, nvidia-ml-py,
# packaging, requests, tabulate, torch, tqdm and cuda-bindings; the image has all
# but apache-tvm-ffi (/work/.library/device/KINDS.md, "Python packages already
# there"). cuda-tile, nccl-extensions, nccl4py, nvidia-cudnn-frontend and
# nvidia-cutlass-dsl serve other features (cuTile, comm, cuDNN and CuTe-DSL
# backends), are imported lazily, and are left behind.
#
# What is dropped from the wheel: the subfolders of flashinfer/data/csrc (sampling,
# MoE, GEMM, comm, GDN, KDA, ... sources; ~380 MB). The attention JIT modules
# (single/batch prefill and decode, fa2 and fa3, cascade/merge) compile only the
# top-level files of data/csrc plus data/include, data/cutlass, data/cccl and
# data/spdlog, all kept; this script checks that no kept attention source
# includes a dropped folder.
set -euo pipefail

FI_VERSION=${FI_VERSION:-0.7.4}
TVM_FFI=${TVM_FFI:-"apache-tvm-ffi>=0.1.11,<0.2"}
RERUN=${RERUN:-"pytest-rerunfailures"}
LIMIT_MIB=${LIMIT_MIB:-60}

cd "$(git rev-parse --show-toplevel)"
# .gitignore names .whl/ already; a clone whose .git has no info/ folder yet gets one.
git check-ignore -q .whl/ || { mkdir -p "$(git rev-parse --git-dir)/info"; echo '/.whl/' >> "$(git rev-parse --git-dir)/info/exclude"; }
mkdir -p .whl
# The full flashinfer wheel (~101 MB) alone outgrows the carry limit: the tarball replaces it.
rm -f .whl/flashinfer_python-*.whl .whl/flashinfer_python-*.tar.xz .whl/apache_tvm_ffi-*.whl \
      .whl/pytest_rerunfailures-*.whl

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

download() {   # download DEST SPEC: one wheel for CPython 3.12 on manylinux x86_64
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$1" "$2"
}

download "$stage/wheel" "flashinfer-python==$FI_VERSION"
download .whl "$TVM_FFI"
download .whl "$RERUN"

mkdir -p "$stage/tree"
python3 -m zipfile -e "$stage"/wheel/flashinfer_python-*.whl "$stage/tree"
csrc="$stage/tree/flashinfer/data/csrc"
dropped=$(find "$csrc" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort)

# No kept attention source may include a folder that is about to go.
attn='^(single_|batch_prefill|batch_decode|cascade|flashinfer_cascade|page|flashinfer_page|pod|batch_pod|tvm_ffi_utils|batch_attention)'
bad=0
for f in $(find "$csrc" -maxdepth 1 -type f -printf '%f\n' | grep -E "$attn"); do
  for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$csrc/$f"); do
    top=${inc%%/*}
    if [ "$top" != "$inc" ] && grep -qxF "$top" <<<"$dropped"; then
      echo "pack: $f includes $inc from dropped csrc/$top" >&2
      bad=1
    fi
  done
done
[ "$bad" = 0 ] || { echo "pack: refusing to drop a folder attention needs" >&2; exit 1; }

find "$csrc" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
tar_out=".whl/flashinfer_python-$FI_VERSION-attn.tar.xz"
parts=(flashinfer "flashinfer_python-$FI_VERSION.dist-info")
[ -d "$stage/tree/b12x" ] && parts+=(b12x)
tar -C "$stage/tree" -cf - "${parts[@]}" | xz -T0 -6 > "$tar_out"

ls -l .whl
total=$(du -cb .whl/* | tail -1 | cut -f1)
echo "pack: .whl/ holds $((total / 1048576)) MiB (limit ${LIMIT_MIB} MiB)"
if [ "$total" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "pack: over the limit" >&2
  exit 1
fi
