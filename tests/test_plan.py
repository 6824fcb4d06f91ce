"""test_plan.py — `ringscan plan` against numbers computed by hand.

Parameter counts are worked out below from the Hugging Face state-dict shapes
of docs/design/model.md (the arithmetic is in the comments), and must
equal the plan's exact count and its own HF-table sum. Memory and
communication are checked for their structure: the policies order as they
must, overrides change the numbers, and a run that does not fit exits 1 with
the overage.
"""
import json
import re

import pytest

from conftest import ROOT, run

# configs/tiny-cpu.yaml: V=256 H=256 I=512 L=4 (layer 3 full), nk=2 nv=4 dk=dv=64, nh=4 nkv=2 hd=64, Kc=4
#   embed_tokens 256*256 = 65,536; lm_head 65,536; model.norm 256
#   per layer: 2 norms 2*256 = 512; MLP 3*256*512 = 393,216
#   GDN layer: in_proj_qkvz (2*2*64 + 2*4*64)*256 = 768*256 = 196,608; in_proj_ba 2*4*256 = 2,048;
#              conv1d (2*128 + 256)*4 = 2,048; dt_bias 4; A_log 4; norm 64; out_proj 256*256 = 65,536
#              = 266,312
#   attention: q_proj 4*64*2*256 = 131,072; k_proj 2*64*256 = 32,768; v_proj 32,768; o_proj 256*256 = 65,536;
#              q_norm 64; k_norm 64 = 262,272
#   total = 131,072 + 256 + 4*393,728 + 3*266,312 + 262,272 = 2,767,448
TINY_PARAMS = 2_767_448
TINY_MATMUL = 4 * 393_216 + 3 * (196_608 + 2_048 + 65_536) + (131_072 + 2 * 32_768 + 65_536) + 65_536

# configs/hybrid-1b-*-h200x4.yaml: V=151,936 H=1536 I=4096 L=16 (3,7,11,15 full), nk=nv=16 dk=dv=128,
#   nh=16 nkv=2 hd=128
#   embed + lm_head 2*151,936*1536 = 466,747,392; model.norm 1,536
#   per layer: norms 3,072; MLP 3*1536*4096 = 18,874,368
#   GDN: qkvz (2*2048 + 2*2048)*1536 = 12,582,912; ba 32*1536 = 49,152; conv 6144*4 = 24,576;
#        dt_bias 16; A_log 16; norm 128; out_proj 1536*2048 = 3,145,728  => 15,802,528
#   attention: q_proj 16*128*2*1536 = 6,291,456; k 256*1536 = 393,216; v 393,216; o 1536*2048 = 3,145,728;
#        q_norm 128; k_norm 128 => 10,223,872
#   total = 466,747,392 + 1,536 + 16*(3,072 + 18,874,368) + 12*15,802,528 + 4*10,223,872 = 999,313,792
ONE_B_PARAMS = 999_313_792


def plan_json(ringscan, config, *sets, rc=0):
    args = [ringscan, "plan", config, "--json"]
    for s in sets:
        args += ["--set", s]
    r = run(args)
    assert rc is None or r.returncode == rc, r.stderr
    return json.loads(r.stdout)


def test_tiny_param_count(ringscan):
    d = plan_json(ringscan, "configs/tiny-cpu.yaml")
    assert d["parameters"]["total"] == TINY_PARAMS
    assert d["parameters"]["hf_state_dict"] == TINY_PARAMS
    assert d["parameters"]["matmul"] == TINY_MATMUL
    assert d["layout"]["layers_full"] == 1 and d["layout"]["layers_linear"] == 3


def test_1b_param_count(ringscan):
    for cfg in ("configs/hybrid-1b-1m-h200x4.yaml", "configs/hybrid-1b-256k-h200x4.yaml"):
        d = plan_json(ringscan, cfg)
        assert d["parameters"]["total"] == ONE_B_PARAMS
        assert d["parameters"]["hf_state_dict"] == ONE_B_PARAMS
        assert d["layout"]["layers_full"] == 4


def test_tied_embeddings_drop_lm_head(ringscan):
    d = plan_json(ringscan, "configs/tiny-cpu.yaml", "model.tie_word_embeddings=true")
    assert d["parameters"]["total"] == TINY_PARAMS - 256 * 256
    assert d["parameters"]["matmul"] == TINY_MATMUL  # a tied head is still a GEMM


def test_explicit_layer_types(ringscan):
    d = plan_json(ringscan, "configs/tiny-cpu.yaml", "model.layer_types=[full_attention, linear_attention, "
                  "full_attention, full_attention]")
    assert d["layout"]["layers_full"] == 3
    assert d["parameters"]["total"] == TINY_PARAMS - 2 * 266_312 + 2 * 262_272


def test_layout_numbers(ringscan):
    d = plan_json(ringscan, "configs/hybrid-1b-1m-h200x4.yaml")
    lay = d["layout"]
    assert lay["world"] == 4 and lay["cp"] == 4
    assert lay["segment_tokens"] == 1_048_576 // 8
    assert lay["tokens_per_rank"] == 262_144
    assert lay["tokens_per_step"] == 2 * 1_048_576


def test_policies_order_and_fit(ringscan):
    d = plan_json(ringscan, "configs/hybrid-1b-1m-h200x4.yaml")
    m = d["memory"]
    assert m["policy"] == "remat"
    # remat keeps more than full (attention out + LSE) but far less than none
    assert m["full"]["activations_kept"] < m["remat"]["activations_kept"] < m["none"]["activations_kept"]
    assert m["none"]["fits"] is False and m["remat"]["fits"] is True
    # the same optimizer state under every policy: 16 bytes per parameter + 2 for bf16 weights on cuda
    for p in ("none", "full", "remat"):
        state = sum(m[p][k] for k in ("weights (bf16)", "master weights (fp32)", "gradients (fp32)", "AdamW m, v (fp32)"))
        assert state == 18 * ONE_B_PARAMS


def test_activation_kept_by_hand(ringscan):
    # full policy keeps only block inputs x [T, H] bf16 per layer, plus the head's buffers:
    # final_in [T,H] bf16, tokens+targets [T, 2] int32, and one loss row chunk (2 GiB of fp32 logits:
    # 3,533 rows at V = 151,936) of final_norm, d_final [rows, H] bf16, final_rstd [rows] fp32
    T, H, L, rows = 262_144, 1536, 16, 3533
    d = plan_json(ringscan, "configs/hybrid-1b-1m-h200x4.yaml")
    head = T * H * 2 + T * 8 + 2 * rows * H * 2 + rows * 4
    assert d["memory"]["full"]["activations_kept"] == L * T * H * 2 + head
    # remat adds attention out [T, nh*hd] bf16 + LSE [T, nh] fp32 per full layer, and per GDN
    # layer, for the 2 zigzag fragments of the one sample: the CP entry states [nv, dk, dv] fp32,
    # the transitions M [nv, dk, dk] fp32 (the backward's fold) and the conv halo [3, Cc] bf16
    extra = 4 * (T * 16 * 128 * 2 + T * 16 * 4) + 12 * 2 * (16 * 128 * 128 * 4 + 16 * 128 * 128 * 4 + 3 * 6144 * 2)
    assert d["memory"]["remat"]["activations_kept"] == L * T * H * 2 + head + extra


def test_none_keeps_the_per_token_tensors_by_hand(ringscan):
    """Under none every layer keeps, for all T = 262,144 rows of the rank, beyond what remat keeps: the
    whole-rows buffers its mixer's core reads and the per-token tensors its backward reads (so it
    recomputes nothing); bf16 activations, fp32 statistics; gdn_keep none leaves out the delta rule's
    kept factors. A plan that counted the per-token tensors as one chunk's (as under remat) misses by
    ~205 GiB (their whole rows)."""
    T, H, I, e = 262_144, 1536, 4096, 2
    Kd = Vd = qd = 2048
    nk = nv = nh = 16
    kvd, nkv = 256, 2
    Pg, Pa = 2 * Kd + Vd + Vd + 2 * nv, 2 * qd + 2 * kvd
    token = (3 * H + 3 * I) * e + 2 * 4          # ln1, h, ln2, gate_up (2I), act (I); rstd1, rstd2
    gdn = (2 * Kd + 3 * Vd) * e + (2 * nk + 2 * nv) * 4 + token + (Pg + Vd) * e + nv * 4   # + proj, normed, rstd
    attn = (qd + 2 * kvd + qd) * e + (nh + nkv) * 4 + token + (Pa + qd) * e                # + proj, gated
    d = plan_json(ringscan, "configs/hybrid-1b-1m-h200x4.yaml", "checkpoint.gdn_keep=none")
    m = d["memory"]
    assert m["none"]["activations_kept"] - m["remat"]["activations_kept"] == T * (12 * gdn + 4 * attn)
    # the chunk size changes the scratch, not what none keeps
    small = plan_json(ringscan, "configs/hybrid-1b-1m-h200x4.yaml", "checkpoint.gdn_keep=none",
                      "checkpoint.chunk_rows=1024")["memory"]
    assert small["none"]["activations_kept"] == m["none"]["activations_kept"]
    assert small["remat"]["activations_kept"] == m["remat"]["activations_kept"]
    assert small["none"]["activations"] < m["none"]["activations"]


def test_recompute_flops_by_hand(ringscan):
    """Hardware FLOPs the policy reruns, per token: none nothing; remat each layer's in_proj twice under
    checkpoint.input_rows chunk (its recompute, then per row chunk before the backward), once under whole, its
    out_proj and gate/up once (not down: nothing reads its output again) and the delta rule's forward; full also
    attention's forward."""
    V, H, I, L = 151_936, 1536, 4096, 16
    in_proj = H * (12 * (2 * 2048 + 2048 + 2048 + 32) + 4 * (2 * 2048 + 2 * 256))
    C, K = 64, 128
    gdn_fwd = 16 * (1.25 * C * C * K + 0.61 * C ** 3 + 2 * C * C * 2 * K + 4 * C * K * K
                    + 2 * C * K * K + 4 * C * C * K) / C
    for inputs, again in (("chunk", 1), ("whole", 0)):
        f = {}
        for policy in ("none", "remat", "full"):
            d = plan_json(ringscan, "configs/hybrid-1b-1m-h200x4.yaml", f"checkpoint.activations={policy}",
                          f"checkpoint.input_rows={inputs}", rc=0 if policy != "none" else 1)
            f[policy] = d["flops_per_token"]
            assert d["memory"]["input_rows"] == (inputs if policy != "none" else "chunk"), (policy, d["memory"])
        per_chunk = f["none"]["dense"] / 6 - V * H - L * I * H   # layers' GEMM parameters but down_proj
        assert f["none"]["recompute"] == 0
        remat = 2 * (per_chunk + again * in_proj) + 12 * gdn_fwd
        assert abs(f["remat"]["recompute"] - remat) <= 1e-9 * remat, (inputs, f["remat"]["recompute"], remat)
        full = remat + f["full"]["attention_causal"] / 3
        assert abs(f["full"]["recompute"] - full) <= 1e-9 * full, (inputs, f["full"]["recompute"], full)


def test_flops_by_hand(ringscan):
    d = plan_json(ringscan, "configs/hybrid-1b-1m-h200x4.yaml")
    f = d["flops_per_token"]
    matmul = d["parameters"]["matmul"]
    assert f["dense"] == 6 * matmul
    # attention per token per layer: fwd 4*nh*hd*T (QK^T and PV), x3 for training, 4 layers; causal = half
    full = 3 * 4 * 16 * 128 * 1_048_576 * 4
    assert f["attention_noncausal"] == full
    assert f["attention_causal"] == full / 2
    # GDN at C=64, K=V=128: FLA's split gives 11.3 (fwd) + 32.5 (bwd) MFLOP per chunk-head (docs/design/gdn-kernels.md, "FLOPs counted")
    per_token_head = f["gdn"] / (12 * 16)
    assert abs(per_token_head - (11.30e6 + 32.51e6) / 64) / per_token_head < 0.01


def test_comm_by_hand(ringscan):
    d = plan_json(ringscan, "configs/hybrid-1b-1m-h200x4.yaml")
    c = d["comm_bytes_per_step"]
    P, W = 4, 4
    assert c["gradients and weights (dp x cp)"] == 2 * (W - 1) / W * 4 * ONE_B_PARAMS
    # ring, per full layer per sample: fwd (P-1) * (T/P) * 2*nkv*hd * 2 bytes; bwd the same KV + P * (T/P) fp32 dK|dV
    T, kv = 1_048_576, 2 * 2 * 128
    fwd = (P - 1) * (T // P) * kv * 2
    bwd = fwd + P * (T // P) * kv * 4
    assert c["ring attention send/recv"] == 2 * 4 * (fwd + bwd)  # grad_accum 2, 4 full layers
    # cp 4: the hybrid (d["layout"]["gdn_cp"]): per sample and pass two hand-offs of one fp32 state [nv, dk, dv] and
    # (P-1) ranks' all-gathered [nv, dk, dk+dv] slot, forward and backward, 12 GDN layers, 2 micro-batches
    assert d["layout"]["gdn_cp"] == "hybrid"
    assert c["GDN state passing"] == 2 * 12 * 2 * (2 * 16 * 128 * 128 * 4 + (P - 1) * 16 * 128 * 256 * 4)
    # the scan (parallel.gdn_chain_staged false): (P-1) ranks' [2, nv, dk, dk+dv] fp32
    s = plan_json(ringscan, "configs/hybrid-1b-1m-h200x4.yaml", "parallel.gdn_chain_staged=false")
    assert s["layout"]["gdn_cp"] == "scan"
    assert s["comm_bytes_per_step"]["GDN state passing"] == 2 * 12 * 2 * (P - 1) * 2 * 16 * 128 * 256 * 4


def test_set_changes_plan(ringscan):
    base = plan_json(ringscan, "configs/hybrid-1b-1m-h200x4.yaml")
    more = plan_json(ringscan, "configs/hybrid-1b-1m-h200x4.yaml", "parallel.cp=8", "slurm.gpus_per_node=8")
    assert more["layout"]["tokens_per_rank"] == base["layout"]["tokens_per_rank"] // 2
    assert more["memory"]["remat"]["activations"] < base["memory"]["remat"]["activations"]
    deeper = plan_json(ringscan, "configs/hybrid-1b-1m-h200x4.yaml", "model.num_hidden_layers=20")
    assert deeper["parameters"]["total"] == ONE_B_PARAMS + 3 * (3_072 + 18_874_368 + 15_802_528) + (
        3_072 + 18_874_368 + 10_223_872)


def test_does_not_fit_exits_1(ringscan):
    r = run([ringscan, "plan", "configs/hybrid-1b-1m-h200x4.yaml", "--set", "checkpoint.activations=none"])
    assert r.returncode == 1, r.stderr
    assert "verdict: DOES NOT FIT with checkpoint.activations=none" in r.stdout
    assert "over by" in r.stdout
    assert "hint: checkpoint.activations=remat fits" in r.stdout
    d = plan_json(ringscan, "configs/hybrid-1b-1m-h200x4.yaml", "device.memory_gib=40", rc=1)
    assert d["fits"] is False


def test_does_not_fit_names_the_ring_settings_that_fit(ringscan):
    """Over budget at cp 2 with the kept K|V and one ring call per step (the defaults), plan names the cheaper
    ring settings that fit with the same checkpoint.activations, each with its total: only the fewest needed."""
    cfg = "configs/hybrid-1b-1m-h100x2.yaml"  # 79 GiB; with the delta rule's states kept, pairs + passed: 77.91 GiB
    keep = ("checkpoint.gdn_keep=states",)

    def verdict(*sets):
        args = [ringscan, "plan", cfg]
        for s in keep + sets:
            args += ["--set", s]
        r = run(args)
        return r.returncode, r.stdout[r.stdout.index("\nverdict"):]

    def total(*sets):
        d = plan_json(ringscan, cfg, *keep, *sets, rc=None)
        return f"{d['memory']['remat']['total'] / 2**30:.2f} GiB"

    defaults = ("parallel.ring_calls=auto", "parallel.ring_keep_kv=true")
    rc, out = verdict(*defaults)  # 82.19 GiB: pairs alone fits, the kept K|V alone does not
    assert rc == 1 and "DOES NOT FIT" in out, out
    assert f"hint: parallel.ring_calls=pairs fits ({total('parallel.ring_keep_kv=true')})" in out, out
    assert "ring_keep_kv=false" not in out, out
    rc, out = verdict(*defaults, "device.memory_gib=78")  # only both together
    assert rc == 1, out
    assert f"hint: parallel.ring_keep_kv=false and parallel.ring_calls=pairs together fit ({total()})" in out, out
    rc, out = verdict("parallel.ring_keep_kv=true", "device.memory_gib=78.6")  # pairs already: the kept K|V
    assert rc == 1 and f"hint: parallel.ring_keep_kv=false fits ({total()})" in out, out
    assert "ring_calls=pairs fits" not in out, out
    rc, out = verdict(*defaults, "device.memory_gib=60")  # nothing of the ring is enough: no ring hint
    assert rc == 1 and "parallel.ring" not in out, out
    rc, out = verdict(*defaults, "device.attention_kernel=ringscan", "device.memory_gib=75")  # no cuDNN workspace
    assert rc == 1 and "ring_calls=pairs" not in out and "parallel.ring_keep_kv=false fits" in out, out


def test_human_report_has_every_section(ringscan):
    r = run([ringscan, "plan", "configs/hybrid-1b-1m-h200x4.yaml"])
    assert r.returncode == 0, r.stderr
    for s in ("| key", "layout", "world 4 = dp 1 x cp 4", "parameters 999,313,792", "(equal)",
              "weights (bf16)", "master weights (fp32)", "gradients (fp32)", "AdamW m, v (fp32)",
              "activations", "CP ring buffers", "CP scan buffers", "workspaces", "runtime",
              "attention counted causal", "communication per step", "gradients and weights (dp x cp)",
              "parallel.shard over the world of 4",
              "ring attention send/recv", "GDN state passing", "GDN state passing: hybrid", "verdict: FITS"):
        assert s in r.stdout, s


def test_cuda_runtime_by_hand(ringscan):
    """runtime on cuda: 550 MiB for the context and 1100 MiB per NCCL communicator of two or more ranks (world,
    cp, dp), the measured figures of lib/plan/plan.c's header; none on cpu."""
    cfg = "configs/hybrid-1b-256k-h200x4.yaml"
    for dp, cp, comms in ((1, 1, 0), (1, 2, 2), (2, 1, 2), (1, 4, 2), (2, 2, 3)):
        d = plan_json(ringscan, cfg, f"parallel.dp={dp}", f"parallel.cp={cp}", f"slurm.gpus_per_node={dp * cp}")
        assert d["memory"]["remat"]["runtime (context, NCCL)"] == (550 + 1100 * comms) << 20, (dp, cp)
    assert plan_json(ringscan, "configs/tiny-cpu.yaml")["memory"]["remat"]["runtime (context, NCCL)"] == 0


def test_cudnn_attention_workspace_by_hand(ringscan):
    """device.attention_kernel cudnn | cudnn_det adds the cuDNN route's workspace (kernels/cuda/attention/cudnn_graph.h
    cdg_workspace) of one ring call's backward to workspaces: Tq = Tk = a fragment, seq_len / 2cp; with the
    variable-length layout's additions where a GQA call has at most 131072 rows."""
    cfg = "configs/hybrid-1b-1m-h100x2.yaml"  # cp 2: fragments of 1,048,576 / 4 = 262,144 rows, 16/2/128

    def r256(x):
        return (x + 255) // 256 * 256

    n, nh, nkv, hd = 262_144, 16, 2, 128
    det = r256(4 * n * nh) * 2 + r256(2 * n * nh * hd) + 2 * r256(2 * n * nkv * hd)
    full = det + r256(4 * n * nh * hd)  # cudnn: cuDNN's fp32 dq accumulator too
    rows = "checkpoint.chunk_rows=8384"  # fixed: chunk_rows 0 grows the chunks into the memory the workspace leaves
    base = plan_json(ringscan, cfg, "device.attention_kernel=ringscan", rows)
    default = plan_json(ringscan, cfg, rows)  # auto, the default: cuDNN's workspace counted
    # cudnn_det also counts cuDNN's own plan workspace, a rows x rows x heads bf16 matrix (cdg_det_plan_bytes);
    # auto counts cudnn's: what it runs where cuDNN loads (plan cannot know the job's machine)
    det += n * n * nh * 2
    for kernel, want in (("cudnn", full), ("cudnn_det", det), ("auto", full)):
        # cudnn_det's 2 TiB does not fit: plan says so (rc 1)
        d = plan_json(ringscan, cfg, f"device.attention_kernel={kernel}", rows, rc=int(kernel == "cudnn_det"))
        for pol in ("none", "full", "remat"):
            m, b = d["memory"][pol], base["memory"][pol]
            assert m["cudnn_workspace"] == want, (kernel, pol, m["cudnn_workspace"], want)
            assert b["cudnn_workspace"] == 0
            assert m["workspaces"] - b["workspaces"] == want
            assert m["total"] - b["total"] == want
            if kernel == "auto":
                assert default["memory"][pol] == m, pol
    one = plan_json(ringscan, cfg, "device.attention_kernel=cudnn", "parallel.cp=1", "data.seq_len=65536",
                    "slurm.gpus_per_node=1")  # cp 1: the call is the whole sample
    n = 65_536
    # GQA at <= 131072 rows (CDG_VARLEN_GQA_MAX_ROWS): packed documents may take cuDNN's variable length,
    # whose layout keeps the gradients in their inputs' row strides (the model's q rows nh hd; dk and dv
    # interleaved in rows of 2 nkv hd as k and v are) and adds the lengths and 4 offset tensors of at most
    # 16 n / 64 sequences and the per-head bf16 dK, dV in rows of 2 nkv hd x nh / nkv
    batch = 16 * n // 64
    ldk = 2 * nkv * hd
    varlen = (r256(4 * n * nh) * 2 + r256(4 * n * nh * hd) + r256(2 * n * nh * hd) + r256(2 * n * ldk) +
              r256(4 * batch) + 4 * r256(8 * (batch + 1)) + 2 * r256(2 * n * ldk * (nh // nkv)))
    assert one["memory"]["remat"]["cudnn_workspace"] == varlen
    r = run([ringscan, "plan", cfg, "--set", "device.attention_kernel=cudnn"])
    assert r.returncode == 0, r.stderr
    assert "cuDNN attention workspace" in r.stdout
    assert "one ring call of 262144 rows" in r.stdout
    # the config's parallel.ring_calls is pairs; auto (the default) or steps makes one call per ring step, whose
    # largest is a rank's own block: Tq = Tk = seq_len / cp (at 80 GB, with the delta rule's chunk states kept,
    # that no longer fits: plan says so)
    m = 524_288
    step = r256(4 * m * nh) * 2 + r256(4 * m * nh * hd) + r256(2 * m * nh * hd) + 2 * r256(2 * m * nkv * hd)
    for how in ("auto", "steps"):
        d = plan_json(ringscan, cfg, f"parallel.ring_calls={how}", "checkpoint.gdn_keep=states", rc=1)
        assert d["memory"]["remat"]["cudnn_workspace"] == step, how
        r = run([ringscan, "plan", cfg, "--set", f"parallel.ring_calls={how}", "--set", "checkpoint.gdn_keep=states"])
        assert r.returncode == 1 and "one ring call of 524288 rows" in r.stdout, how
        assert "verdict: DOES NOT FIT" in r.stdout, how
    r = run([ringscan, "plan", cfg, "--set", "device.attention_kernel=cudnn_det"])
    assert r.returncode == 1 and "verdict: DOES NOT FIT" in r.stdout, (r.returncode, r.stdout[-600:])
    assert "of it is device.attention_kernel=cudnn_det's workspace" in r.stdout, r.stdout[-600:]
    # auto is valid on the cpu backend (ours there; nothing counted), cudnn is not
    cpu = plan_json(ringscan, "configs/tiny-cpu.yaml", "device.attention_kernel=auto")
    assert cpu["memory"]["remat"]["cudnn_workspace"] == 0
    r = run([ringscan, "plan", "configs/tiny-cpu.yaml", "--set", "device.attention_kernel=cudnn"])
    assert r.returncode == 2 and "runs on the cuda backend only" in r.stderr, r.stderr


def test_ring_kept_kv_buffers_by_hand(ringscan):
    """parallel.ring_keep_kv (cp 2): the CP ring buffers hold each softmax layer's received K|V block (local
    rows x 2 kv heads x head_dim, bf16 on cuda, fp32 on cpu) for its backward, one buffer on 256 bytes, in place
    of the two K|V receive buffers; nothing changes at cp 4."""
    cfg = "configs/hybrid-1b-256k-h200x4.yaml"  # 4 softmax layers, 2 kv heads of 128

    def r256(x):
        return (x + 255) // 256 * 256

    def ring(*sets, gpus=2):
        d = plan_json(ringscan, cfg, "parallel.dp=1", f"slurm.gpus_per_node={gpus}", *sets)
        return d["memory"]["remat"]["CP ring buffers"]

    for seq in (262_144, 1_048_576):
        rows = seq // 2
        block = rows * 2 * 2 * 128 * 2
        sets = ("parallel.cp=2", f"data.seq_len={seq}")
        assert ring(*sets) - ring(*sets, "parallel.ring_keep_kv=false") == r256(4 * block) - 2 * r256(block), seq
    sets = ("parallel.cp=4", "data.seq_len=262144")
    assert ring(*sets, gpus=4) == ring(*sets, "parallel.ring_keep_kv=false", gpus=4)
    # the cpu backend keeps fp32 (tiny-cpu: one softmax layer of 2 kv heads of 64, 4 samples of 512 tokens at
    # cp 2): one kept block in place of two receive buffers
    def tiny(*sets):
        d = plan_json(ringscan, "configs/tiny-cpu.yaml", "parallel.cp=2", "slurm.gpus_per_node=0", *sets)
        return d["memory"]["remat"]["CP ring buffers"]
    assert tiny("parallel.ring_keep_kv=false") - tiny() == r256(4 * 256 * 2 * 2 * 64 * 4)


def test_staged_gdn_chain_buffers_by_hand(ringscan):
    """The staged GDN chain (cp 2, parallel.gdn_chain_staged, checkpoint.gdn_keep states) adds to the CP scan
    buffers what its backward stages carry for each local fragment (backend.h gdn_dkept_bytes; cp_init checks
    the backend's figure against plan's): per piece of at most 65,536 rows dv_loc and dv2 (rows, nv, dv) and the
    chunk state gradients (ceil(rows / 64) + 1, nv, dk, dv), bf16, each on 256 bytes; the hybrid (cp 3, 4) for the
    first local fragment only (its second runs its backward whole); nothing at cp 8 (the scan), without gdn_keep
    states, or turned off."""
    cfg = "configs/hybrid-1b-256k-h200x4.yaml"  # nv 16, dk = dv = 128

    def r256(x):
        return (x + 255) // 256 * 256

    def dkept(rows, nv=16, dk=128, dv=128):
        b = 0
        for r0 in range(0, rows, 65_536):
            m = min(rows - r0, 65_536)
            b += 2 * r256(m * nv * dv * 2) + r256(((m + 63) // 64 + 1) * nv * dk * dv * 2)
        return b

    def scan(*sets, gpus=2):
        d = plan_json(ringscan, cfg, "parallel.dp=1", f"slurm.gpus_per_node={gpus}", *sets)
        return d["memory"]["remat"]["CP scan buffers"]

    for seq, frag in ((262_144, 65_536), (1_048_576, 262_144)):  # one piece; four pieces
        sets = ("parallel.cp=2", f"data.seq_len={seq}")
        whole = scan(*sets, "parallel.gdn_chain_staged=false")
        assert scan(*sets) - whole == 2 * dkept(frag), seq  # two local fragments per sample
        assert scan(*sets, "checkpoint.gdn_keep=wy") == whole
    for cp, frags in ((3, 1), (4, 1), (8, 0)):
        sets = (f"parallel.cp={cp}", f"data.seq_len={cp * 65_536}")
        whole = scan(*sets, "parallel.gdn_chain_staged=false", gpus=cp)
        assert scan(*sets, gpus=cp) - whole == frags * dkept(32_768), cp
        assert scan(*sets, "checkpoint.gdn_keep=wy", gpus=cp) == whole


def fmt_gib(b):
    """bytes as plan prints GiB: two decimals"""
    return f"{b / 2**30:.2f}"


HEADER_PLAN = re.compile(r"^#\s+([\d,]+) parameters; (\w+): ([\d.]+) GiB per rank of ([\d.]+) GiB "
                         r"\(none ([\d.]+), full ([\d.]+), remat ([\d.]+) GiB\)", re.M)


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_config_header_plan_is_current(ringscan, config):
    """Every shipped config's header quotes `ringscan plan` (parameters, the policy's GiB per rank, the device's
    capacity, the three policies' totals, and where quoted its verdict line): the quote must equal what plan says
    now, to the printed digit."""
    text = (ROOT / "configs" / config).read_text()
    m = HEADER_PLAN.search(text)
    assert m, f"configs/{config}: no '#   N parameters; POLICY: X GiB per rank of Y GiB (none .., full .., remat .. GiB)' line"
    d = plan_json(ringscan, f"configs/{config}")
    mem = d["memory"]
    got = (f"{d['parameters']['total']:,}", mem["policy"], fmt_gib(mem[mem["policy"]]["total"]), f"{mem['capacity'] / 2**30:g}",
           fmt_gib(mem["none"]["total"]), fmt_gib(mem["full"]["total"]), fmt_gib(mem["remat"]["total"]))
    assert m.groups() == got, f"configs/{config}: header {m.groups()} but plan says {got}"
    quoted = re.search(r"^#\s+(verdict: .*)$", text, re.M)
    if quoted:  # a quoted verdict (free memory, host memory) is plan's line word for word
        r = run([ringscan, "plan", ROOT / "configs" / config])
        assert r.returncode == 0, r.stdout[-500:]
        verdict = [line for line in r.stdout.splitlines() if line.startswith("verdict")][0]
        assert quoted.group(1) == verdict, f"configs/{config}: header says {quoted.group(1)!r}, plan {verdict!r}"


HEADER_WITH = re.compile(r"^#\s+with((?:\s+--set\s+\S+)+):\s+([\d.]+) GiB per GPU(?:, host ([\d.]+) GiB per node)?, "
                         r"(fits|does not fit)$", re.M)
HEADER_PROSE_GIB = re.compile(r"^# \S.*?\b\d+\.\d+ GiB", re.M)


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_config_header_other_layouts_are_current(ringscan, config):
    """A config header's other layouts are lines `#   with --set K=V ...: X GiB per GPU[, host Y GiB per node],
    fits|does not fit`, each what `ringscan plan CONFIG --set K=V ...` says now: the policy's total per GPU and the
    fit, and the host memory per node where quoted. The prose around them (lines `# text`) quotes no GiB figure
    with decimals of its own, which would drift untested: the indented lines, plan's words, carry them."""
    lines = (ROOT / "configs" / config).read_text().splitlines(keepends=True)
    header = "".join(lines[:next((i for i, l in enumerate(lines) if not l.startswith("#")), len(lines))])
    prose = [m.group(0) for m in HEADER_PROSE_GIB.finditer(header)]
    assert not prose, f"configs/{config}: a GiB figure in the header's prose, not in a `#   with --set` line: {prose}"
    for m in HEADER_WITH.finditer(header):
        sets = m.group(1).split()[1::2]
        d = plan_json(ringscan, f"configs/{config}", *sets, rc=None)
        mem = d["memory"]
        pol = mem[mem["policy"]]
        got = (fmt_gib(pol["total"]), "fits" if d["fits"] else "does not fit")
        assert (m.group(2), m.group(4)) == got, f"configs/{config}: header 'with{m.group(1)}' says {m.group(2)} GiB, " \
                                                f"{m.group(4)}; plan says {got}"
        if m.group(3):
            assert m.group(3) == fmt_gib(pol["host_per_node"]), \
                f"configs/{config}: header 'with{m.group(1)}' says host {m.group(3)} GiB; plan {fmt_gib(pol['host_per_node'])}"


def test_chunk_rows_zero_grows_the_chunks_where_memory_allows(ringscan):
    """checkpoint.chunk_rows 0 (plan_resolve): the largest of 4, 2, 1 GiB of chunk scratch whose plan fits device
    memory less 5%, decided after checkpoint.keep_layers auto (never a kept layer fewer), at most a fragment; an
    explicit value is taken as it is. The 1B config at 128k on one H200: 4 GiB (41,856 rows), the same 9 kept layers
    as at the 1 GiB rule (10,432 rows); memory for 2 GiB but not 4: 2 GiB; for neither: the rule; a fragment shorter
    than 4 GiB of rows: the fragment. (checkpoint.input_rows chunk: under whole the input side leaves the chunk
    scratch, test_input_rows_auto_whole_first.)"""
    one = ("parallel.cp=1", "data.seq_len=131072", "checkpoint.keep_layers=auto", "train.grad_accum=1",
           "slurm.gpus_per_node=1", "checkpoint.input_rows=chunk")
    cfg = "configs/hybrid-1b-256k-h200x4.yaml"
    rule = plan_json(ringscan, cfg, *one, "checkpoint.chunk_rows=10432")["memory"]
    grown = plan_json(ringscan, cfg, *one)["memory"]
    assert (rule["chunk_rows"], grown["chunk_rows"]) == (10432, 41856)
    assert grown["keep_layers"] == rule["keep_layers"] == 9
    assert grown["remat"]["total"] <= 0.95 * grown["capacity"]
    # capacity for the kept layers and 2 GiB of chunks but not 4 (1 GiB more than the rule's total, over 0.95)
    gib = 2**30
    two = (rule["remat"]["total"] + 1.5 * gib) / 0.95 / gib
    mid = plan_json(ringscan, cfg, *one, f"device.memory_gib={two:.3f}")["memory"]
    assert mid["keep_layers"] == 9 and mid["chunk_rows"] == 20928, mid["chunk_rows"]
    # no room for more than the rule
    tight = plan_json(ringscan, cfg, *one, f"device.memory_gib={(rule['remat']['total'] + 0.5 * gib) / 0.95 / gib:.3f}")
    assert tight["memory"]["keep_layers"] == 9 and tight["memory"]["chunk_rows"] == 10432
    # the shipped 256k config at cp 4: fragments of 32,768 rows, one chunk each
    assert plan_json(ringscan, cfg, "checkpoint.input_rows=chunk")["memory"]["chunk_rows"] == 32768
    # a config without room keeps the rule (the 1M one on 79 GiB with the delta rule's chunk states kept; its
    # shipped gdn_keep wy leaves room for 2 GiB)
    h100x2 = "configs/hybrid-1b-1m-h100x2.yaml"
    assert plan_json(ringscan, h100x2, "checkpoint.gdn_keep=states")["memory"]["chunk_rows"] == 10432
    assert plan_json(ringscan, h100x2)["memory"]["chunk_rows"] == 20928
    # explicit rows are taken as they are
    assert plan_json(ringscan, cfg, *one, "checkpoint.chunk_rows=4096")["memory"]["chunk_rows"] == 4096


def test_input_rows_auto_whole_first(ringscan):
    """checkpoint.input_rows auto (plan_resolve): whole where the plan with it and no kept layer fits device memory
    less 5%, decided before checkpoint.keep_layers auto and the chunk rows (per byte it spares more recompute than a
    kept layer); chunk where it does not fit, and under none. The 1B at 128k on one H200: whole, the same 9 kept
    layers as under chunk, in_proj recompute gone (402.9 against 568.6 MFLOP per token), the input side's T rows
    in the activations beside the same 4 GiB of chunk scratch (51,648 rows, the input side no longer in it); the 1M config on
    two 79 GiB GPUs: chunk (its 524,288 rows per rank of input side would not fit); explicit values as given, and
    an explicit whole that does not fit where chunk would is told so by the verdict's hint."""
    one = ("parallel.cp=1", "data.seq_len=131072", "checkpoint.keep_layers=auto", "train.grad_accum=1",
           "slurm.gpus_per_node=1")
    cfg = "configs/hybrid-1b-256k-h200x4.yaml"
    auto = plan_json(ringscan, cfg, *one)
    chunk = plan_json(ringscan, cfg, *one, "checkpoint.input_rows=chunk")
    whole = plan_json(ringscan, cfg, *one, "checkpoint.input_rows=whole")
    a, c = auto["memory"], chunk["memory"]
    assert (a["input_rows"], a["input_rows_auto"]) == ("whole", True)
    assert (c["input_rows"], c["input_rows_auto"]) == ("chunk", False)
    assert whole["memory"]["remat"] == a["remat"] and whole["memory"]["input_rows_auto"] is False
    assert a["keep_layers"] == c["keep_layers"] == 9 and (a["chunk_rows"], c["chunk_rows"]) == (51648, 41856)
    assert a["remat"]["activations_kept"] == c["remat"]["activations_kept"]
    assert a["remat"]["total"] <= 0.95 * a["capacity"]
    rf, cf = auto["flops_per_token"]["recompute"], chunk["flops_per_token"]["recompute"]
    assert abs(rf - 402.893e6) < 1e4 and abs(cf - 568.634e6) < 1e4, (rf, cf)
    # memory for the input side at 0 kept layers but not beside a kept layer: whole, no layer kept (fixed chunks)
    gib, rows = 2**30, "checkpoint.chunk_rows=8192"
    none_kept = plan_json(ringscan, cfg, *one, rows, "checkpoint.input_rows=whole", "checkpoint.keep_layers=0")
    cap = (none_kept["memory"]["remat"]["total"] + 0.25 * gib) / 0.95 / gib
    m = plan_json(ringscan, cfg, *one, rows, f"device.memory_gib={cap:.3f}")["memory"]
    assert m["input_rows"] == "whole" and m["keep_layers"] == 0 and m["remat"]["total"] <= 0.95 * m["capacity"], m
    # not even that: chunk
    cap = (none_kept["memory"]["remat"]["total"] - 0.25 * gib) / 0.95 / gib
    assert plan_json(ringscan, cfg, *one, rows, f"device.memory_gib={cap:.3f}")["memory"]["input_rows"] == "chunk"
    # the 1M config on two 79 GiB GPUs, and none
    assert plan_json(ringscan, "configs/hybrid-1b-1m-h100x2.yaml")["memory"]["input_rows"] == "chunk"
    assert plan_json(ringscan, cfg, *one, "checkpoint.activations=none", rc=1)["memory"]["input_rows"] == "chunk"
    r = run([ringscan, "plan", cfg, *[x for kv in one for x in ("--set", kv)]])
    assert "input rows: whole" in r.stdout and "checkpoint.input_rows auto: fits memory less 5%" in r.stdout, r.stdout
    # whole asked for where only chunk fits: the verdict says so and names chunk with its total
    t_chunk = plan_json(ringscan, cfg, *one, rows, "checkpoint.input_rows=chunk", "checkpoint.keep_layers=0")
    cap = (t_chunk["memory"]["remat"]["total"] + none_kept["memory"]["remat"]["total"]) / 2 / gib
    sets = [*one, rows, "checkpoint.keep_layers=0", "checkpoint.input_rows=whole", f"device.memory_gib={cap:.3f}"]
    r = run([ringscan, "plan", cfg, *[x for kv in sets for x in ("--set", kv)]])
    assert r.returncode == 1 and "verdict: DOES NOT FIT" in r.stdout, r.stdout[-800:]
    assert "hint: checkpoint.input_rows=chunk fits" in r.stdout, r.stdout[-800:]


def test_mlp_act_auto_keeps_act_where_it_fits(ringscan):
    """checkpoint.mlp_act auto (plan_resolve): decided after keep_layers and the row chunks, kept where the plan with
    it fits device memory less 5%, else rewritten. The 1B at 128k on one H200: rewritten, so keep_layers auto keeps
    9 layers beside 4 GiB of chunks (kept as given: 8 layers and 2 GiB, the plan before rewriting existed); at 32k,
    where every layer is kept anyway: kept, under remat with keep_layers auto and under none; with no kept layer
    (keep_layers 0) nothing is decided for the run and plan's none column counts act kept, as under none."""
    one = ("parallel.cp=1", "checkpoint.keep_layers=auto", "train.grad_accum=1", "slurm.gpus_per_node=1")
    cfg = "configs/hybrid-1b-256k-h200x4.yaml"
    m = plan_json(ringscan, cfg, *one, "data.seq_len=131072")["memory"]
    assert (m["mlp_act"], m["mlp_act_auto"], m["keep_layers"], m["chunk_rows"]) == ("rewritten", True, 9, 51648), m
    assert m["remat"]["total"] <= 0.95 * m["capacity"]
    k = plan_json(ringscan, cfg, *one, "data.seq_len=131072", "checkpoint.mlp_act=kept")["memory"]
    assert (k["mlp_act"], k["mlp_act_auto"], k["keep_layers"], k["chunk_rows"]) == ("kept", False, 8, 25792), k
    for extra in ((), ("checkpoint.activations=none",)):
        s = plan_json(ringscan, cfg, *one, "data.seq_len=32768", *extra)["memory"]
        assert (s["mlp_act"], s["keep_layers"]) == ("kept", 16), (extra, s)
    z = plan_json(ringscan, cfg, *one, "data.seq_len=131072", "checkpoint.keep_layers=0")["memory"]
    rw = plan_json(ringscan, cfg, *one, "data.seq_len=131072", "checkpoint.keep_layers=0",
                   "checkpoint.mlp_act=rewritten")["memory"]
    assert z["mlp_act"] == "kept" and z["remat"]["total"] == rw["remat"]["total"]  # no layer keeps: the same run
    # the none column keeps every layer's act whole: 16 layers x 131,072 tokens x 4096 bf16 more kept
    assert z["none"]["activations_kept"] - rw["none"]["activations_kept"] == 16 * 131072 * 4096 * 2
