#!/bin/bash
# cubin_compare.sh — the proof that moving kernel code changed no kernel: builds the cubin of every
# production .cu file (kernels/cuda/**.cu, what the Makefile links into build/ringscan) at a base commit
# and in the work tree, and compares every kernel function's machine code (tests/cuda/cubin_compare.py:
# instructions, relocations by symbol name, registers, shared memory, parameter bank).
#
#   tests/cuda/cubin_compare.sh [BASE]          BASE: a commit (default 0c08c55, main before issue 16)
#
# Needs only nvcc (no GPU, no cuobjdump). The cubins are cached by the hash of each preprocessed file
# under $CUBIN_CACHE (default /tmp/cubin_compare), so a second run rebuilds only what changed. Renames made
# on purpose are listed in tests/cuda/cubin_renames.txt (OLD NEW, substrings of demangled names).
# Prints one line per changed / removed / added function and the counts; exit 1 if any function changed.
set -eu
cd "$(dirname "$0")/../.."
BASE=${1:-0c08c55}
CACHE=${CUBIN_CACHE:-/tmp/cubin_compare}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
NCCL_INC=${NCCL_INC:-${CUDA_HOME:-/usr/local/cuda}/include}
# the device half of the Makefile's NVCCFLAGS (-g is the host's debug information: no device code)
FLAGS=(-std=c++17 -O3 -lineinfo -arch=sm_90a -Ilib -Ikernels/cuda -Ikernels/cpu -Itests/unit -I"$NCCL_INC" -D_GNU_SOURCE)
mkdir -p "$CACHE/by_hash"

# cubins SRC_ROOT OUT_DIR: every kernels/cuda .cu file of SRC_ROOT, one cubin each in OUT_DIR
cubins() {
    local root=$1 out=$2 f h name
    rm -rf "$out" && mkdir -p "$out"
    for f in $(cd "$root" && find kernels/cuda -name '*.cu' | sort); do
        h=$(cd "$root" && "$NVCC" "${FLAGS[@]}" -E -Xcompiler -P "$f" 2>/dev/null | sha1sum | cut -c1-16)
        name=$(echo "$f" | tr / _ | sed 's/\.cu$//')
        if [ ! -s "$CACHE/by_hash/$h.cubin" ]; then
            echo "cubin_compare: nvcc -cubin $f ($(basename "$root"))" >&2
            (cd "$root" && "$NVCC" "${FLAGS[@]}" -cubin "$f" -o "$CACHE/by_hash/$h.cubin.tmp") &&
                mv "$CACHE/by_hash/$h.cubin.tmp" "$CACHE/by_hash/$h.cubin"
        fi
        ln -s "$CACHE/by_hash/$h.cubin" "$out/$name.cubin"
    done
}

sha=$(git rev-parse --short=12 "$BASE")
src=$CACHE/src-$sha
if [ ! -d "$src" ]; then
    rm -rf "$src.tmp" && mkdir -p "$src.tmp"
    git archive "$sha" kernels lib tests/unit | tar -x -C "$src.tmp"
    mv "$src.tmp" "$src"
fi
cubins "$src" "$CACHE/base-$sha"
cubins "$PWD" "$CACHE/work"
exec python3 tests/cuda/cubin_compare.py "$CACHE/base-$sha" "$CACHE/work" --renames tests/cuda/cubin_renames.txt
