#!/bin/bash
# build.sh (gdn_emu) — builds OUT/gdn_emu_cmp: GDN's per-chunk kernels prep, dqkwg and wy_bwd (kernels/cuda/gdn/
# common.cuh, prep.cuh, dqkwg.cuh, wy_backward.cuh) of a base revision and of the working tree, both run by the KDA
# host emulation (tests/cuda/kda_emu/inc: one fiber per CUDA thread, cp.async landing only at its wait) on the
# same inputs, every output buffer compared bitwise. For speed rounds that must keep the bits: a change of launch
# shape, load grouping, shared-memory aliasing or loop order that alters a value, or reads a tile before its wait,
# shows. The emulation's arithmetic is the host's (its own mma order, exp2f), the same on both sides: it proves that
# the two revisions compute the same thing, not the device's bits. Usage: build.sh BASE [OUT] [BUILD], then
# OUT/gdn_emu_cmp (exit 1 on a difference).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
BASE=${1:?usage: build.sh BASE [OUT] [BUILD]}
OUT=${2:-$ROOT/build/gdn_emu}
BUILD=${3:-$ROOT/build}
E=$ROOT/tests/cuda/gdn_emu
K=$ROOT/tests/cuda/kda_emu
CXX=${CXX:-g++}
mkdir -p "$OUT/base" "$OUT/tree"
cd "$ROOT"
for f in common prep wy_backward dqkwg; do
    git show "$BASE:kernels/cuda/gdn/$f.cuh" > "$OUT/base/$f.cuh"
    cp "kernels/cuda/gdn/$f.cuh" "$OUT/tree/$f.cuh"
done
# the emulation runs no inline PTX (transform.py makes an L2 prefetch, which moves no value, the evaluation of its
# address)
for d in base tree; do
    for f in "$OUT/$d"/*.cuh; do
        python3 "$K/transform.py" "$f" "$f"
        if grep -q 'asm' "$f"; then echo "gdn_emu: inline asm left in $f" >&2; exit 1; fi
    done
done
# the KDA emulation's headers (their cp.async has the 4-byte form common.cuh's gate rows load)
FLAGS="-std=c++20 -O1 -pthread -w -I$K/inc -I$E -Ilib -Ikernels/cuda -D_GNU_SOURCE"
# a revision whose wy_bwd can read prep's kept Tinv (backend.h GDN_KEPT_TINV) is launched with it (side.cpp)
tinv() { grep -q "bool SOLVE" "$OUT/$1/wy_backward.cuh" && echo -DGDN_EMU_KEPT_TINV || true; }
$CXX $FLAGS -I"$OUT/base" $(tinv base) -DGDN_EMU_SIDE=gdn_emu_run_base -c "$E/side.cpp" -o "$OUT/side_base.o" &
$CXX $FLAGS -I"$OUT/tree" $(tinv tree) -DGDN_EMU_SIDE=gdn_emu_run_tree -c "$E/side.cpp" -o "$OUT/side_tree.o" &
$CXX $FLAGS -c "$E/cmp.cpp" -o "$OUT/cmp.o" &
$CXX $FLAGS -c "$K/emu_rt.cpp" -o "$OUT/emu_rt.o" &
wait
$CXX -pthread -o "$OUT/gdn_emu_cmp" "$OUT/cmp.o" "$OUT/emu_rt.o" "$OUT/side_base.o" "$OUT/side_tree.o" \
    "$BUILD/lib/core/error.o" -lm
echo "built $OUT/gdn_emu_cmp ($BASE against the working tree)"
