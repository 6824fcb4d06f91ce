"""test_long.py — long samples on few GPUs (issue 18): a layer's per-token work in row chunks
(checkpoint.chunk_rows) and the kept activations waiting in host memory (checkpoint.offload: host),
on the cpu oracle, one process and cp 2 under mpirun.

1. Chunking changes only the order of fp32 sums: every chunk size (7, 64, 100, 200; all but 64
   divide neither the fragment, 1024 or 256 rows, nor 64) gives the loss and every parameter
   gradient of the unchunked run (chunk = the fragment) within CHUNK_BOUND relative
   L2 per tensor (measured worst 1.3e-6 on earlier build machines, 3.3e-6 on another seed, 1.6e-5 at
   chunk 7 on an AMD EPYC one, whose OpenBLAS runs other fp32 kernels, on the 4-element A_log / dt_bias
   gradients, where 2048 per-token terms cancel; the large tensors 7.4e-6 there), under the none and
   remat policies.
   A chunk that reads a stale conv halo, or a halo gradient not taken back to the previous chunk's
   rows, was measured at 0.85 and 0.24 relative (the bound misses them by more than 3 orders).
2. Offload moves bytes and nothing else: the gradients and loss are bitwise those without it, for
   one process and cp 2, chunked or not, under none and remat; the model keeps the head and two
   layers' slots on the device and the other layers in host memory, as plan says.
3. checkpoint.activations none keeps the per-token tensors the backward reads (ln1, the projections,
   h, the MLP's) whole per layer and recomputes nothing: with row chunks (100, 7), one process and
   cp 2, its gradients and loss equal remat's and full's within POLICY_BOUND (measured bitwise: the
   backward reads what the same kernels wrote in the forward), and its counters say no block and no
   per-token forward ran again, while remat and full rerun each chunk's ln1 + in_proj, h and MLP and
   the conv halo rows' ln1 exactly as often as the chunk layout says; under checkpoint.input_rows whole
   (the recompute's ln1 and in_proj outputs kept with every row to the backward) only each chunk's h
   and MLP, with the same gradients as none (bitwise as measured). The counter counts where the
   work runs, not where it is decided: a none that recomputed anyway was measured to fail it (324
   reruns), one whose backward read another chunk's MLP rows to fail the gradients (1.4 relative).
4. Plan: at 1M tokens on two 79 GiB GPUs the 1B fits with offload (leaving 2 GiB: PLAN_1M_MAX) and
   not without; host memory per node is counted by hand and a node too small is refused with the
   numbers; the ring forward's and backward's buffers share memory.
"""
import json
import sys

import numpy as np
import pytest

from conftest import BUILD, ROOT, RINGSCAN, run

sys.path.insert(0, str(ROOT / "tests" / "parity"))
import safetensors_io  # noqa: E402

T = 1024          # tokens per sample; 2 samples; cp 2 gives fragments of 256 rows
CHUNK_BOUND = 5e-5


@pytest.fixture(scope="module")
def case(tmp_path_factory, ringscan):
    d = tmp_path_factory.mktemp("long")
    r = run(["/usr/bin/python3", ROOT / "tests/parity/make_case.py", "configs/tiny-cpu.yaml", d,
             "--seq-len", str(T), "--batch", "2", "--seed", "5"], timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    return d


def step(case, out, cp, *sets, policy="remat"):
    args = ["mpirun", "-np", str(cp), "--oversubscribe", BUILD / "parity_step", case, "--set", f"parallel.cp={cp}",
            "--policy", policy, "--out", out]
    for s in sets:
        args += ["--set", s]
    r = run(args, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    counters = json.loads(r.stdout.split("counters ", 1)[1].splitlines()[0])
    return safetensors_io.load(out), counters


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    n = np.linalg.norm(b)
    return np.linalg.norm(a - b) / n if n > 0 else np.linalg.norm(a - b)


@pytest.mark.parametrize("cp", [1, 2])
@pytest.mark.parametrize("policy,inputs", [("none", "auto"), ("remat", "whole"), ("remat", "chunk")])
def test_chunked_equals_unchunked(case, tmp_path, cp, policy, inputs):
    ins = f"checkpoint.input_rows={inputs}"
    ref, _ = step(case, tmp_path / "whole.safetensors", cp, f"checkpoint.chunk_rows={T}", ins, policy=policy)
    for rows in (7, 64, 100, 200):
        got, _ = step(case, tmp_path / f"r{rows}.safetensors", cp, f"checkpoint.chunk_rows={rows}", ins,
                      policy=policy)
        worst = max((rel(got[k], ref[k]), k) for k in ref)
        print(f"cp {cp} {policy} chunk_rows {rows}: loss {float(got['loss']):.9f} vs {float(ref['loss']):.9f}, "
              f"worst gradient rel err {worst[0]:.2e} ({worst[1]})")
        assert rel(got["loss"], ref["loss"]) <= 1e-6, (rows, got["loss"], ref["loss"])
        assert worst[0] <= CHUNK_BOUND, (cp, policy, rows, worst)
        # not bitwise: the chunks really ran (a chunk size that was ignored would give the same bits)
        assert any(not np.array_equal(got[k], ref[k]) for k in ref), rows


POLICY_BOUND = 1e-6


def rerun_chunks(cp, rows, inputs):
    """chunk recomputes (model.h chunk_recomputes) of one remat / full step on rank 0 of this case: tiny-cpu's
    GDN layers 0-2 and attention layer 3, 2 samples of T rows, fragments of T / 2cp rows under CP. Per
    chunk of every layer its ln1 + in_proj, its h and its MLP; per GDN chunk but a fragment's first, the ln1
    of the conv halo rows before it; under CP per sample and GDN layer one tail ln1 (rank 0 holds
    segments 0 and 2cp-1: segment 0's tail takes its halo gradient back from segment 1). Under
    checkpoint.input_rows whole every ln1 and in_proj has every row from the recompute: h and the MLP only."""
    frags = 2 * (2 if cp > 1 else 1)
    chunks = frags * -(-(2 * T // cp // frags) // rows)
    if inputs == "whole":
        return 4 * 2 * chunks
    tails = 2 if cp > 1 else 0
    return 3 * (3 * chunks + (chunks - frags) + tails) + 3 * chunks


@pytest.mark.parametrize("cp", [1, 2])
def test_none_recomputes_nothing_and_matches_remat_and_full(case, tmp_path, cp):
    runs = [("none", "auto")] + [(p, i) for p in ("remat", "full") for i in ("chunk", "whole")]
    for rows in (100, 7):
        got, counts = {}, {}
        for policy, inputs in runs:
            got[policy, inputs], counts[policy, inputs] = step(
                case, tmp_path / f"{policy}{inputs}{rows}.safetensors", cp, f"checkpoint.chunk_rows={rows}",
                f"checkpoint.input_rows={inputs}", policy=policy)
        got["none"], counts["none"] = got["none", "auto"], counts["none", "auto"]
        for policy in runs[1:]:
            worst = max((rel(got["none"][k], got[policy][k]), k) for k in got[policy])
            bitwise = all(np.array_equal(got["none"][k], got[policy][k]) for k in got[policy])
            print(f"cp {cp} chunk_rows {rows}: none vs {policy} worst gradient rel err {worst[0]:.2e} ({worst[1]})"
                  f"{', bitwise' if bitwise else ''}; chunk recomputes {counts[policy]['chunk_recomputes']}")
            assert rel(got["none"]["loss"], got[policy]["loss"]) <= POLICY_BOUND, (cp, rows, policy)
            assert worst[0] <= POLICY_BOUND, (cp, rows, policy, worst)
        c = counts["none"]
        assert c["block_recomputes"] == 0 and c["chunk_recomputes"] == 0, c
        # the memory it keeps for that is the plan's: every layer's per-token tensors, whole
        m = plan_memory(cp, f"checkpoint.chunk_rows={rows}")
        assert m["none"]["activations_kept"] <= c["activation_bytes_kept"] <= m["none"]["activations_kept"] + 256 * 400
        for policy in runs[1:]:
            assert counts[policy]["block_recomputes"] == 4, counts[policy]
            assert counts[policy]["chunk_recomputes"] == rerun_chunks(cp, rows, policy[1]), (policy, counts[policy])


def test_training_under_none_reruns_nothing(tmp_path, recall_tok):
    """`ringscan train`, 3 steps of 2 x 512 tokens with 100-row chunks under none and under remat: the same
    losses (bitwise: the backward reads the bits the recompute would make), and metrics.jsonl's counters
    say none reran no block and no per-token forward in any step, remat all of them (3 per chunk and
    layer at least)."""
    out = {}
    for policy in ("none", "remat"):
        d = tmp_path / policy
        r = run([RINGSCAN, "train", "configs/tiny-cpu.yaml", "--set", f"data.path={recall_tok}", "--set",
                 "data.seq_len=512", "--set", "data.micro_batch=2", "--set", "parallel.dp=1", "--set",
                 "parallel.cp=1", "--set", "train.steps=3", "--set", "train.warmup_steps=1", "--set",
                 f"checkpoint.activations={policy}", "--set", "checkpoint.chunk_rows=100", "--set",
                 f"run.out_dir={d}"], timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        out[policy] = [json.loads(line) for line in open(d / "metrics.jsonl")]
    assert [m["loss"] for m in out["none"]] == [m["loss"] for m in out["remat"]]
    for m in out["none"]:
        assert m["counters"]["block_recomputes"] == 0 and m["counters"]["chunk_recomputes"] == 0, m["counters"]
    for m in out["remat"]:  # 2 samples x 6 chunks of each of the 4 layers: h and the MLP (input_rows auto: whole)
        assert m["counters"]["block_recomputes"] == 4 and m["counters"]["chunk_recomputes"] >= 2 * 12 * 4, m


def test_chunk_rows_shorter_than_the_halo_is_refused(ringscan):
    r = run([RINGSCAN, "plan", "configs/tiny-cpu.yaml", "--set", "checkpoint.chunk_rows=2"])
    assert r.returncode != 0
    assert "checkpoint.chunk_rows = 2" in r.stderr and "conv halo" in r.stderr, r.stderr


def plan_memory(cp, *sets):
    args = [RINGSCAN, "plan", "configs/tiny-cpu.yaml", "--json", "--set", f"parallel.cp={cp}", "--set",
            f"data.seq_len={T}", "--set", "data.micro_batch=2"]
    for s in sets:
        args += ["--set", s]
    r = run(args)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)["memory"]


@pytest.mark.parametrize("cp", [1, 2])
@pytest.mark.parametrize("policy", ["none", "remat"])
def test_offload_is_bitwise(case, tmp_path, cp, policy):
    """Offloaded and not: the same bits (gradients and loss), chunked (100 rows) and not. Layers 0
    and 1 of the 4 go to the host and come back (a missing fetch was measured at 1.46 relative, a
    missing stash at 1.0); the model's device and host bytes are plan's."""
    for rows in (0, 100):
        ref, _ = step(case, tmp_path / f"keep{rows}.safetensors", cp, f"checkpoint.chunk_rows={rows}", policy=policy)
        got, c = step(case, tmp_path / f"off{rows}.safetensors", cp, f"checkpoint.chunk_rows={rows}",
                      "checkpoint.offload=host", policy=policy)
        for k in ref:
            assert np.array_equal(got[k], ref[k]), (cp, policy, rows, k)
        assert c["offload_bytes_to_host"] == c["offload_bytes_to_device"] == c["activation_bytes_host"] > 0, c
        m = plan_memory(cp, f"checkpoint.chunk_rows={rows}", "checkpoint.offload=host")[policy]
        assert c["activation_bytes_host"] == m["activations_host"], (c, m)
        assert c["activation_bytes_device"] == m["activations_kept_device"], (c, m)
        assert c["activation_bytes_device"] < c["activation_bytes_kept"], c


GIB = 2**30
# The 1M cp 2 plan must leave 2 GiB of the 79 for what plan does not count: on the GPU machine, held to an
# H100's memory, the backend's peak ran up to 1.66 GiB over plan's terms (docs/performance.md has the
# measured memory of the config).
PLAN_1M_MAX = (79 - 2) * GIB
ONE_M = ["configs/hybrid-1b-1m-h200x4.yaml", "--set", "parallel.cp=2", "--set", "slurm.gpus_per_node=2",
         "--set", "device.memory_gib=79", "--set", "parallel.gdn_chain_staged=false",  # as the h100x2 config
         "--set", "parallel.ring_calls=pairs", "--set", "parallel.ring_keep_kv=false", "--set", "checkpoint.gdn_keep=wy"]


def plan_1m(*sets):
    args = [RINGSCAN, "plan", *ONE_M, "--json"]
    for s in sets:
        args += ["--set", s]
    r = run(args)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout), r.returncode


def test_plan_counts_offload_and_host_memory():
    """The 1B at 1M on two GPUs: offload leaves the head and two layer slots on the device and puts the
    other 14 layers' kept bytes in host memory, which plan counts per node and checks."""
    keep, _ = plan_1m("checkpoint.offload=none")
    off, rc = plan_1m("checkpoint.offload=host", "device.host_memory_gib=240")
    k, o = keep["memory"]["remat"], off["memory"]["remat"]
    T, H = 524_288, 1536
    x, attn = T * H * 2, T * 16 * 128 * 2 + T * 16 * 4     # every layer's x; a full layer's out + LSE
    cp_state = 2 * (16 * 128 * 128 * 4 * 2 + 3 * 6144 * 2)  # per GDN layer: 2 fragments' states, M, halo
    # layers 0..13 leave the device: 11 GDN (0-2, 4-6, 8-10, 12, 13) and 3 attention (3, 7, 11)
    host = 14 * x + 3 * attn + 11 * cp_state
    assert abs(o["activations_host"] - host) <= 256 * 64, (o["activations_host"], host)
    assert o["activations_kept_device"] < k["activations_kept_device"] - 24 * GIB
    assert o["host_per_node"] == 2 * (o["activations_host"] + 2 * GIB) + 12 * off["parameters"]["total"]
    assert rc == 0 and o["fits"] and o["total"] <= PLAN_1M_MAX, o["total"] / GIB
    assert not k["fits"]  # without offload the same run does not fit 79 GiB


def test_plan_refuses_what_the_host_cannot_hold():
    r = run([RINGSCAN, "plan", *ONE_M, "--set", "checkpoint.offload=host", "--set", "device.host_memory_gib=40"])
    assert r.returncode == 1, r.stdout
    assert "DOES NOT FIT with checkpoint.offload=host: host memory per node needs 69.44 GiB" in r.stdout, r.stdout
    assert "device.host_memory_gib gives 40.00 GiB" in r.stdout, r.stdout


def test_ring_forward_and_backward_share_memory():
    """CP ring buffers at 1M, cp 2 (T = 524,288 rows per rank): the K|V receive pair and the -inf LSE
    start, plus the larger of the forward's (fp32 out + LSE, one call's out + LSE) and the backward's
    (fp32 dQ, fp32 dK|dV local + two travelling): 8.03 GiB instead of the 14.09 of both."""
    d, _ = plan_1m()
    T, qd, kv, nh = 524_288, 2048, 512, 16
    always = 2 * T * kv * 2 + T * nh * 4
    fwd = T * qd * 4 + T * nh * 4 + T * qd * 2 + T * nh * 4
    bwd = T * qd * 4 + T * kv * 4 + 2 * T * kv * 4
    assert d["memory"]["remat"]["CP ring buffers"] == always + max(fwd, bwd)


def test_the_1m_two_gpu_config_fits(ringscan):
    """configs/hybrid-1b-1m-h100x2.yaml: FITS with PLAN_1M_MAX per GPU, host memory within its node."""
    r = run([RINGSCAN, "plan", "configs/hybrid-1b-1m-h100x2.yaml", "--json"])
    assert r.returncode == 0, r.stdout + r.stderr
    m = json.loads(r.stdout)["memory"]
    assert m["offload"] == "host" and m["remat"]["fits"] and m["remat"]["host_fits"]
    assert m["remat"]["total"] <= PLAN_1M_MAX, m["remat"]["total"] / GIB
