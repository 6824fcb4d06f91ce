# gpu_case.sh — sourced by tests/cuda/cp_gpu_check.sh and tests/cuda/long_gpu_check.sh: their shared
# set-up, parity case and the two helpers that run and judge build/parity_step on it. Reads the callers'
# B (build dir), O (output dir); sets PY (python3), HERE (tests/cuda), MPI2 (mpirun on 2 GPUs), rc = 0,
# an empty O, and C (the case dir, gpu_case_make); a failure sets rc=1.
PY=${PYTHON:-python3}
HERE=$(dirname "${BASH_SOURCE[0]}")
export NCCL_NVLS_ENABLE=0
MPI2=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH)
rc=0
rm -rf "$O" && mkdir -p "$O" || exit 2

# gpu_case_make: the parity case of configs/tiny-cpu.yaml, 2 x 1024 tokens, documents starting on the
# rank boundaries of cp 2 (256, 512, 768), one token after them, inside fragments, and a sample that
# starts inside a document (tests/test_cp.py's "boundaries" layout)
gpu_case_make() {
    echo "== case (2 x 1024 tokens, documents on the cp 2 boundaries)"
    local docs='[{"lengths": [64, 1, 63, 1, 127, 1, 43, 84, 1, 127, 1, 187, 68, 1, 127, 64, 1, 63], "carry": 0},
                 {"lengths": [300, 5, 600, 119], "carry": 100}]'
    $PY tests/parity/make_case.py configs/tiny-cpu.yaml "$O/case" --seq-len 1024 --batch 2 --seed 3 --docs "$docs" \
        --ringscan "$B/ringscan" 2>&1 | grep -v Warning || exit 1
    C="$O/case"
}

# step NAME [launcher...] -- parity_step args: one forward + backward into $C/NAME.safetensors
step() {
    local name=$1
    shift
    local pre=()
    while [ "$1" != "--" ]; do pre+=("$1"); shift; done
    shift
    if ! timeout 300 "${pre[@]}" "$B/parity_step" "$C" --out "$C/$name.safetensors" "$@" > "$O/$name.log" 2>&1; then
        echo "parity_step $name FAILED:"
        tail -5 "$O/$name.log"
        rc=1
    fi
    grep "^parity_step" "$O/$name.log"
}

# judge TITLE REF GOT: compare_bf16.py's bounds (against the bf16 emulation run cpu_bf16)
judge() {
    echo "-- $1"
    $PY "$HERE/compare_bf16.py" "$C/$2.safetensors" "$C/$3.safetensors" "$C/cpu_bf16.safetensors" > "$O/cmp-$3-$2.log" 2>&1
    local r=$?
    head -6 "$O/cmp-$3-$2.log"
    tail -2 "$O/cmp-$3-$2.log"
    [ $r -eq 0 ] || { echo "FAILED: $1"; rc=1; }
}
