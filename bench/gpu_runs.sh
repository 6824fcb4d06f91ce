#!/bin/bash
# gpu_runs.sh — the GPU benchmarks and A/B experiments a session runs on the lent GPU machine, in one call, from
# the repository root, with the binaries built on the CPU machine and carried in build/:
#
#   NCCL_NVLS_ENABLE=0 bash bench/gpu_runs.sh PART...        e.g.  bench/gpu_runs.sh gdn attn32k cp2
#
# Every part writes its log under logs/ and prints a summary line; the benchmark parts keep their bench.json
# as PART.json. All of it ends in one file, $OUT/gpu_runs.tgz (the environment: tests/cuda/gpu_env.sh). What
# fails when behaviour breaks is tests/cuda/gpu_regress.sh's (parity, CP equivalence, the configs that must fit).
# Parts, in the order given:
#   gdn        ringscan bench gdn --peer (every shape, FLA beside)      gdn-nopeer  the same, ours only
#   gdn-base   ringscan bench gdn at 32k and 128k (16 and 64 heads, 1 and many documents) of GDN_BASE_BIN (a binary
#              built at an earlier commit) and of build/ringscan, alternated twice on the same GPU
#   gdn-states ringscan bench gdn --gdn-keep states (ours only: the kept chunk states, GDN v4.4)
#   gdn32k     ringscan bench gdn at T = 32768, 16 and 64 heads, 1 and 16 documents (ours only), and the
#              same with --profile 1 (the time of every kernel, in the log)
#   gdn-cycles the state passes' cycles per phase (--profile 2, block 0) at 32k, one document: the wgmma
#              passes (--gdn-tune state_fwd_wgmma=1,state_bwd_wgmma=1) at 64 and 32 columns, 16 and 64 heads; mma.sync at 16
#   kda        (issue 39, 1 GPU) ringscan bench kda --peer: Kimi Delta Attention's chunk at 32k, 64k and 128k, 16 and
#              64 heads, one document and --doc-len 2048, FLA's chunk_kda beside (the peer given all but KDA_OURS_S,
#              default 150, of the call: its autotuning takes minutes cold, TRITON_CACHE_TAR / _SAVE carry it);
#              stops at once, naming them, where the cuda backend's kda entries are NULL
#   kda-nopeer the same, ours only
#   attn       ringscan bench attn --peer (every shape, SDPA flash and cuDNN beside)
#   attn32k    the same at T = 32768 only
#   attn-cudnn (issue 19) the cuDNN attention route: ringscan bench attn at 32k and 128k, 16/16/128 and 16/2/128:
#              --attn-impl cudnn with SDPA flash and cuDNN beside (--peer), then ours alone on the same shapes
#              (attn-cudnn-ours.json) (its parity: gpu_regress.sh attn-cudnn-parity and attn-auto)
#   attn-cudnn-det  what determinism costs: bench attn at 8k and 16k (cudnn_det's workspace, Tq Tk nh 2 bytes,
#              fits there only), 16/16/128 and 16/2/128, with cuDNN's backward (cudnn), its deterministic one
#              (cudnn_det) and ours, alternated twice; a table of f+b ms and cudnn_det / cudnn; then cudnn_det at
#              128k: it stops naming the workspace asked, or runs on an engine whose workspace fits (said). ~2 min
#   attn-cudnn-wide  the cuDNN route where attn-cudnn did not look: bench attn --attn-impl cudnn at hd 256
#              (16/16/256, 16/2/256) and at hd 128 with documents (--doc-len 2048: document-masked calls go
#              to our kernel by design, the routed counts say so), 32k and 128k, SDPA flash and cuDNN beside
#              (per document with documents). ~5 min
#   step-cudnn the 1B step (bench step, 32k tokens, ours only) under none and under remat, each with our
#              attention kernel and with device.attention_kernel=cudnn, side by side (cudnn_det's workspace
#              does not fit at 32k beside the step). ~4 min
#   step-base  the 1B step at 131,072 tokens (one document; packed, mean 8k; keep_layers=auto) of STEP_BASE_BIN and of
#              build/ringscan, alternated STEP_ROUNDS (5) times: each run's ms, the median and range per build. ~3 min
#   step       ringscan bench step --peer, checkpoint.activations=none (transformers+FLA beside); fails unless
#              our row's block_recomputes and chunk_recomputes are 0 (none reruns nothing)
#   remat      ringscan bench step, remat (ours only)
#   step-states  ringscan bench step, none, checkpoint.gdn_keep=states (ours only)
#   cp-step    ringscan train of the 1B config, remat: 128k tokens on one GPU, then 256k at cp 2 on two GPUs
#              with communication overlapped and forced serial (parallel.overlap_comm: false) (CP_STEP_SET: more
#              --set options for all three, e.g. "--set device.attention_kernel=cudnn"): ms/step,
#              tokens/s, MFU, peak memory beside plan
#   cp2-attn   cp2's ring attention at 128k and 256k with torch's context_parallel beside it
#   cp2-gdn    cp2's GDN layer, ours only (FLA's CP autotunes for more than 240 s cold)
#   cp2-ring-calls  cp2's ring attention at 128k (MHA, GQA; where v0.6 missed 99%), ours only, with the zigzag
#              rule's calls one by one (--ring-calls pairs) and auto (one call per step with our kernel),
#              alternated RING_ROUNDS (2) times: what one launch per step buys. ~2 min
#   cp2-ring-calls-cudnn  the same through cuDNN (auto: one call per step, every one cuDNN's). ~4 min
#   ring2-calls  one GPU: our kernel's calls of the cp 2 ring at 128k (MHA, GQA 16/2) one by one, each rank's own
#              block and dense rectangle beside the one-GPU call (build/bench_kernels attn ring2):
#              the ring's CP efficiency from the kernel calls alone, without communication. ~1 min
#   cp2-ring-kv  cp2's ring attention at 128k (MHA, GQA) with the backward reading the K|V its forward kept
#              (--ring-kv kept, the default) against passing it again (passed), through cuDNN then ours,
#              alternated RING_ROUNDS (2) times. ~4 min
#   cp2-ring-ab  the same 128k ring (MHA, GQA) through cuDNN and through ours, this build against
#              RING_BASE_BIN (another ringscan: a schedule change's A/B), alternated RING_ROUNDS (2) times. ~3 min
#   cp2-ring-dq  the same 128k ring (steps) with our backward's dQ in key-block order (the built-in, deterministic)
#              and by plain atomics (--attn-tune dq_atomic=1), alternated twice: whether the ordered dQ is what
#              slows the dense-rectangle step's backward (v0.10: ~158 ms against ~140 for the causal step). ~2 min
#   cp2-gdn-chain  cp2's GDN layer (GDN_CASES, default 64k and 128k at 64 heads), ours only, with the staged
#              chain (parallel.gdn_chain_staged, the default) and each fragment's pass whole (--gdn-chain whole),
#              alternated CHAIN_ROUNDS (2) times: what the staged chain buys. ~1 min a run
#   cp2-gdn-peer  cp2's GDN layer with FLA's CP beside it, the peer given all but 200 s of the call
#              (its Triton autotuning, ~300 s per shape cold; TRITON_CACHE_SAVE keeps the cache for the next
#              call); GDN_CASES: bench cp options choosing the shapes (e.g. "--gdn-T 65536 --heads 64"),
#              GDN_OURS_S: the seconds kept for ours and the parts after it (default 200)
#   cp-kda     (issue 39, 2 GPUs) bench cp --parts kda: the KDA layer (conv halo, conv, L2 norm, the core with the
#              per-channel transition through lib/cp) at cp 2, 64k and 128k, 16 and 64 heads, FLA's KDA CP beside
#              (fla.ops.cp; the peer given all but KDA_OURS_S, default 200, of the call), one-GPU rows of both for the
#              CP efficiencies (KDA_CP_CASES: the bench cp options choosing the shapes, e.g. "--gdn-T 65536 --heads 64");
#              stops at once, naming them, where the cuda backend's kda entries are NULL
#   cp-kda-nopeer  the same, ours only
#   cp2-512k   cp2's ring attention at 512k (MHA and GQA, 2 timed runs) with torch's context_parallel
#   cp2-attn-cudnn  cp2's ring attention through the cuDNN route (bench cp --attn-impl cudnn: the causal
#              diagonals and dense rectangles on cuDNN, by the ring's host hints, no read-back) at 128k, 256k and
#              512k, MHA and GQA, 3 timed runs, with torch's context_parallel (cuDNN) beside and the route's
#              own one-GPU rows for CP efficiency. ~7 min: run it alone in a call
#   cp4-attn   (4 GPUs, issue 21) ring attention at cp 4, 128k / 512k / 1M, 16 heads, hd 128, torch beside
#              (CP4_REPS timed runs, default 2; CP4_PEER_S the peer's seconds, default 300)
#   cp4-gdn    (4 GPUs) the GDN layer at cp 4, 128k, 64 heads, FLA's CP beside (give it a warm Triton cache)
#   cp4-gdn-nopeer  the same, ours only
#   cp4-gdn-schedules  (4 GPUs) the GDN layer at cp 4 (GDN_CASES, default 128k and 256k at 16 and 64 heads), ours
#              only, with each state-passing schedule (--gdn-cp hybrid, what training runs at cp 4; scan; chain),
#              alternated SCHED_ROUNDS (2) times: the measurement docs/design/gdn-cp.md's choice rests on
#   cp4-step   (4 GPUs) ringscan train at 256k: dp 1 x cp 4 (grad_accum 2) beside dp 2 x cp 2 overlapped and
#              serial (CP_STEPS, default 4) (the 1M config at cp 4: gpu_regress.sh cp4-1m)
#   cp2        mpirun -np 2 ringscan bench cp --peer on the machine's 2 GPUs (NCCL_NVLS_ENABLE=0): ring
#              attention at 128k/256k/512k and the GDN layer at 64k/128k beside torch's context_parallel
#              (cuDNN) and FLA's CP, one-GPU times and CP efficiencies, the serial schedule, per-step
#              compute and communication (issue 22)
#   cp2-net    (issue 40, 2 GPUs) NCCL between the two GPUs over its network transport, as between two hosts
#              (sockets on the loopback, P2P and SHM off: slurm/gpu-cluster/site.env's NCCL settings), beside its
#              default transports (NVLink) in the same call: bench cp of ring attention (128k, MHA and GQA) and
#              the GDN layer (128k, 16 and 64 heads): CP efficiency, per step compute and exposed communication,
#              each exchange alone with its bytes; then the 1B step at 256k, cp 2 (NET_STEPS, default 4 steps):
#              ms/step and MFU; the transport NCCL chose, from NCCL_DEBUG=INFO. ~6 min
#   kda-step   (issue 39, 2 GPUs) the 1B config with KDA layers (model.linear_attention=kda) at 262,144 tokens, cp 2,
#              grad_accum 1, KDA_STEPS (4) steps: plan, ms/step, tokens/s, MFU, memory beside plan. ~2 min
#   long-1m-torch  torch context_parallel + cuDNN alone, one attention layer (16 heads, hd 128) fwd+bwd at 1M on
#              two GPUs (~2 min): the peer beside gpu_regress.sh's long-1m (the 1M config's training, which must fit)
#   long-1m-cudnn  gpu_regress.sh long-1m's training (3 steps, two GPUs, cp 2) with device.attention_kernel=cudnn: s/step,
#              MFU, memory beside plan (which counts the route's 3.28 GiB workspace; cuDNN's own plan workspace
#              is printed in the log). ~70 s a step if the attention runs at v0.7's 1.6x: ~5 min; run it alone
#              in a call (on 80 GB H100s plan is 75.1 GiB of 79.2 before cuDNN's own workspace)
#   long-256k  the same model at 262,144 tokens on two GPUs, 4 steps each: unchunked without offload
#              (chunk_rows 65536 = the fragment), chunked (plan's 8,384 rows), chunked + offload; the cost
#              of each as a ratio of ms/step, and the offloaded run's losses bitwise the chunked run's.
#              ~7.5 s a step (attention 1.7 PFLOP per GPU a step), ~50 s a run: ~3 min
#   qwen35-train  (issue 36, 2 GPUs) a random Qwen3.5 2B-shape folder (transformers' Qwen3_5ForCausalLM, its own init,
#              save_pretrained in bf16: tests/parity/qwen35_train_hf.py save) imported by model.init_from into
#              configs/qwen3.5-2b-256k-h200x2.yaml: plan, then QWEN35_STEPS (4) steps at 262,144 tokens, cp 2, grad_accum 1,
#              synthetic tokens over Qwen3.5's vocab (248,320): ms/step, tokens/s, MFU beside plan's memory; then
#              `ringscan export --format qwen3_5` of the run (fp32) loads in transformers with nothing missing, its
#              logits finite and moved from the source's. ~5 min (writes ~35 GB under /tmp, removed after)
#   qwen35-step  (issue 36, 1 GPU) the 2B-shape step at 32k and 128k (bench step --config the 2B config, cp 1, its
#              remat), then transformers' Qwen3_5ForCausalLM with FLA's kernels on bench's request (same tokens:
#              step_hf.py with STEP_HF_MODEL=qwen3_5, given what is left of the call; without FLA on PYTHONPATH:
#              ours only, said): ms/step, tokens/s, TFLOP/s, MFU and the ratio. ~3 min warm; FLA's autotuning
#              adds minutes cold (TRITON_CACHE_TAR: the step part's cache serves, the same GDN heads and dims)
#   qwen35-4b-512k  (issues 36/37, 2 GPUs) configs/qwen3.5-4b-512k-h200x2.yaml from random weights (no init_from),
#              untied head (QWEN35_4B_TIE=false: 4.84 B parameters, the issue's count; true: the config's 4.21 B),
#              QWEN35_4B_STEPS (3) steps of 524,288 tokens at cp 2, grad_accum 1, with the stage the config names
#              (shard gradients, offload host): plan, s/step, tokens/s, MFU, GPU and host memory beside plan. ~6 min
#   long-4b-1m  (issue 41, 4 GPUs) configs/qwen3.5-4b-1m-h200x4.yaml; long-9b-1m (8 GPUs) configs/qwen3.5-9b-1m-h200x8.yaml;
#              long-9b-1m-80g (8 GPUs; on H200s with AS_H100=1) configs/qwen3.5-9b-1m-h100x8.yaml; long-1b-4m (8 GPUs)
#              configs/hybrid-1b-4m-h200x8.yaml: each from random weights (model.init_from empty) on synthetic
#              one-document samples, LONG_STEPS (3) steps as the config is written: plan, s/step, tokens/s, MFU, GPU
#              and host memory beside plan. Refused, naming the count, on a machine with fewer GPUs
#   long-smoke (1 GPU) the same on configs/hybrid-1b-256k-h200x4.yaml at 131,072 tokens, cp 1, grad_accum 1: the
#              part's own check where no four- or eight-GPU machine is lent. ~1 min
# Exit status: 1 if any part failed (a bench error row, a failed check, a timeout), else 0.
set -u
cd "$(dirname "$0")/.." || exit 2
GPU_RUNNER=gpu_runs
. tests/cuda/gpu_env.sh

# the GDN layer of a baseline binary (GDN_BASE_BIN, e.g. one built at an earlier commit) and of build/ringscan on
# the same GPU, alternated twice (base, ours, base, ours): a kernel change measured against what it replaced
suite_gdn_base() {
    local rc=0 r b
    [ -x "${GDN_BASE_BIN:-}" ] || { echo "gdn-base: GDN_BASE_BIN '${GDN_BASE_BIN:-}' is not an executable"; return 1; }
    for r in 1 2; do
        for b in "$GDN_BASE_BIN" build/ringscan; do
            timeout "$(left)" "$b" bench gdn --T 32768,131072 --heads 16,64 --doc-len 0,2048 \
                --out "/tmp/gpu_runs_gdn-base" > "$L/gdn-base-$r-$(basename "$(dirname "$b")").log" 2>&1 || rc=1
            echo "gdn-base round $r: $b ($("$b" --version | sed -n 2p | tr -s ' '))"
            sed -n '/^case /,/^$/p' "$L/gdn-base-$r-$(basename "$(dirname "$b")").log" | head -10
        done
    done
    return $rc
}

# the 1B step at 131,072 tokens, one document and packed documents of mean 8k (keep_layers=auto), of a baseline binary
# (STEP_BASE_BIN) and of build/ringscan on the same GPU, alternated STEP_ROUNDS (5) times: a change to the step
# measured against what it replaced beyond the ~1% that one pair of runs varies by; each run's ms, then per build
# and case the median and range over the rounds
suite_step_base() {
    local rc=0 r b tag log
    [ -x "${STEP_BASE_BIN:-}" ] || { echo "step-base: STEP_BASE_BIN '${STEP_BASE_BIN:-}' is not an executable"; return 1; }
    : > "$L/step-base-runs.txt"
    for r in $(seq "${STEP_ROUNDS:-5}"); do
        for b in "$STEP_BASE_BIN" build/ringscan; do
            tag=new
            [ "$b" = build/ringscan ] || tag=base
            log=$L/step-base-$r-$tag.log
            timeout "$(left)" "$b" bench step --tokens 131072 --doc-len 0,8192 --reps 2 --max-s 2 \
                --set checkpoint.keep_layers=auto --out /tmp/gpu_runs_step-base > "$log" 2>&1 || rc=1
            awk -v r="$r" -v tag="$tag" '$2 == "ringscan" && $1 ~ /_T[0-9]+/ {
                print "step-base round " r " " tag " " $1 " " $3 " ms"}' "$log" | tee -a "$L/step-base-runs.txt"
        done
    done
    local key
    for key in $(awk '{print $4 "/" $5}' "$L/step-base-runs.txt" | sort -u); do
        awk -v k="$key" '$4 "/" $5 == k {print $6}' "$L/step-base-runs.txt" | sort -n |
            awk -v k="$key" '{v[NR] = $1} END {m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
                printf "step-base %s: median %.1f ms, %.1f-%.1f over %d runs\n", k, m, v[1], v[NR], NR}'
    done
    [ -s "$L/step-base-runs.txt" ] || rc=1
    return $rc
}

# suite_gdn32k NAME [BENCH OPTION...]: ringscan bench gdn at 32k with the given options, then per kernel
suite_gdn32k() {
    local name=$1
    shift
    timeout "$(left)" build/ringscan bench gdn --T 32768 --heads 16,64 --doc-len 0,2048 "$@" \
        --out "/tmp/gpu_runs_$name" > "$L/$name.log" 2>&1
    local rc=$?
    echo "$name ($*) rc=$rc"
    sed -n '/^case /,$p' "$L/$name.log" | head -12
    cp "/tmp/gpu_runs_$name/bench.json" "$W/$name.json" 2>/dev/null
    timeout "$(left)" build/ringscan bench gdn --T 32768 --heads 16,64 --doc-len 0,2048 "$@" --profile 1 \
        --reps 3 --out "/tmp/gpu_runs_$name-prof" > "$L/$name-prof.log" 2>&1
    local prc=$?
    echo "$name per kernel rc=$prc (log $name-prof.log)"
    [ $rc -eq 0 ] && [ $prc -eq 0 ]
}

# the per-phase cycle counters of the state passes (--profile 2), one line per pass and setting
suite_gdn_cycles() {
    local rc=0 bv h
    for bv in 64 32; do
        for h in 16 64; do
            timeout "$(left)" build/ringscan bench gdn --gdn-tune state_fwd_wgmma=1,state_bwd_wgmma=1,state_fwd_wgmma_cols=$bv --profile 2 \
                --T 32768 --heads $h --doc-len 0 --reps 1 --out /tmp/gpu_runs_cyc > "$L/cycles-wg$bv-h$h.log" 2>&1 || rc=1
            echo "wgmma, $bv columns forward, $h heads:"
            grep "gdn cycles" "$L/cycles-wg$bv-h$h.log" | tail -2
        done
    done
    timeout "$(left)" build/ringscan bench gdn --gdn-tune state_fwd_wgmma=2,state_bwd_wgmma=2 --profile 2 --T 32768 --heads 16 \
        --doc-len 0 --reps 1 --out /tmp/gpu_runs_cyc > "$L/cycles-mma-h16.log" 2>&1 || rc=1
    echo "mma.sync, 16 heads:"
    grep "gdn cycles" "$L/cycles-mma-h16.log" | tail -2
    return $rc
}

# suite_cp NAME NP ARGS...: mpirun -np NP ringscan bench cp ARGS, the tables printed, bench.json kept
suite_cp() {
    local name=$1 np=$2
    shift 2
    timeout "$(left)" mpirun -np "$np" --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x PYTHONPATH -x PYTHONUNBUFFERED \
        ${LD_LIBRARY_PATH:+-x LD_LIBRARY_PATH} ${TRITON_CACHE_DIR:+-x TRITON_CACHE_DIR -x TRITON_CACHE_AUTOTUNING} \
        "${RS_BIN:-build/ringscan}" bench cp "$@" --out "/tmp/gpu_runs_$name" > "$L/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc"
    sed -n '/^case /,/^results/p' "$L/$name.log" | head -80
    cp "/tmp/gpu_runs_$name/bench.json" "$W/$name.json" 2>/dev/null
    cp /tmp/gpu_runs_"$name"/peer_cp_*.log "$L/" 2>/dev/null
    return $rc
}

# suite_bench NAME ARGS...: ringscan bench ARGS, the table printed, bench.json kept
suite_bench() {
    local name=$1
    shift
    timeout "$(left)" build/ringscan bench "$@" --out "/tmp/gpu_runs_$name" > "$L/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc"
    sed -n '/^case /,$p' "$L/$name.log" | head -60
    cp "/tmp/gpu_runs_$name/bench.json" "$W/$name.json" 2>/dev/null
    return $rc
}

# the 1B step under none beside transformers+FLA; our row must say the step reran nothing (issue 18: none
# keeps every per-token tensor its backward reads, so no block and no row chunk runs again)
suite_step_none() {
    local rc=0
    suite_bench step step --profile 1 --peer --peer-timeout 240 --set checkpoint.activations=none || rc=1
    python3 - "$W/step.json" <<'EOF' || rc=1
import json, sys
for r in json.load(open(sys.argv[1]))["step"]["ringscan"]:
    got = (r.get("block_recomputes"), r.get("chunk_recomputes"))
    print(f"step {r.get('case')}: none reran {got[0]} blocks, {got[1]} per-token forwards (want 0, 0)")
    if got != (0, 0):
        sys.exit("step: checkpoint.activations none recomputed")
EOF
    return $rc
}


# the cuDNN attention route (issue 19) beside ours and SDPA (its parity: gpu_regress.sh attn-cudnn-parity, attn-auto)
suite_attn_cudnn() {
    local rc=0
    local shapes="--T 32768,131072 --attn-shapes 16/16/128,16/2/128"
    suite_bench attn-cudnn attn $shapes --attn-impl cudnn --peer --peer-timeout 150 || rc=1
    grep -E "attention kernel|cuDNN attention plan|routed" "$L/attn-cudnn.log" | head -12
    suite_bench attn-cudnn-ours attn $shapes || rc=1
    return $rc
}

# the cuDNN route at hd 256 and with documents, SDPA beside
suite_attn_cudnn_wide() {
    local rc=0 T="--T 32768,131072"
    suite_bench attn-cudnn-hd256 attn $T --attn-shapes 16/16/256,16/2/256 --attn-impl cudnn --peer \
        --peer-timeout 150 || rc=1
    grep -E "routed|cuDNN attention plan" "$L/attn-cudnn-hd256.log" | head -8
    suite_bench attn-cudnn-docs attn $T --attn-shapes 16/16/128,16/2/128 --doc-len 2048 --attn-impl cudnn --peer \
        --peer-timeout 150 || rc=1
    grep -E "routed" "$L/attn-cudnn-docs.log" | head -4
    return $rc
}

# cuDNN's two backwards and ours on the same shapes, alternated twice, one table (issue 19's default)
suite_attn_cudnn_det() {
    local rc=0 k i
    for i in 1 2; do
        for k in cudnn cudnn_det ringscan; do
            suite_bench "attn-det-$k-$i" attn --T 8192,16384 --attn-shapes 16/16/128,16/2/128 --attn-impl $k \
                > /dev/null || rc=1
        done
    done
    grep -hE "cuDNN attention plan: backward" "$L"/attn-det-cudnn*-1.log | sort -u | head -8
    # at 128k the deterministic engine v0.10 met asks 512 GiB (Tq Tk nh 2 bytes): passed over, the run stops saying
    # so, unless cuDNN offers another deterministic engine whose workspace fits (then it runs: its plan line says)
    if suite_bench "attn-cudnn-det-refused" attn --T 131072 --attn-shapes 16/16/128 --attn-impl cudnn_det > /dev/null; then
        echo "attn-cudnn-det: 128k ran with another deterministic engine:"
        grep -m2 "cuDNN attention plan: backward" "$L/attn-cudnn-det-refused.log"
    elif grep -q "does not fit this GPU" "$L/attn-cudnn-det-refused.log"; then
        echo "attn-cudnn-det: 128k refused: $(grep -m1 -o 'ask a workspace of at least [0-9]* MiB, [0-9]* MiB could' \
            "$L/attn-cudnn-det-refused.log")"
    else
        echo "attn-cudnn-det: FAIL: cudnn_det at 128k failed without naming its workspace"; rc=1
        tail -3 "$L/attn-cudnn-det-refused.log"
    fi
    python3 - "$W" <<'PYEOF' || rc=1
import json, sys, glob, os
rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "attn-det-*.json"))):
    k, i = os.path.basename(f)[len("attn-det-"):-len(".json")].rsplit("-", 1)
    for r in json.load(open(f))["attn"]["ringscan"]:  # a failed case has no time: left out, shown as "-"
        if "ms_fwdbwd" in r:
            rows.setdefault(r["case"], {}).setdefault(k, []).append(r["ms_fwdbwd"])
print(f"{'case':28s} {'cudnn f+b ms':>18s} {'cudnn_det':>18s} {'ours':>18s} {'det/cudnn':>9s} {'ours/det':>8s}")
for c, m in rows.items():
    best = {k: min(v) for k, v in m.items()}
    cell = lambda k: ", ".join(f"{x:.2f}" for x in m.get(k, [])) or "-"
    ratio = lambda a, b: f"{best[a] / best[b]:.3f}" if a in best and b in best else "-"
    print(f"{c:28s} {cell('cudnn'):>18s} {cell('cudnn_det'):>18s} {cell('ringscan'):>18s} "
          f"{ratio('cudnn_det', 'cudnn'):>9s} {ratio('ringscan', 'cudnn_det'):>8s}")
PYEOF
    return $rc
}

# the 1B step with our attention kernel and with the cuDNN route, under none and remat
suite_step_cudnn() {
    local rc=0 pol k
    for pol in none remat; do
        for k in ringscan cudnn; do
            suite_bench "step-$pol-$k" step --profile 1 --set checkpoint.activations=$pol \
                --set device.attention_kernel=$k || rc=1
        done
    done
    return $rc
}

# long-1m's training with the cuDNN route
suite_long_1m_cudnn() {
    local cfg=configs/hybrid-1b-1m-h100x2.yaml rc=0 k=(--set device.attention_kernel=cudnn)
    build/ringscan plan $cfg "${k[@]}" | grep -E "^  total|cuDNN attention workspace|verdict"
    suite_train long-1m-cudnn 2 3 $cfg "${k[@]}" || rc=1
    grep -E "cuDNN attention plan|^attention:" "$L/long-1m-cudnn.log" | sort | uniq -c | head -10
    rm -rf $TRAIN_DIR
    return $rc
}

# the 1B config's training step: one GPU at 128k, two GPUs at cp 2 and 256k (overlapped, serial)
suite_cp_step() {
    local cfg=configs/hybrid-1b-256k-h200x4.yaml rc=0 n=${CP_STEPS:-6} c=(--set train.grad_accum=1 ${CP_STEP_SET:-})
    suite_train cp-step-1gpu 1 $n $cfg "${c[@]}" --set data.seq_len=131072 --set parallel.cp=1 || rc=1
    suite_train cp-step-cp2-overlapped 2 $n $cfg "${c[@]}" --set data.seq_len=262144 --set parallel.cp=2 \
        --set parallel.overlap_comm=true || rc=1
    suite_train cp-step-cp2-serial 2 $n $cfg "${c[@]}" --set data.seq_len=262144 --set parallel.cp=2 \
        --set parallel.overlap_comm=false || rc=1
    rm -rf $TRAIN_DIR
    return $rc
}


# four GPUs (issue 21): dp 2 x cp 2 with communication overlapped and serial (the gradient buckets' overlap)
# beside dp 1 x cp 4 at 256k (the 1M config at cp 4: gpu_regress.sh cp4-1m)
suite_cp4_step() {
    local rc=0 c256=configs/hybrid-1b-256k-h200x4.yaml n=${CP_STEPS:-4} s=(--set data.seq_len=262144)
    suite_train cp4-256k 4 $n $c256 "${s[@]}" --set parallel.cp=4 --set parallel.dp=1 --set train.grad_accum=2 || rc=1
    suite_train dp2cp2-256k-overlapped 4 $n $c256 "${s[@]}" --set parallel.cp=2 --set parallel.dp=2 \
        --set train.grad_accum=1 || rc=1
    suite_train dp2cp2-256k-serial 4 $n $c256 "${s[@]}" --set parallel.cp=2 --set parallel.dp=2 --set train.grad_accum=1 \
        --set parallel.overlap_comm=false || rc=1
    rm -rf $TRAIN_DIR
    return $rc
}



# torch context_parallel + cuDNN alone, one attention layer (16 heads, hd 128) fwd+bwd at 1M on two GPUs: the peer
# beside gpu_regress.sh's long-1m
suite_long_1m_torch() {
    local rc=0
    local d=/tmp/gpu_runs_long-1m-torch
    mpirun -np 2 --allow-run-as-root build/ringscan bench cp --parts attn --T 1048576 --attn-shapes 16/16/128 \
        --warmup 1 --reps 1 --write-requests --out $d > "$L/long-1m-torch.log" 2>&1 || rc=1
    timeout "$(left)" python3 -m torch.distributed.run --standalone --nproc_per_node 2 bench/peer/cp_attn_torch.py \
        --request $d/request_cp_attn.json --out "$W/long-1m-torch.json" >> "$L/long-1m-torch.log" 2>&1 || rc=1
    python3 -c "import json,sys; [print('  torch 1M:', r) for r in json.load(open(sys.argv[1]))['results']]" \
        "$W/long-1m-torch.json" || rc=1
    return $rc
}


# issue 40: the same CP runs over NCCL's network transport (as between two hosts) and over its default (NVLink)
suite_cp2_net() {
    local rc=0 t cfg=configs/hybrid-1b-256k-h200x4.yaml n=${NET_STEPS:-4}
    local net=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo)
    for t in nvlink socket; do
        (
            # mpirun's ranks on this host inherit its environment; NCCL_DEBUG=INFO names each channel's transport
            export NCCL_DEBUG=INFO
            [ $t = nvlink ] || export "${net[@]}"
            suite_cp cp2-net-$t 2 --parts attn,gdn --T 131072 --gdn-T 131072 --heads 16,64 || exit 1
            suite_train cp2-net-step-$t 2 "$n" $cfg --set train.grad_accum=1 --set data.seq_len=262144 \
                --set parallel.cp=2 || exit 1
        ) || rc=1
        echo "cp2-net-$t: NCCL transports named in the logs:" \
            "$(cat "$L/cp2-net-$t.log" "$L/cp2-net-step-$t.log" | grep -o -E 'via (NET/[A-Za-z]+|P2P/[A-Za-z/]+|SHM)' |
                sort | uniq -c | tr -s ' \n' ' ')"
    done
    [ "$(grep -c -E 'via (P2P|SHM)' "$L/cp2-net-socket.log")" = 0 ] && grep -q 'via NET/Socket' "$L/cp2-net-socket.log" ||
        { echo "cp2-net: the socket runs did not run over NET/Socket alone"; rc=1; }
    rm -rf $TRAIN_DIR
    return $rc
}

# issue 39: a KDA hybrid's training step at 256k on two GPUs
suite_kda_step() {
    local cfg=configs/hybrid-1b-256k-h200x4.yaml n=${KDA_STEPS:-4}
    local k=(--set model.linear_attention=kda --set data.seq_len=262144 --set parallel.cp=2 --set parallel.dp=1
        --set train.grad_accum=1)
    build/ringscan plan $cfg "${k[@]}" --set slurm.gpus_per_node=2 > "$L/kda-step-plan.log" 2>&1
    grep -E "KDA|model FLOPs per step|verdict" "$L/kda-step-plan.log"
    suite_train kda-step-256k 2 "$n" $cfg "${k[@]}"
    local rc=$?
    rm -rf $TRAIN_DIR
    return $rc
}

suite_long_256k() {
    local cfg=configs/hybrid-1b-1m-h100x2.yaml rc=0 s=(--set data.seq_len=262144)
    suite_train long-256k-whole 2 4 $cfg "${s[@]}" --set checkpoint.chunk_rows=65536 --set checkpoint.offload=none ||
        rc=1
    suite_train long-256k-chunked 2 4 $cfg "${s[@]}" --set checkpoint.offload=none || rc=1
    suite_train long-256k-offload 2 4 $cfg "${s[@]}" || rc=1
    python3 - $TRAIN_DIR <<'EOF' || rc=1
import json, sys
d = sys.argv[1]
runs = {n: [json.loads(l) for l in open(f"{d}/long-256k-{n}/metrics.jsonl")] for n in ("whole", "chunked", "offload")}
# the steps after the first (warm-up: allocator, cuBLASLt plans, NCCL)
ms = {n: sum(r["ms"] for r in rs[1:]) / max(len(rs) - 1, 1) for n, rs in runs.items()}
print(f"256k, ms/step after step 1: whole {ms['whole']:.0f}, chunked {ms['chunked']:.0f} "
      f"(x{ms['chunked'] / ms['whole']:.3f}), chunked + offload {ms['offload']:.0f} "
      f"(x{ms['offload'] / ms['chunked']:.3f} of chunked, x{ms['offload'] / ms['whole']:.3f} of whole)")
same = all(a["loss"] == b["loss"] for a, b in zip(runs["offload"], runs["chunked"]))
close = max(abs(a["loss"] - b["loss"]) for a, b in zip(runs["chunked"], runs["whole"]))
print(f"losses: offload vs chunked {'bitwise equal' if same else 'DIFFER'}; chunked vs whole max |diff| {close:.2e}")
sys.exit(0 if same and close < 1e-2 else 1)
EOF
    rm -rf $TRAIN_DIR
    return $rc
}

# issue 36's continued-training proof: a random Qwen3.5 folder written by transformers, imported, trained at 256k
# on two GPUs (cp 2), exported back, loaded by transformers
suite_qwen35_train() {
    local cfg=configs/qwen3.5-2b-256k-h200x2.yaml PY=${PYTHON:-python3} rc=0 n=${QWEN35_STEPS:-4}
    local TRAIN_DIR=/tmp/gpu_runs_qwen35  # suite_train's folder for this part: its synth.tok over Qwen3.5's vocab
    local src=$TRAIN_DIR/hf-src out=$TRAIN_DIR/hf-export
    rm -rf $TRAIN_DIR && mkdir -p $TRAIN_DIR
    env -u PYTHONPATH timeout "$(left)" "$PY" tests/parity/qwen35_train_hf.py save $cfg $src > "$L/qwen35-save.log" 2>&1 || rc=1
    grep -E "^(PASS|FAIL)  " "$L/qwen35-save.log"
    if [ $rc -ne 0 ]; then
        tail -5 "$L/qwen35-save.log"
        echo "qwen35-train: FAIL (no source folder)"
        rm -rf $TRAIN_DIR
        return 1
    fi
    build/ringscan data synth $TRAIN_DIR/synth.tok --vocab 248320 --tokens 8388608 --min-doc 8388608 --max-doc 8388608 \
        --seed 1 > "$L/qwen35-data.log" 2>&1 || { echo "qwen35-train: FAIL (data synth)"; tail -3 "$L/qwen35-data.log"; return 1; }
    local s=(--set model.init_from=$src --set train.grad_accum=1)
    build/ringscan plan $cfg "${s[@]}" | grep -E "parameters|^  total|verdict" | head -4
    suite_train qwen35-train 2 "$n" $cfg "${s[@]}" || rc=1
    grep -iE "init_from|imported" "$L/qwen35-train.log" | head -3
    python3 - "$TRAIN_DIR/qwen35-train/metrics.jsonl" <<'PYEOF' || rc=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
after = rows[1:] or rows  # the steps after the first (warm-up: allocator, cuBLASLt plans, NCCL)
ms = sum(r["ms"] for r in after) / len(after)
tok = sum(r["tokens_per_s"] for r in after) / len(after)
mfu = sum(r.get("mfu", float("nan")) for r in after) / len(after)
peak = max(r.get("peak_mem_bytes", 0) for r in rows) / 2**30
losses = ", ".join("%.4f" % r["loss"] for r in rows)
print(f"qwen35-train: {len(rows)} steps, losses {losses}; after step 1: "
      f"{ms:.0f} ms/step, {tok:.0f} tokens/s (2 GPUs), MFU {100 * mfu:.1f}%, peak {peak:.2f} GiB (plan above)")
sys.exit(0 if all(r["loss"] == r["loss"] for r in rows) and len(rows) > 0 else 1)
PYEOF
    if [ "$(left)" -lt 20 ]; then  # timeout 0 would not bound the rest
        echo "qwen35-train: FAIL ($(left) s left: export and transformers' load not run)"
        rm -rf $TRAIN_DIR
        return 1
    fi
    timeout "$(left)" build/ringscan export $TRAIN_DIR/qwen35-train $out --format qwen3_5 --dtype fp32 \
        > "$L/qwen35-export.log" 2>&1 || { rc=1; tail -3 "$L/qwen35-export.log"; }
    env -u PYTHONPATH timeout "$(left)" "$PY" tests/parity/qwen35_train_hf.py load $out $src > "$L/qwen35-load.log" 2>&1 ||
        rc=1
    grep -E "^(PASS|FAIL)  |^qwen35_train_hf" "$L/qwen35-load.log"
    echo "qwen35-train: $([ $rc -eq 0 ] && echo PASS || echo FAIL)"
    rm -rf $TRAIN_DIR
    return $rc
}

# issue 37's model past 2B: the Qwen3.5-4B shape at 512k tokens on two GPUs with the config's shard stage and offload
suite_qwen35_4b_512k() {
    local cfg=configs/qwen3.5-4b-512k-h200x2.yaml rc=0 TRAIN_DIR=/tmp/gpu_runs_qwen35_4b
    local s=(--set model.init_from= --set model.tie_word_embeddings=${QWEN35_4B_TIE:-false} --set train.grad_accum=1)
    rm -rf $TRAIN_DIR && mkdir -p $TRAIN_DIR
    build/ringscan data synth $TRAIN_DIR/synth.tok --vocab 248320 --tokens 8388608 --min-doc 8388608 --max-doc 8388608 \
        --seed 1 > "$L/qwen35-4b-data.log" 2>&1 || { echo "qwen35-4b-512k: FAIL (data synth)"; return 1; }
    build/ringscan plan $cfg "${s[@]}" | grep -E "parameters|^  total|verdict|host memory|offloaded|states" | head -12
    suite_train qwen35-4b-512k 2 "${QWEN35_4B_STEPS:-3}" $cfg "${s[@]}" || rc=1
    rm -rf $TRAIN_DIR
    echo "qwen35-4b-512k: $([ $rc -eq 0 ] && echo PASS || echo FAIL)"
    return $rc
}

# issue 41's long configs on four or eight GPUs: NAME GPUS CONFIG [--set ...], trained LONG_STEPS steps from random
# weights on synthetic one-document samples (16M tokens: four 4M samples)
suite_long_config() {
    local name=$1 np=$2 cfg=$3 rc=0 TRAIN_DIR=/tmp/gpu_runs_long have
    shift 3
    have=$(nvidia-smi -L 2> /dev/null | wc -l)
    if [ "$have" -lt "$np" ]; then
        echo "$name: needs $np GPUs, the machine has $have: not run"
        return 1
    fi
    local s=(--set model.init_from= "$@")
    rm -rf $TRAIN_DIR && mkdir -p $TRAIN_DIR
    build/ringscan data synth $TRAIN_DIR/synth.tok --vocab 151936 --tokens 16777216 --min-doc 16777216 \
        --max-doc 16777216 --seed 1 > "$L/$name-data.log" 2>&1 || { echo "$name: FAIL (data synth)"; return 1; }
    build/ringscan plan $cfg "${s[@]}" --set slurm.gpus_per_node="$np" | grep -E "parameters|^  total|verdict|host memory" |
        head -8
    suite_train $name $np "${LONG_STEPS:-3}" $cfg "${s[@]}" || rc=1
    rm -rf $TRAIN_DIR
    echo "$name: $([ $rc -eq 0 ] && echo PASS || echo FAIL)"
    return $rc
}

# issue 36's one-GPU step: the Qwen3.5 2B shape at 32k and 128k, ours beside transformers' Qwen3_5ForCausalLM + FLA.
# Ours first (bench step, no peer: its rows come back whatever the peer does), then the peer on bench's own request
# for each length (step_hf.py, STEP_HF_MODEL=qwen3_5; bench_peer.c's contract), given what is left of the call
suite_qwen35_step() {
    local cfg=configs/qwen3.5-2b-256k-h200x2.yaml rc=0 T d=/tmp/gpu_runs_qwen35-step fla=1
    local opts=(step --config $cfg --warmup 1 --reps 3 --max-s 4)
    rm -rf $d && mkdir -p $d
    for T in 32768 131072; do
        suite_bench qwen35-step-$T "${opts[@]}" --tokens $T > /dev/null || rc=1
        build/ringscan bench "${opts[@]}" --tokens $T --write-requests --out $d/req-$T > /dev/null || rc=1
    done
    if ! python3 -c "import fla" 2> /dev/null; then
        fla=0
        rc=1
        echo "qwen35-step: FLA is not importable (PEER=$PEER; bench/peer/README.md: a snapshot's fla folder in .dev/peer):"
        echo "  transformers' side NOT run (its torch GDN fallback is no peer at these lengths), ours only"
    fi
    for T in 32768 131072; do
        [ $fla = 1 ] || break
        if [ "$(left)" -lt 75 ]; then  # timeout 0 would not bound it
            echo "qwen35-step: $(left) s left: transformers at $T tokens not run"
            rc=1
            break
        fi
        STEP_HF_MODEL=qwen3_5 timeout "$(($(left) - 15))" python3 bench/peer/step_hf.py --request $d/req-$T/request_step.json \
            --out "$W/qwen35-step-peer-$T.json" > "$L/qwen35-step-peer-$T.log" 2>&1 || { rc=1; tail -3 "$L/qwen35-step-peer-$T.log"; }
    done
    python3 - "$W" <<'PYEOF' || rc=1
import json, os, sys
w = sys.argv[1]
print(f"{'tokens':>7s} {'impl':18s} {'ms/step':>9s} {'tokens/s':>9s} {'TFLOP/s':>8s} {'MFU':>6s} {'peak GiB':>8s} {'ratio':>6s}")
ok, notes = True, []
for T in (32768, 131072):
    f = os.path.join(w, f"qwen35-step-{T}.json")
    if not os.path.exists(f):
        print(f"{T:7d} ringscan: no bench.json (see logs/qwen35-step-{T}.log)")
        ok = False
        continue
    b = json.load(open(f))
    r = b["step"]["table"][0]
    if "ms_step" not in r:
        print(f"{T:7d} ringscan error: {r.get('error', '?')}")
        ok = False
        continue
    flops_tok = r["mfu_percent"] / 100 * b["peak_tflops"] * 1e12 / r["tokens_per_s"]  # plan's model FLOPs per token
    print(f"{T:7d} {'ringscan':18s} {r['ms_step']:9.1f} {r['tokens_per_s']:9.0f} {flops_tok * r['tokens_per_s'] / 1e12:8.1f} "
          f"{r['mfu_percent']:5.1f}% {r['peak_alloc_gib']:8.2f} {'-':>6s}")
    pf = os.path.join(w, f"qwen35-step-peer-{T}.json")
    if not os.path.exists(pf):
        print(f"{T:7d} transformers: no result (see logs/qwen35-step-peer-{T}.log)")
        ok = False
        continue
    p = json.load(open(pf))
    notes = p.get("notes", notes)
    for q in p["results"]:
        if "ms_step" not in q:
            print(f"{T:7d} {q.get('impl', '?'):18s} error: {q.get('error', '?')}")
            ok = False
            continue
        tf = flops_tok * q["tokens_per_s"] / 1e12
        print(f"{T:7d} {q['impl']:18s} {q['ms_step']:9.1f} {q['tokens_per_s']:9.0f} {tf:8.1f} "
              f"{100 * tf / b['peak_tflops']:5.1f}% {q['peak_alloc_bytes'] / 2**30:8.2f} {q['ms_step'] / r['ms_step']:6.2f}")
        if q.get("note"):
            print(f"          ({q['note']})")
for n in notes[:6]:
    print("  peer note:", n)
print("TFLOP/s and MFU: plan's model FLOPs per token (attention causal) x tokens/s, over bench's peak; "
      "ratio = transformers ms / ringscan ms (> 1: ringscan faster)")
sys.exit(0 if ok else 1)
PYEOF
    return $rc
}

# suite_kda NAME SUITE ARGS...: suite_bench or suite_cp for Kimi Delta Attention; where it stops before any case
# (exit 2: no usable GPU, or the cuda backend's kda entries NULL) the reason from its log
suite_kda() {
    local name=$1 suite=$2 rc
    shift 2
    "$suite" "$name" "$@"
    rc=$?
    [ $rc -eq 2 ] && grep -m3 "^ringscan bench" "$L/$name.log"
    cp /tmp/gpu_runs_"$name"/peer_*.log "$L/" 2> /dev/null  # the peer's own log (FLA's compile and timing lines)
    return $rc
}

# bench_part PART: one part (gpu_run_parts' DISPATCH)
bench_part() {
    local part=$1
    case $part in
    gdn) suite_bench gdn gdn --peer --peer-timeout 200 ;;
    gdn-nopeer) suite_bench gdn-nopeer gdn ;;
    gdn-states) suite_bench gdn-states gdn --gdn-keep states ;;
    gdn32k) suite_gdn32k gdn32k ;;
    gdn-base) suite_gdn_base ;;
    step-base) suite_step_base ;;
    gdn-cycles) suite_gdn_cycles ;;
    kda) suite_kda kda suite_bench kda --T 32768,65536,131072 --heads 16,64 --doc-len 0,2048 --peer \
        --peer-timeout $(($(left) - ${KDA_OURS_S:-150})) ;;
    kda-nopeer) suite_kda kda-nopeer suite_bench kda --T 32768,65536,131072 --heads 16,64 --doc-len 0,2048 ;;
    cp-kda) suite_kda cp-kda suite_cp 2 --parts kda ${KDA_CP_CASES:---gdn-T 65536,131072 --heads 16,64} --peer \
        --peer-timeout $(($(left) - ${KDA_OURS_S:-200})) ;;
    cp2-net) suite_cp2_net ;;
    kda-step) suite_kda_step ;;
    cp-kda-nopeer) suite_kda cp-kda-nopeer suite_cp 2 --parts kda --gdn-T 65536,131072 --heads 16,64 ;;
    attn) suite_bench attn attn --peer --peer-timeout 200 ;;
    attn32k) suite_bench attn32k attn --T 32768 --peer --peer-timeout 120 ;;
    attn-cudnn) suite_attn_cudnn ;;
    attn-cudnn-det) suite_attn_cudnn_det ;;
    attn-cudnn-wide) suite_attn_cudnn_wide ;;
    step-cudnn) suite_step_cudnn ;;
    step) suite_step_none ;;
    remat) suite_bench remat step --profile 1 ;;
    cp-step) suite_cp_step ;;
    long-1m-torch) suite_long_1m_torch ;;
    long-256k) suite_long_256k ;;
    long-1m-cudnn) suite_long_1m_cudnn ;;
    step-states)
        suite_bench step-states step --profile 1 --set checkpoint.activations=none --set checkpoint.gdn_keep=states
        ;;
    cp2) suite_cp cp2 2 --peer --peer-timeout 240 ;;
    cp2-attn) suite_cp cp2-attn 2 --parts attn --T 131072,262144 --peer --peer-timeout 150 ;;
    cp2-gdn) suite_cp cp2-gdn 2 --parts gdn ;;
    cp2-ring-calls|cp2-ring-calls-cudnn)
        impl=ringscan
        [ "$part" = cp2-ring-calls-cudnn ] && impl=cudnn
        for i in $(seq "${RING_ROUNDS:-2}"); do
            for how in pairs auto; do
                suite_cp "cp2-ring-$impl-$how-$i" 2 --parts attn --T 131072 --attn-impl $impl --ring-calls $how || status=1
            done
        done ;;
    ring2-calls)
        timeout "$(left)" build/bench_kernels attn ring2 > "$L/ring2-calls.log" 2>&1
        r=$?
        grep -E "^ring2" "$L/ring2-calls.log"
        [ $r -eq 0 ]
        ;;
    cp2-ring-kv)  # the backward from the forward's K|V (kept) against passing it again, cuDNN then ours
        for impl in cudnn ringscan; do
            for i in $(seq "${RING_ROUNDS:-2}"); do
                for kv in passed kept; do
                    suite_cp "cp2-ring-$impl-$kv-$i" 2 --parts attn --T 131072 --attn-impl $impl --ring-kv $kv || status=1
                done
            done
        done ;;
    cp2-ring-dq)
        for i in 1 2; do
            for dq in 0 1; do
                suite_cp "cp2-ring-dq$dq-$i" 2 --parts attn --T 131072 --attn-tune dq_atomic=$dq || status=1
            done
        done ;;
    cp2-ring-ab)  # this build against RING_BASE_BIN, both kernels, alternated
        [ -x "${RING_BASE_BIN:-}" ] || { echo "cp2-ring-ab: RING_BASE_BIN (a ringscan to compare with) not set"; status=1; }
        for i in $(seq "${RING_ROUNDS:-2}"); do
            for k in cudnn ringscan; do
                for bin in base new; do
                    [ $bin = base ] && [ ! -x "${RING_BASE_BIN:-}" ] && continue
                    RS_BIN=$([ $bin = base ] && echo "$RING_BASE_BIN" || echo build/ringscan) \
                        suite_cp "cp2-ring-$k-$bin-$i" 2 --parts attn --T 131072 --attn-impl $k || status=1
                done
            done
        done ;;
    cp2-gdn-chain)
        for i in $(seq "${CHAIN_ROUNDS:-2}"); do
            for how in staged whole; do
                suite_cp "cp2-gdn-$how-$i" 2 --parts gdn ${GDN_CASES:---gdn-T 65536,131072 --heads 64} --gdn-chain $how \
                    || status=1
            done
        done ;;
    cp2-gdn-peer) suite_cp cp2-gdn-peer 2 --parts gdn ${GDN_CASES:-} --peer --peer-timeout $(($(left) - ${GDN_OURS_S:-200})) ;;
    cp2-512k) suite_cp cp2-512k 2 --parts attn --T 524288 --reps 2 --peer --peer-timeout 240 ;;
    cp2-attn-cudnn) suite_cp cp2-attn-cudnn 2 --parts attn --attn-impl cudnn --T 131072,262144,524288 --reps 3 --peer \
        --peer-timeout 240 ;;
    cp4-attn) suite_cp cp4-attn 4 --parts attn --T 131072,524288,1048576 --attn-shapes 16/16/128 --reps "${CP4_REPS:-2}" \
        --peer --peer-timeout "${CP4_PEER_S:-300}" ;;
    cp4-gdn) suite_cp cp4-gdn 4 --parts gdn --gdn-T 131072 --heads 64 --peer --peer-timeout $(($(left) - 120)) ;;
    cp4-gdn-nopeer) suite_cp cp4-gdn-nopeer 4 --parts gdn --gdn-T 131072 --heads 64 ;;
    cp4-gdn-schedules)
        for i in $(seq "${SCHED_ROUNDS:-2}"); do
            for how in hybrid scan chain; do
                suite_cp "cp4-gdn-$how-$i" 4 --parts gdn ${GDN_CASES:---gdn-T 131072,262144 --heads 16,64} --gdn-cp $how \
                    || status=1
            done
        done ;;
    cp4-step) suite_cp4_step ;;
    qwen35-train) suite_qwen35_train ;;
    qwen35-step) suite_qwen35_step ;;
    qwen35-4b-512k) suite_qwen35_4b_512k ;;
    long-4b-1m) suite_long_config long-4b-1m 4 configs/qwen3.5-4b-1m-h200x4.yaml ;;
    long-9b-1m) suite_long_config long-9b-1m 8 configs/qwen3.5-9b-1m-h200x8.yaml ;;
    long-9b-1m-80g) suite_long_config long-9b-1m-80g 8 configs/qwen3.5-9b-1m-h100x8.yaml ;;
    long-1b-4m) suite_long_config long-1b-4m 8 configs/hybrid-1b-4m-h200x8.yaml ;;
    long-smoke)
        suite_long_config long-smoke 1 configs/hybrid-1b-256k-h200x4.yaml --set parallel.cp=1 --set data.seq_len=131072 \
            --set train.grad_accum=1
        ;;
    *)
        echo "unknown part '$part' (gdn gdn-nopeer gdn-states gdn32k gdn-cycles gdn-base step-base kda kda-nopeer attn attn32k attn-cudnn"
        echo "  attn-cudnn-det attn-cudnn-wide step remat step-states step-cudnn cp-step cp2 cp2-attn cp2-attn-cudnn"
        echo "  cp2-gdn cp2-gdn-chain cp2-gdn-peer cp2-ring-calls cp2-ring-calls-cudnn cp2-ring-kv cp2-ring-dq cp2-ring-ab"
        echo "  ring2-calls cp2-512k cp4-attn cp4-gdn cp4-gdn-nopeer cp4-gdn-schedules cp4-step long-1m-torch long-1m-cudnn"
        echo "  long-256k qwen35-train qwen35-step qwen35-4b-512k cp-kda cp-kda-nopeer cp2-net kda-step long-4b-1m"
        echo "  long-9b-1m long-9b-1m-80g long-1b-4m long-smoke;"
        echo "  the regression checks are tests/cuda/gpu_regress.sh's)"
        false
        ;;
    esac
}

gpu_run_parts bench_part "$@"
