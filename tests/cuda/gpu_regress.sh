#!/bin/bash
# gpu_regress.sh — the GPU regression checks: what fails when the cuda backend's behaviour breaks. Run on the
# lent GPU machine from the repository root, with the binaries built on the CPU machine and carried in build/
# (build/ringscan, build/test_cuda, build/parity_step, build/kda_case; CI only compiles them):
#
#   NCCL_NVLS_ENABLE=0 bash tests/cuda/gpu_regress.sh PART...      e.g.  ... gpu_regress.sh parity cp-parity
#
# Every part writes its logs under logs/ and prints a summary line; all of it ends in $OUT/gpu_regress.tgz.
# Exit status 1 if any check failed (or a part timed out or was not started), else 0. The benchmarks and
# A/B experiments are bench/gpu_runs.sh. Parts, in the order given:
#   parity     every build/test_cuda case but the cuda_big_* ones, dealt over the machine's GPUs (those in
#              CUDA_VISIBLE_DEVICES if set), and beside
#              them tests/cuda/model_check.sh (20 steps): the GPU parity of every kernel and of the model
#   parity-gdn the test_cuda cases of the delta rule alone (no model_check)
#   kda-parity the test_cuda cases of Kimi Delta Attention and, beside them, model_check of a KDA hybrid
#              (CASE_SETS model.linear_attention=kda model.linear_num_value_heads=2; issue 39). ~1 min
#   kda-fla    tests/parity/kda_fla_check.py (issue 39): our KDA chunk kernels (build/kda_case) and FLA's chunk_kda
#              (PEER on PYTHONPATH) against one float64 reference, forward and every gradient, FLA's own tolerances
#              as the bound; a broken case must FAIL. ~1 min warm, plus FLA's Triton compiles cold (~3 min)
#   big        the cuda_big_* cases (entries at sizes where offsets pass 2^31; tests/cuda/test_cuda_big.cu),
#              one process each (up to ~72 GiB of device memory; parity leaves them out)
#   attn-cudnn-parity  the cuda_attention_cudnn_* cases with RS_CUDNN_REQUIRED=1 (parity against the cpu
#              oracle, the route, a ring's pieces, determinism). ~1 min
#   attn-auto  device.attention_kernel auto, the default: train 2 steps with cuDNN and, given a wrong
#              cudnn_library, with ours, saying which; on a two-GPU machine also dp 2 with the wrong library on
#              rank 1 only: ours on both ranks, said. ~30 s
#   cp-parity  tests/cuda/cp_gpu_check.sh (two GPUs): cuda cp 2 / dp 2 against one GPU and the cpu oracle,
#              50-step curves, remat counters, resume under cp 2 (the CP equivalence)
#   kda-cp-parity  the same with the KDA hybrid (issue 39: CASE_SETS model.linear_attention=kda
#              model.linear_num_value_heads=2): its cuda cp 2 / dp 2 against one GPU and the cpu oracle, curves, resume
#   cp4-parity (4 GPUs) cp_gpu_check.sh's part 6 alone (MULTI_ONLY=4): cuda cp 4 and dp 2 x cp 2 against the cpu
#              oracle, the 50-step curve of dp 2 x cp 2 against dp 1 x cp 4
#   cp8-parity (8 GPUs, issue 41) the same at N = 8: cuda cp 8 and dp 2 x cp 4, the curve of dp 2 x cp 4 against cp 8
#   cp2-multi  (2 GPUs) the same steps at N = 2 (cp 2, dp 2 x cp 1): the part's own check where no four- or eight-GPU
#              machine is lent
#   long-parity  tests/cuda/long_gpu_check.sh (two GPUs): row chunks against the unchunked run and the cpu
#              oracle, offload against none (bitwise), one GPU and cp 2; and test_cuda cuda_copyq_order. ~1 min
#   hf         the Hugging Face export against transformers (tests/parity/hf_check.py): a tiny run trained 100
#              steps on the GPU, exported; transformers' loss and gradients against ringscan's, then a wrong GDN
#              layout that must FAIL; and `ringscan eval` on cuda (one GPU, cp 2 on two) against the cpu oracle
#   qwen35     Qwen3.5 checkpoints against transformers' Qwen3_5ForCausalLM (tests/parity/qwen35_check.py): random
#              weights saved by transformers (fp32 sharded, bf16, composite), imported; loss and every gradient on
#              cpu and cuda; export back, logits equal; the mrope == 1-D RoPE claim; wrong layouts that must FAIL.
#              QWEN35_BIG=1 adds the 0.8B shape (cuda then cpu, 128 tokens, the grads check, ~6 min). ~2 min (small)
#   shard      (two GPUs) parallel.shard (issue 37): the tiny config at cp 2, 20 steps with none, optimizer,
#              gradients and weights: losses equal within 2e-3 relative (bf16; weights against gradients printed
#              too, the same sums); then the 1B 256k config at cp 2 (SHARD_CONFIG), 3 steps per stage: memory
#              beside plan, s/step (SHARD_STAGES: the stages of this second half, default all four). ~9 min
#   cluster    (two GPUs; issue 40) tests/cuda/gpu_cluster_check.sh: a two-node Slurm cluster on the machine, one GPU
#              per node, from the packages slurm/gpu-cluster/bring.sh carried (CLUSTER_BUNDLE, default
#              .carry/gpu-cluster: name it in the device tool's carry); a cp 2 job across the nodes over NCCL's
#              network transport against one node, stopped by the warning signal and by SIGTERM, a rank killed
#              (watchdog, exit 76); each resumed run bitwise equal to the uninterrupted one. ~4-6 min
# The configs that must fit (each a training run of a few steps that fails if it does not; run it alone in a call):
#   long-1m    configs/hybrid-1b-1m-h100x2.yaml: 3 steps of 1,048,576 tokens on two GPUs (cp 2, chunked, offload
#              host): its plan, s/step, memory beside plan. ~6 min (with AS_H100=1 on H200s: the H100 fit);
#              LONG_1M_STEPS (default 3), LONG_1M_SET (more --set options, e.g. "--set device.profile=true": the time
#              of every Backend entry, printed at the end of the log)
#   long-1gpu  the same model on ONE GPU at the longest sample plan fits in 79 GiB: LONG_1GPU_T (default 720,896
#              tokens) with gdn_keep LONG_1GPU_KEEP (default none), 2 steps. ~4 min (AS_H100=1 on H200s)
#   cp4-1m     (4 GPUs) the 1M config at cp 4 (CP4_CONFIG; CP_STEPS, default 4)
# The environment (OUT, MPI_LIB, LIMIT_S, AS_H100, ...) is tests/cuda/gpu_env.sh's.
set -u
cd "$(dirname "$0")/../.." || exit 2
GPU_RUNNER=gpu_regress
. tests/cuda/gpu_env.sh

# suite_parity [PATTERN [SETS]]: the test_cuda cases matching PATTERN (every case but the cuda_big_* ones if
# none) and, with no PATTERN or with SETS, model_check beside them (of the config with SETS, model_check.sh's
# CASE_SETS); each distinct failed check is printed once
suite_parity() {
    local mc="" cases ngpu g gpus log=$L/parity${1:+-$1}.log pids=() rc=0 mrc=0
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then  # the GPUs given (another part may hold the rest)
        IFS=, read -ra gpus <<< "$CUDA_VISIBLE_DEVICES"
    else
        ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
        mapfile -t gpus < <(seq 0 $((ngpu > 1 ? ngpu - 1 : 0)))
    fi
    ngpu=${#gpus[@]}
    if [ -z "${1:-}" ] || [ -n "${2:-}" ]; then  # on the last GPU, beside the cases
        CUDA_VISIBLE_DEVICES=${gpus[ngpu - 1]} CASE_SETS="${2:-}" STEPS=20 TRAIN_STEPS=20 timeout "$(left)" \
            tests/cuda/model_check.sh build /tmp/gpu_regress_mc > "$L/model_check${1:+-$1}.log" 2>&1 &
        mc=$!
    fi
    mapfile -t cases < <(build/test_cuda --list | grep -v -E "_big_" | grep -E "${1:-.}")
    # the cases dealt round-robin over the machine's GPUs, one test_cuda process each; the GPU machine has
    # cuDNN: its cases must run there, not print SKIP and pass
    for ((g = 0; g < ngpu; g++)); do
        local mine=()
        for ((i = g; i < ${#cases[@]}; i += ngpu)); do mine+=("${cases[i]}"); done
        [ ${#mine[@]} -gt 0 ] || continue
        CUDA_VISIBLE_DEVICES=${gpus[g]} RS_CUDNN_REQUIRED=${RS_CUDNN_REQUIRED:-1} timeout "$(left)" build/test_cuda "${mine[@]}" \
            > "$log.$g" 2>&1 &
        pids+=($!)
    done
    for g in "${pids[@]}"; do wait "$g" || rc=1; done
    cat "$log".* > "$log" && rm -f "$log".*
    echo "parity${1:+ ($1)} rc=$rc cases=${#cases[@]} on $ngpu GPU(s) checks_ok=$(grep -c ' ok$' "$log")" \
        "failed=$(grep -c FAIL "$log") skipped=$(grep -c SKIP "$log");" \
        "slowest: $(grep -E '^== .*: (ok|FAILED) \(' "$log" | sort -t'(' -k2 -g -r | head -3 | sed 's/^== //' | tr '\n' ' ')"
    grep FAIL "$log" | sed 's/: [a-zA-Z_|]* differs between two runs/: ... differs/' | sort | uniq -c | head -20
    if [ -n "$mc" ]; then
        wait "$mc"
        mrc=$?
        echo "model_check${2:+ ($2)} rc=$mrc"
        grep -E "FAIL|worst|curve|loss" "$L/model_check${1:+-$1}.log" | tail -4
    fi
    [ $rc -eq 0 ] && [ $mrc -eq 0 ]
}

# the cuda_big_* cases, one process each (cuda_big_gdn keeps its ~58 GB workspace to the end)
suite_big() {
    local rc=0 c
    for c in $(build/test_cuda --list | grep -E "^cuda_big_"); do
        if [ "$(left)" -le 30 ]; then
            echo "$c: not started (LIMIT_S)"
            rc=1
            continue
        fi
        timeout "$(left)" build/test_cuda "$c" > "$L/$c.log" 2>&1
        local crc=$?
        [ $crc -eq 0 ] || rc=1
        echo "$c rc=$crc checks_ok=$(grep -c ' ok$' "$L/$c.log") failed=$(grep -c FAIL "$L/$c.log")"
        grep -E "FAIL|big attention:|cudaMalloc" "$L/$c.log" | head -5
    done
    return $rc
}

# the cuDNN route's parity cases of test_cuda (cuDNN required)
suite_attn_cudnn_parity() {
    local rc=0
    RS_CUDNN_REQUIRED=1 timeout "$(left)" build/test_cuda $(build/test_cuda --list | grep -E "^cuda_attention_cudnn_") \
        > "$L/attn-cudnn-parity.log" 2>&1 || rc=1
    echo "attn-cudnn parity rc=$rc checks_ok=$(grep -c ' ok$' "$L/attn-cudnn-parity.log")" \
        "failed=$(grep -c FAIL "$L/attn-cudnn-parity.log")"
    grep -E "FAIL|error|cuDNN|SKIP|calls on|calls each way|bitwise|DIFFER|hint" "$L/attn-cudnn-parity.log" | head -40
    return $rc
}

# device.attention_kernel auto (the default): cudnn where cuDNN loads, ours where not, one kernel for all ranks
suite_attn_auto() {
    local rc=0
    # no attention_kernel set: cudnn here (cuDNN loads), ours where it cannot load (a wrong path), said
    local w=/tmp/gpu_regress_auto lib
    rm -rf $w && mkdir -p $w && build/ringscan data synth $w/d.tok --seed 1 > /dev/null || rc=1
    for lib in "" /nonexistent/libcudnn.so.9; do
        timeout "$(left)" build/ringscan train configs/tiny-cpu.yaml --set device.kind=cuda --set parallel.cp=1 \
            ${lib:+--set device.cudnn_library=$lib} --set train.steps=2 --set train.warmup_steps=1 \
            --set data.path=$w/d.tok --set run.out_dir=$w/run${lib:+-nolib} > "$L/attn-auto${lib:+-nolib}.log" 2>&1 || rc=1
        local want="cudnn, cuDNN loaded"
        [ -n "$lib" ] && want="attention: ours, not cuDNN's"
        if grep -q "$want" "$L/attn-auto${lib:+-nolib}.log" && grep -q "^step *2/2" "$L/attn-auto${lib:+-nolib}.log"; then
            echo "auto${lib:+ with cudnn_library $lib}: '$want', 2 steps: ok"
        else
            echo "auto${lib:+ with cudnn_library $lib}: FAIL (no '$want' or no step 2)"; rc=1
            tail -3 "$L/attn-auto${lib:+-nolib}.log"
        fi
    done
    # two ranks (two GPUs), cuDNN loadable on rank 0 only: auto agrees on ours for both, rank 1 named
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
        local a=(train configs/tiny-cpu.yaml --set device.kind=cuda --set parallel.cp=1 --set parallel.dp=2
            --set slurm.gpus_per_node=2 --set device.attention_kernel=auto --set train.steps=2
            --set train.warmup_steps=1 --set data.path=$w/d.tok --set run.out_dir=$w/run-ranks)
        timeout "$(left)" mpirun --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH \
            -np 1 build/ringscan "${a[@]}" : -np 1 build/ringscan "${a[@]}" \
            --set device.cudnn_library=/nonexistent/libcudnn.so.9 > "$L/attn-auto-ranks.log" 2>&1 || rc=1
        if grep -q "ours on every rank .*cuDNN did not load on 1 of 2 ranks; rank 1 on" "$L/attn-auto-ranks.log" &&
            grep -q "^step *2/2" "$L/attn-auto-ranks.log"; then
            echo "auto over 2 ranks, cuDNN on rank 0 only: ours on both, rank 1 named, 2 steps: ok"
        else
            echo "auto over 2 ranks, cuDNN on rank 0 only: FAIL"; rc=1
            grep -E "attention|error" "$L/attn-auto-ranks.log" | head -5
        fi
    fi
    return $rc
}

# suite_long_parity: tests/cuda/long_gpu_check.sh and the copy queue's test_cuda case
suite_long_parity() {
    local rc=0
    timeout "$(left)" tests/cuda/long_gpu_check.sh build /tmp/gpu_regress_long > "$L/long_gpu_check.log" 2>&1 || rc=1
    grep -E "^==|^-- |^  cuda|^parity_step|long_gpu_check:|FAIL" "$L/long_gpu_check.log" | tail -40
    build/test_cuda cuda_copyq_order > "$L/test_cuda_copyq.log" 2>&1 || rc=1
    tail -3 "$L/test_cuda_copyq.log"
    return $rc
}

# the export against transformers (torch path on CPU: fla off PYTHONPATH); the wrong layouts must fail
suite_hf() {
    local w=/tmp/gpu_regress_hf PY=${PYTHON:-python3} rc=0 b
    rm -rf "$w" && mkdir -p "$w"
    build/ringscan data synth "$w/recall.tok" --seed 1 > "$L/hf-train.log" 2>&1 &&
        timeout "$(left)" build/ringscan train configs/tiny-cpu.yaml --set parallel.cp=1 --set device.kind=cuda \
            --set train.steps=100 --set data.path="$w/recall.tok" --set run.out_dir="$w/run" >> "$L/hf-train.log" 2>&1
    if [ $? -ne 0 ]; then
        echo "hf: training the tiny run failed"; tail -5 "$L/hf-train.log"; return 1
    fi
    grep -E "^step +100/" "$L/hf-train.log"
    # ringscan eval of the same run on cuda (one GPU, and cp 2 when there are two) against the cpu oracle:
    # the overall loss and every context bucket's within 1e-2 relative (bf16 activations against fp32)
    local ev=(build/ringscan eval "$w/run" --data "$w/recall.tok" --tokens 32768)
    timeout "$(left)" "${ev[@]}" --out "$w/eval-cpu.json" --set device.kind=cpu > "$L/hf-eval.log" 2>&1 &&
        timeout "$(left)" "${ev[@]}" --out "$w/eval-cuda.json" --set device.kind=cuda >> "$L/hf-eval.log" 2>&1 || rc=1
    if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
        timeout "$(left)" mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH \
            "${ev[@]}" --out "$w/eval-cuda-cp2.json" --set device.kind=cuda --set parallel.cp=2 --set parallel.dp=1 \
            >> "$L/hf-eval.log" 2>&1 || rc=1
    fi
    "$PY" - "$w" <<'EOF' || rc=1
import glob, json, sys
w = sys.argv[1]
ref = json.load(open(f"{w}/eval-cpu.json"))
ok = True
for f in sorted(glob.glob(f"{w}/eval-cuda*.json")):
    got = json.load(open(f))
    worst = max([abs(got["loss"] - ref["loss"]) / ref["loss"]] +
                [abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(got["buckets"], ref["buckets"])])
    same = [(a["from"], a["tokens"]) for a in got["buckets"]] == [(b["from"], b["tokens"]) for b in ref["buckets"]]
    ok &= same and worst <= 1e-2
    print(f"eval {f.split('/')[-1]}: loss {got['loss']:.6f} vs cpu {ref['loss']:.6f}, worst bucket rel {worst:.2e} "
          f"(bound 1e-2), buckets {'the same' if same else 'DIFFER'}: {'ok' if same and worst <= 1e-2 else 'FAIL'}")
sys.exit(0 if ok else 1)
EOF
    env -u PYTHONPATH timeout "$(left)" "$PY" tests/parity/hf_check.py "$w/run" "$w/recall.tok" "$w/check" \
        > "$L/hf.log" 2>&1 || rc=1
    grep -E "single:|packed:|^hf_check" "$L/hf.log" | tail -6
    for b in swap-v-heads deinterleave; do
        env -u PYTHONPATH timeout "$(left)" "$PY" tests/parity/hf_check.py "$w/run" "$w/recall.tok" "$w/check" \
            --break "$b" --scale 30 --top 1 > "$L/hf-break-$b.log" 2>&1
        local brc=$?
        grep -E "FAIL|PASS" "$L/hf-break-$b.log" | tail -3
        [ $brc -eq 1 ] && grep -q "^hf_check: FAIL" "$L/hf-break-$b.log" ||
            { echo "hf: --break $b did not fail its comparisons (rc $brc)"; tail -3 "$L/hf-break-$b.log"; rc=1; }
    done
    return $rc
}

# Qwen3.5 against transformers (issue 36): one PASS/FAIL line per check, the summary last
suite_qwen35() {
    local w=/tmp/gpu_regress_qwen35 PY=${PYTHON:-python3} rc=0
    rm -rf "$w" && mkdir -p "$w"
    env -u PYTHONPATH timeout "$(left)" "$PY" tests/parity/qwen35_check.py "$w/small" > "$L/qwen35.log" 2>&1 || rc=1
    grep -E "^(PASS|FAIL|SKIP)  |^qwen35_check" "$L/qwen35.log"
    if [ "${QWEN35_BIG:-0}" = 1 ]; then
        for dev in cuda cpu; do  # cuda: transformers on the GPU too (seconds); cpu: its float64 bound is minutes
            env -u PYTHONPATH timeout "$(left)" "$PY" tests/parity/qwen35_check.py "$w/big" --shape 0.8b --seq-len 128 \
                --batch 1 --checks grads --folders text-fp32 --devices $dev --hf-device $dev \
                > "$L/qwen35-big-$dev.log" 2>&1 || rc=1
            grep -E "^(PASS|FAIL|SKIP)  |^qwen35_check" "$L/qwen35-big-$dev.log"
        done
    fi
    return $rc
}

# the 1B at 1M tokens on two GPUs (issue 18): its plan, then 3 steps
suite_long_1m() {
    local cfg=configs/hybrid-1b-1m-h100x2.yaml rc=0
    build/ringscan plan $cfg | grep -E "^  total|^  kept|^  \(kept|verdict"
    free -g | head -2
    suite_train long-1m 2 "${LONG_1M_STEPS:-3}" $cfg ${LONG_1M_SET:-} || rc=1
    rm -rf $TRAIN_DIR
    return $rc
}

# the longest sample plan fits on one 80 GB GPU with room for the ~2% measured above plan (LONG_1GPU_T, default
# 720,896 tokens with gdn_keep none: 74.31 GiB of 79 under remat, offload host), 2 optimizer steps on GPU 0
suite_long_1gpu() {
    local cfg=configs/hybrid-1b-1m-h100x2.yaml rc=0 s=(--set parallel.cp=1 --set data.seq_len=${LONG_1GPU_T:-720896}
        --set checkpoint.gdn_keep=${LONG_1GPU_KEEP:-none})
    build/ringscan plan $cfg "${s[@]}" --set slurm.gpus_per_node=1 | grep -E "^  total  |verdict"
    suite_train long-1gpu 1 2 $cfg "${s[@]}" || rc=1
    rm -rf $TRAIN_DIR
    return $rc
}

# four GPUs (issue 21): the 1M config at cp 4 (CP4_CONFIG, default the h200x4 one, the h100x4 one on H100s)
suite_cp4_1m() {
    local c1m=configs/hybrid-1b-1m-h200x4.yaml
    nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100 && c1m=configs/hybrid-1b-1m-h100x4.yaml
    suite_train cp4-1m 4 ${CP_STEPS:-4} "${CP4_CONFIG:-$c1m}" --set train.grad_accum=1 \
        --set parallel.cp=4 --set parallel.dp=1
}

# parallel.shard against none (issue 37): tiny at cp 2, then the 1B at 256k tokens at cp 2, memory beside plan
suite_shard() {
    local w=/tmp/gpu_regress_shard rc=0 st cfg=${SHARD_CONFIG:-configs/hybrid-1b-256k-h200x4.yaml}
    rm -rf $w && mkdir -p $w && build/ringscan data synth $w/d.tok --seed 1 > /dev/null || rc=1
    for st in none optimizer gradients weights; do
        timeout "$(left)" mpirun --allow-run-as-root --bind-to none -np 2 -x NCCL_NVLS_ENABLE=0 -x LD_LIBRARY_PATH \
            build/ringscan train configs/tiny-cpu.yaml --set device.kind=cuda --set parallel.cp=2 \
            --set slurm.gpus_per_node=2 --set train.steps=20 --set train.warmup_steps=2 --set checkpoint.every=0 \
            --set parallel.shard=$st --set data.path=$w/d.tok --set run.out_dir=$w/tiny-$st > "$L/shard-tiny-$st.log" 2>&1 || rc=1
    done
    python3 - $w <<'PY' || rc=1
import json, sys
w = sys.argv[1]
loss = {st: [json.loads(l)["loss"] for l in open(f"{w}/tiny-{st}/metrics.jsonl")]
        for st in ("none", "optimizer", "gradients", "weights")}
bad = 0
if len(loss["weights"]) == len(loss["gradients"]) == 20:
    worst = max(abs(a - b) / abs(a) for a, b in zip(loss["gradients"], loss["weights"]))
    print(f"shard tiny cp 2: weights against gradients, worst loss rel diff {worst:.3g} (0 where the kernels are "
          "deterministic)")
for st in ("optimizer", "gradients", "weights"):
    worst = max(abs(a - b) / abs(a) for a, b in zip(loss["none"], loss[st])) if len(loss[st]) == 20 else 1
    ok = worst <= 2e-3
    bad |= not ok
    print(f"shard tiny cp 2: {st} against none over {len(loss[st])} steps, worst loss rel diff {worst:.3g}: {'ok' if ok else 'FAIL'}")
sys.exit(bad)
PY
    for st in ${SHARD_STAGES:-none optimizer gradients weights}; do
        build/ringscan plan $cfg --set parallel.cp=2 --set slurm.gpus_per_node=2 --set parallel.shard=$st |
            grep -E "^  total  |^  (none|optimizer|gradients|weights) +states|verdict"
        suite_train shard-1b-$st 2 3 $cfg --set parallel.cp=2 --set parallel.dp=1 --set parallel.shard=$st || rc=1
    done
    rm -rf $TRAIN_DIR $w
    return $rc
}

# regress_part PART: one part (gpu_run_parts' DISPATCH)
regress_part() {
    case $1 in
    parity) suite_parity ;;
    parity-gdn) suite_parity gdn ;;
    kda-parity) suite_parity kda "model.linear_attention=kda model.linear_num_value_heads=2" ;;
    kda-fla)
        timeout "$(left)" "${PYTHON:-python3}" tests/parity/kda_fla_check.py /tmp/gpu_regress_kda_fla > "$L/kda-fla.log" 2>&1
        r=$?
        grep -E "^(PASS|FAIL)|^kda_fla_check" "$L/kda-fla.log" | cut -c1-600
        [ $r -eq 0 ]
        ;;
    big) suite_big ;;
    attn-cudnn-parity) suite_attn_cudnn_parity ;;
    attn-auto) suite_attn_auto ;;
    cp-parity)
        timeout "$(left)" tests/cuda/cp_gpu_check.sh build /tmp/gpu_regress_cp > "$L/cp-parity.log" 2>&1
        r=$?
        grep -E "^==|^--|FAIL|within|ok$|resume|counters|curve|worst|cp_gpu_check" "$L/cp-parity.log" | head -60
        [ $r -eq 0 ]
        ;;
    kda-cp-parity)
        CASE_SETS="model.linear_attention=kda model.linear_num_value_heads=2" timeout "$(left)" \
            tests/cuda/cp_gpu_check.sh build /tmp/gpu_regress_kda_cp > "$L/kda-cp-parity.log" 2>&1
        r=$?
        grep -E "^==|^--|FAIL|within|ok$|resume|counters|curve|worst|cp_gpu_check" "$L/kda-cp-parity.log" | head -60
        [ $r -eq 0 ]
        ;;
    cp2-multi | cp4-parity | cp8-parity)
        local n=${1:2:1}
        MULTI_ONLY=$n timeout "$(left)" tests/cuda/cp_gpu_check.sh build /tmp/gpu_regress_cp$n > "$L/$1.log" 2>&1
        r=$?
        grep -E "^==|^--|FAIL|within|ok$|curve|worst|cp_gpu_check|needs" "$L/$1.log" | grep -v "^model" | head -60
        [ $r -eq 0 ]
        ;;
    long-parity) suite_long_parity ;;
    hf) suite_hf ;;
    qwen35) suite_qwen35 ;;
    long-1m) suite_long_1m ;;
    long-1gpu) suite_long_1gpu ;;
    cp4-1m) suite_cp4_1m ;;
    shard) suite_shard ;;
    cluster)
        timeout "$(left)" tests/cuda/gpu_cluster_check.sh "${CLUSTER_BUNDLE:-.carry/gpu-cluster}" "$L/cluster" \
            > "$L/cluster.log" 2>&1
        r=$?
        grep -E "^(PASS|FAIL|INFO|==)" "$L/cluster.log"
        [ $r -eq 0 ]
        ;;
    *)
        echo "unknown part '$1' (parity parity-gdn kda-parity kda-fla big attn-cudnn-parity attn-auto cp-parity kda-cp-parity cp2-multi cp4-parity cp8-parity"
        echo "  long-parity hf qwen35"
        echo "  long-1m long-1gpu cp4-1m shard cluster; the benchmarks are bench/gpu_runs.sh's)"
        false
        ;;
    esac
}

gpu_run_parts regress_part "$@"
