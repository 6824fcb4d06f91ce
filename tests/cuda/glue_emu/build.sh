#!/bin/bash
# build.sh (glue_emu) — builds OUT/emu_conv, OUT/emu_norm, OUT/emu_ew: the glue kernels' device code (cut out by
# extract.py) under the host emulation of emu.h, against the cpu oracle objects of an existing build (BUILD: build/
# by default; `make CUDA=0 build/test_ops` or any full build provides them). Usage: build.sh [OUT] [BUILD]; then run
# each binary (exit status 1 and FAIL lines when a kernel disagrees with the oracle).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${1:-$ROOT/build/glue_emu}
BUILD=${2:-$ROOT/build}
E=$ROOT/tests/cuda/glue_emu
CXX=${CXX:-g++}
mkdir -p "$OUT"
python3 "$E/extract.py" "$ROOT" "$OUT"
FLAGS="-std=c++20 -O2 -pthread -fno-strict-aliasing -w -I$E -I$OUT"
pids=()
for k in conv:cpu_conv norm:cpu_norm ew:cpu_elementwise; do
    $CXX $FLAGS -o "$OUT/emu_${k%%:*}" "$E/emu_${k%%:*}.cpp" "$BUILD/kernels/cpu/${k#*:}.o" "$BUILD/lib/core/error.o" -lm &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
echo "built $OUT/emu_conv $OUT/emu_norm $OUT/emu_ew"
