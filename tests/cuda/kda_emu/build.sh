#!/bin/bash
# build.sh (kda_emu) — builds OUT/kda_emu: tests/cuda/test_cuda_kda.cu's cases with kernels/cuda/kda/ run by the host
# emulation (inc/cuda_common.h), against the cpu oracle objects of an existing build (BUILD: build/ by default;
# `make CUDA=0 build/test_ops` or any full build provides them). Usage: build.sh [OUT] [BUILD]; then
# OUT/kda_emu CASE... (the case names of test_cuda_kda.cu), and OUT/mma_check (the emulated tensor-core
# pieces, inc/cuda_gdn_mma.h, against a plain GEMM).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${1:-$ROOT/build/kda_emu}
BUILD=${2:-$ROOT/build}
E=$ROOT/tests/cuda/kda_emu
CXX=${CXX:-g++}
mkdir -p "$OUT/src"
cd "$ROOT"
for f in kernels/cuda/kda/*.cuh; do python3 "$E/transform.py" "$f" "$OUT/src/$(basename "$f")"; done
python3 "$E/transform.py" kernels/cuda/kda/kda.cu "$OUT/src/kda.cpp"
python3 "$E/transform.py" kernels/cuda/kda/kda_gates.cu "$OUT/src/kda_gates.cpp"
python3 "$E/transform.py" tests/cuda/test_cuda_kda.cu "$OUT/src/test_cuda_kda.cpp"
python3 "$E/transform.py" tests/cuda/cuda_test_util.cu "$OUT/src/cuda_test_util.cpp"
cp "$E/emu_rt.cpp" "$OUT/src/emu_rt.cpp"
cp "$E/mma_check.cpp" "$OUT/src/mma_check.cpp"
FLAGS="-std=c++20 -O2 -pthread -w -I$E/inc -Ilib -Ikernels/cuda -Ikernels/cpu -Itests/unit -Itests/cuda -D_GNU_SOURCE"
objs=()
for s in emu_rt kda kda_gates test_cuda_kda cuda_test_util mma_check; do
    $CXX $FLAGS -c "$OUT/src/$s.cpp" -o "$OUT/src/$s.o" &
    [ $s = mma_check ] || objs+=("$OUT/src/$s.o")
done
wait
$CXX -pthread -o "$OUT/kda_emu" "${objs[@]}" "$BUILD/tests/unit/test_main.o" "$BUILD/lib/core/error.o" \
    "$BUILD/kernels/cpu/cpu_kda.o" "$BUILD/kernels/cpu/cpu_gdn.o" "$BUILD/kernels/cpu/cpu_elementwise.o" -lm
$CXX -pthread -o "$OUT/mma_check" "$OUT/src/mma_check.o" "$OUT/src/emu_rt.o" "$BUILD/lib/core/error.o" -lm
echo "built $OUT/kda_emu $OUT/mma_check"
