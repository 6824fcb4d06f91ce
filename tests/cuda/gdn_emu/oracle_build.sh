#!/bin/bash
# oracle_build.sh (gdn_emu) — builds OUT/gdn_emu: tests/cuda/test_cuda_gdn.cu's cases with kernels/cuda/gdn/ run by
# the host emulation against the cpu oracle objects of an existing build (BUILD: build/ by default), and
# OUT/mma_check (the emulated ldmatrix / mma.sync of inc/cuda_ptx.h against a plain GEMM). The emulation is the KDA
# one (tests/cuda/kda_emu: its transform.py, inc/ and emu_rt.cpp; fibers per CUDA thread, cp.async landing at its
# wait) with the GDN stand-ins of inc/ here (cuda_ptx.h: ldmatrix and mma.sync lane by lane, the Hopper-only PTX as
# stubs; cuda.h: tensor-map types) and gdn_emu_rt.cpp (the wgmma passes held off). (build.sh beside it is another
# tool: two revisions' per-chunk kernels compared bitwise.) Usage: oracle_build.sh [OUT] [BUILD]; then
# OUT/gdn_emu CASE... (the case names of test_cuda_gdn.cu) and OUT/mma_check; tests/test_cuda_gdn_emu.py runs both.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${1:-$ROOT/build/gdn_emu_oracle}
BUILD=${2:-$ROOT/build}
E=$ROOT/tests/cuda/gdn_emu
K=$ROOT/tests/cuda/kda_emu
CXX=${CXX:-g++}
mkdir -p "$OUT/src"
cd "$ROOT"
for f in kernels/cuda/gdn/*.cuh; do python3 "$K/transform.py" "$f" "$OUT/src/$(basename "$f")"; done
for f in gdn gdn_tune gdn_buffers; do python3 "$K/transform.py" "kernels/cuda/gdn/$f.cu" "$OUT/src/$f.cpp"; done
python3 "$K/transform.py" tests/cuda/test_cuda_gdn.cu "$OUT/src/test_cuda_gdn.cpp"
# the real warp GEMM over the emulated PTX, for mma_check only (the kernels get kda_emu's direct one)
cp kernels/cuda/cuda_gdn_mma.h "$OUT/src/ptx_gdn_mma.h"
if grep -l 'asm' "$OUT"/src/*.cuh "$OUT"/src/*.cpp | grep -v 'ptx_gdn_mma.h' >/dev/null; then
    echo "oracle_build.sh: inline asm left in $(grep -l 'asm' "$OUT"/src/*.cuh "$OUT"/src/*.cpp | head -1)" >&2
    exit 1
fi
# quoted includes resolve in OUT/src first (the transformed copies), then the stand-ins, then the sources
FLAGS="-std=c++20 -O2 -pthread -w -I$E/inc -I$K/inc -Ilib -Ikernels/cuda -Ikernels/cuda/gdn -Ikernels/cpu -Itests/unit
       -Itests/cuda -D_GNU_SOURCE"
# every translation unit's dynamic shared memory is the emulation's one buffer (kda_emu/emu_rt.cpp)
FLAGS="$FLAGS -Dgdn_smem=kda_smem -Dgdn_wg_smem=kda_smem -Dgdn_rg_smem=kda_smem"
declare -A extra=([gdn_tune]="-Dcuda_gdn_tune_set=gdn_emu_tune_set_real")
pids=()
for s in gdn gdn_tune gdn_buffers test_cuda_gdn; do
    $CXX $FLAGS ${extra[$s]:-} -c "$OUT/src/$s.cpp" -o "$OUT/src/$s.o" & pids+=($!)
done
$CXX $FLAGS -c "$K/emu_rt.cpp" -o "$OUT/src/emu_rt.o" & pids+=($!)
$CXX $FLAGS -c "$E/gdn_emu_rt.cpp" -o "$OUT/src/gdn_emu_rt.o" & pids+=($!)
$CXX -I"$OUT/src" $FLAGS -c "$E/mma_check.cpp" -o "$OUT/src/mma_check.o" & pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done
S=$OUT/src
$CXX -pthread -o "$OUT/gdn_emu" "$S/gdn.o" "$S/gdn_tune.o" "$S/gdn_buffers.o" "$S/test_cuda_gdn.o" "$S/emu_rt.o" \
    "$S/gdn_emu_rt.o" "$BUILD/tests/unit/test_main.o" "$BUILD/lib/core/error.o" "$BUILD/kernels/cpu/cpu_gdn.o" \
    "$BUILD/kernels/cpu/cpu_elementwise.o" -lm
$CXX -pthread -o "$OUT/mma_check" "$S/mma_check.o" "$S/emu_rt.o" "$BUILD/lib/core/error.o" -lm
echo "built $OUT/gdn_emu $OUT/mma_check"
