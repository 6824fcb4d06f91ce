# gpu_env.sh — what tests/cuda/gpu_regress.sh (the GPU regression checks) and bench/gpu_runs.sh (the GPU
# benchmarks and experiments) share, sourced by both from the repository root after setting GPU_RUNNER (their
# name): the environment of a call on the lent GPU machine, the seconds left (left), one training run
# (suite_train) and the loop over the parts given (gpu_run_parts DISPATCH PART...: DISPATCH PART runs one
# part and returns its status; every part's logs and kept json end in $OUT/$GPU_RUNNER.tgz after each part,
# so a call cut off still brings back the logs so far).
# Environment (both runners):
#   OUT       where $GPU_RUNNER.tgz goes (default runs/device)
#   PEER      the folder holding FLA's `fla` package (default .dev/peer; git-ignored, never committed)
#   MPI_LIB   a folder with libmpi.so.40 and its libraries, used when the machine has none (ringscan
#             links Open MPI; the device machine may lack it)
#   TRITON_CACHE_TAR  a .tar.xz of a Triton cache to unpack first (FLA's autotuning takes minutes cold)
#   TRITON_CACHE_SAVE  a .tar.xz path to write the Triton autotuners' choices to at the end
#             (TRITON_CACHE_AUTOTUNING=1; give it back as TRITON_CACHE_TAR so FLA skips its autotuning)
#   GPU_KEEP_OTHERS  1: leave ringscan processes already running alone (default: an earlier call's are killed)
#   LIMIT_S   seconds after which no further part starts (default 560: the device tool's 600 s per call)
#   AS_H100   1: every GPU keeps only an 80 GB H100's memory free for the call (tests/cuda/as_h100.py holds the
#             rest), so an H200 machine proves what fits an H100; "in use" figures then include the ballast
# NCCL_NVLS_ENABLE=0 is exported for every part (NVLink multicast off on the lent machines).
OUT=${OUT:-runs/device}
PEER=${PEER:-$PWD/.dev/peer}
LIMIT_S=${LIMIT_S:-560}
W=$(mktemp -d "/tmp/$GPU_RUNNER.XXXXXX")
L=$W/logs
mkdir -p "$L" "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PEER${PYTHONPATH:+:$PYTHONPATH}
if ! ldconfig -p 2>/dev/null | grep -q libmpi.so.40 && [ -n "${MPI_LIB:-}" ]; then
    export LD_LIBRARY_PATH=$MPI_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
if [ -n "${TRITON_CACHE_TAR:-}${TRITON_CACHE_SAVE:-}" ]; then
    export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
    export TRITON_CACHE_AUTOTUNING=1
    mkdir -p "$TRITON_CACHE_DIR"
fi
if [ -n "${TRITON_CACHE_TAR:-}" ]; then
    mkdir -p "$TRITON_CACHE_DIR" && tar xJf "$TRITON_CACHE_TAR" -C "$TRITON_CACHE_DIR"
fi
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader 2>&1 | head -2 || true
# a warm machine keeps what an earlier call left running (a run cut off by its timeout may still be writing its
# checkpoint, holding a GPU): said and stopped before anything is measured (GPU_KEEP_OTHERS=1: not, for a second
# runner started beside a first in the same call)
if [ "${GPU_KEEP_OTHERS:-0}" != 1 ] && pgrep -f "build/(ringscan|parity_step|test_cuda|cp_check)" > /dev/null; then
    echo "gpu_env: processes of an earlier call still run, killed: $(pgrep -f -a 'build/(ringscan|parity_step|test_cuda|cp_check)' | cut -c1-100 | tr '\n' ';')"
    pkill -9 -f "build/(ringscan|parity_step|test_cuda|cp_check)"
    for _ in $(seq 60); do pgrep -f "build/(ringscan|parity_step|test_cuda|cp_check)" > /dev/null || break; sleep 1; done
fi
if [ "${AS_H100:-0}" = 1 ]; then  # every GPU left with an 80 GB H100's memory for the whole call (as_h100.py)
    ${PYTHON:-python3} tests/cuda/as_h100.py "$W/as_h100.txt" &
    ballast=$!
    trap 'kill $ballast 2> /dev/null' EXIT
    for _ in $(seq 120); do [ -s "$W/as_h100.txt" ] && break; sleep 0.5; done
    [ -s "$W/as_h100.txt" ] || { echo "as_h100.py did not get ready"; exit 2; }
    sed 's/^/AS_H100: /' "$W/as_h100.txt" | tee "$L/as_h100.log"
fi
build/ringscan --version 2>&1 | head -1
status=0

# the seconds a part may still take
left() { echo $((LIMIT_S + 30 - SECONDS)); }

# suite_train NAME NP STEPS CONFIG [--set k=v ...]: ringscan train of CONFIG on NP GPUs (mpirun when NP > 1),
# every sample one causal document (synthetic tokens, documents longer than any sample: attention's full
# cost), STEPS steps (the first is the warm-up), the run left in $TRAIN_DIR/NAME (metrics.jsonl; callers
# remove $TRAIN_DIR): its memory and step lines printed, and the host memory in use sampled every 2 s
# on disk, not /dev/shm: tmpfs pages count as host memory in use, and the sampler of suite_train reads that
TRAIN_DIR=/tmp/${GPU_RUNNER}_train
suite_train() {
    local name=$1 np=$2 steps=$3 cfg=$4 d=$TRAIN_DIR rc=0
    shift 4
    mkdir -p $d
    if [ ! -s $d/synth.tok ]; then
        build/ringscan data synth $d/synth.tok --vocab 151936 --tokens 8388608 --min-doc 8388608 --max-doc 8388608 \
            --seed 1 > "$L/train-data.log" 2>&1 || return 1
    fi
    local args=(train "$cfg" --set data.format=flat --set data.path=$d/synth.tok --set train.steps="$steps"
        --set train.warmup_steps=1 --set device.kind=cuda --set device.peak_tflops=989 --set checkpoint.every=0
        --set slurm.gpus_per_node="$np" --set run.out_dir=$d/$name "$@")
    (while sleep 2; do free -b | awk '/^Mem:/ {print $3}'; done) > "$L/$name-host.log" &
    local sampler=$!
    if [ "$np" -gt 1 ]; then
        timeout "$(left)" mpirun --allow-run-as-root --bind-to none -np "$np" -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH \
            build/ringscan "${args[@]}" > "$L/$name.log" 2>&1 || rc=1
    else
        timeout "$(left)" build/ringscan "${args[@]}" > "$L/$name.log" 2>&1 || rc=1
    fi
    kill $sampler 2> /dev/null
    echo "$name: $np GPU(s), $* (rc $rc):"
    grep -E "^memory|^step" "$L/$name.log" | tail -$((steps + 1))
    sort -n "$L/$name-host.log" | tail -1 | awk '{printf "  host memory in use, peak sampled every 2 s: %.2f GiB\n", $1 / 2^30}'
    return $rc
}


# gpu_run_parts DISPATCH PART...: the parts in the order given, each started while LIMIT_S allows; exits with 1
# if any part failed (a failed check, a bench error row, a timeout), else 0
gpu_run_parts() {
    local dispatch=$1 part
    shift
    for part in "$@"; do
        if [ "$SECONDS" -ge "$LIMIT_S" ]; then
            echo "== $part: not started (${SECONDS} s of LIMIT_S=$LIMIT_S gone)"
            status=1
            continue
        fi
        echo "== $part at ${SECONDS} s"
        "$dispatch" "$part" || status=1
        tar czf "$OUT/$GPU_RUNNER.tgz" -C "$W" .  # after every part: a call cut off still brings back the logs so far
    done
    tar czf "$OUT/$GPU_RUNNER.tgz" -C "$W" .
    # the autotuners' choices only (TRITON_CACHE_AUTOTUNING=1 writes them as *.autotune.json): the compiled
    # kernels of every tried configuration made the whole cache too big to come back from the device tool
    [ -n "${TRITON_CACHE_SAVE:-}" ] && (cd "$TRITON_CACHE_DIR" && find . -name "*.autotune.json" | tar cJf "$TRITON_CACHE_SAVE" -T -)
    echo "== done at ${SECONDS} s, status $status (logs: $OUT/$GPU_RUNNER.tgz)"
    exit $status
}
