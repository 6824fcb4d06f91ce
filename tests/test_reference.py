"""test_reference.py — self-tests of the PyTorch parity reference (tests/parity/).

The reference is only useful if it is right, so it is checked against
formulations written independently of it:
  - the token-by-token gated delta rule against the chunked WY form of docs/design/gdn-kernels.md
    (written here), with and without documents and with an initial state;
  - the document-masked attention against a per-document, per-query loop, and
    the document-aware conv against torch's conv1d run on each document;
  - the HF <-> internal layout: round trips both ways, the internal rows
    against the reference's own HF projections, names/shapes against
    `ringscan plan --json`;
  - documents: a packed batch differs from the same tokens without boundaries
    and equals each document run as its own sample;
  - torch.autograd.gradcheck of a tiny model on the gate, norm and conv
    parameters;
  - safetensors files, make_case.py's files, and compare.py passing an fp32
    run of the reference and failing plausible bugs.
"""
import json
import os
import struct
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT, run

sys.path.insert(0, str(ROOT / "tests" / "parity"))
import compare  # noqa: E402
import layout  # noqa: E402
import make_case  # noqa: E402
import ref_model  # noqa: E402
import safetensors_io  # noqa: E402
from ref_model import FULL, LINEAR, ModelConfig  # noqa: E402

PARITY = ROOT / "tests" / "parity"
F64 = torch.float64


def small_config(**kw):
    """A model small enough for gradcheck: one GDN layer, one attention layer."""
    d = dict(vocab_size=13, hidden_size=16, intermediate_size=12, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
             linear_key_head_dim=4, linear_value_head_dim=6, linear_conv_kernel_dim=4,
             layer_types=[LINEAR, FULL], partial_rotary_factor=0.5, rope_theta=100.0)
    d.update(kw)
    return ModelConfig(**d)


def packed_meta(lengths_per_sample, first_doc_pos=None):
    """pos and doc_pos [B, T] for samples made of documents of the given lengths."""
    B, T = len(lengths_per_sample), sum(lengths_per_sample[0])
    pos = torch.arange(T).repeat(B, 1)
    doc_pos = torch.zeros(B, T, dtype=torch.long)
    for s, lengths in enumerate(lengths_per_sample):
        assert sum(lengths) == T
        start = 0
        for i, n in enumerate(lengths):
            first = first_doc_pos[s] if (first_doc_pos and i == 0) else 0
            doc_pos[s, start:start + n] = torch.arange(first, first + n)
            start += n
    return pos, doc_pos


def doc_spans(doc_pos_row):
    """[(start, end)] of the documents of one sample."""
    starts = [0] + [t for t in range(1, len(doc_pos_row)) if doc_pos_row[t] == 0]
    return list(zip(starts, starts[1:] + [len(doc_pos_row)]))


# ---------------------------------------------------------------- chunked gated delta rule (docs/design/gdn-kernels.md)

def chunk_gated_delta_rule(q, k, v, g, beta, C=64, S0=None):
    """One sequence, chunked WY form: q, k [T, h, dk] (L2-normalised), v [T, h, dv], g, beta [T, h].
    Returns o [T, h, dv] and the final state [h, dk, dv]."""
    T, h, dk = q.shape
    dv = v.shape[-1]
    pad = (-T) % C
    q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))  # padded tokens: beta = g = 0
    N = (T + pad) // C
    # [h, N, C, d]
    q = (q * dk ** -0.5).permute(1, 0, 2).reshape(h, N, C, dk)
    k = k.permute(1, 0, 2).reshape(h, N, C, dk)
    v = v.permute(1, 0, 2).reshape(h, N, C, dv)
    g = g.t().reshape(h, N, C)
    beta = beta.t().reshape(h, N, C)
    kb, vb = k * beta[..., None], v * beta[..., None]
    gam = g.cumsum(-1)
    lower_incl = torch.tril(torch.ones(C, C, dtype=torch.bool))
    strict = torch.tril(torch.ones(C, C, dtype=torch.bool), -1)
    D = torch.where(lower_incl, torch.exp(gam[..., :, None] - gam[..., None, :]), torch.zeros((), dtype=q.dtype))
    L = (kb @ k.transpose(-1, -2)) * D * strict
    A = -L
    for i in range(1, C):  # forward substitution: rows of (I + L)^-1 - I
        A[..., i, :i] = A[..., i, :i] + (A[..., i, :, None] * A[..., :, :i]).sum(-2)
    Tm = A + torch.eye(C, dtype=q.dtype)
    U = Tm @ vb
    W = Tm @ (kb * torch.exp(gam)[..., None])
    S = torch.zeros(h, dk, dv, dtype=q.dtype) if S0 is None else S0.clone()
    out = []
    for n in range(N):
        qn, kn, gn = q[:, n], k[:, n], gam[:, n]
        P = (qn @ kn.transpose(-1, -2)) * D[:, n]
        vnew = U[:, n] - W[:, n] @ S
        out.append((qn * torch.exp(gn)[..., None]) @ S + P @ vnew)
        last = gn[:, -1]
        S = torch.exp(last)[:, None, None] * S + (kn * torch.exp(last[:, None] - gn)[..., None]).transpose(-1, -2) @ vnew
    o = torch.cat(out, dim=1).permute(1, 0, 2)[:T]
    return o, S


def random_gdn_inputs(B, T, h, dk, dv, seed):
    gen = torch.Generator().manual_seed(seed)
    q = ref_model.l2_norm(torch.randn(B, T, h, dk, generator=gen, dtype=F64))
    k = ref_model.l2_norm(torch.randn(B, T, h, dk, generator=gen, dtype=F64))
    v = torch.randn(B, T, h, dv, generator=gen, dtype=F64)
    g = -0.3 * torch.rand(B, T, h, generator=gen, dtype=F64)
    beta = torch.rand(B, T, h, generator=gen, dtype=F64)
    return q, k, v, g, beta


def test_recurrence_matches_chunked_no_documents():
    B, T = 2, 150  # not a multiple of the chunk: exercises the padding
    q, k, v, g, beta = random_gdn_inputs(B, T, 3, 8, 5, seed=1)
    pos, doc_pos = packed_meta([[T]] * B)
    o, S = ref_model.gated_delta_rule(q, k, v, g, beta, doc_pos, return_state=True)
    for b in range(B):
        for C in (64, 16):
            oc, Sc = chunk_gated_delta_rule(q[b], k[b], v[b], g[b], beta[b], C=C)
            assert torch.allclose(o[b], oc, rtol=0, atol=1e-12), (o[b] - oc).abs().max()
            assert torch.allclose(S[b], Sc, rtol=0, atol=1e-12)
    assert o.abs().max() > 0.1  # not a trivial comparison


def test_recurrence_matches_chunked_with_initial_state():
    q, k, v, g, beta = random_gdn_inputs(1, 70, 2, 4, 3, seed=2)
    S0 = torch.randn(1, 2, 4, 3, dtype=F64)
    doc_pos = torch.arange(1, 71)[None]  # continues a document: no reset inside
    o, S = ref_model.gated_delta_rule(q, k, v, g, beta, doc_pos, initial_state=S0, return_state=True)
    oc, Sc = chunk_gated_delta_rule(q[0], k[0], v[0], g[0], beta[0], C=16, S0=S0[0])
    assert torch.allclose(o[0], oc, rtol=0, atol=1e-12) and torch.allclose(S[0], Sc, rtol=0, atol=1e-12)
    # a document start resets the state, so S0 no longer reaches anything
    doc_pos0 = torch.arange(70)[None]
    o0 = ref_model.gated_delta_rule(q, k, v, g, beta, doc_pos0, initial_state=S0)
    assert torch.allclose(o0, ref_model.gated_delta_rule(q, k, v, g, beta, doc_pos0), rtol=0, atol=0)
    assert (o0 - o).abs().max() > 1e-3


def test_recurrence_matches_chunked_per_document():
    lengths = [[1, 70, 13, 64, 1, 80, 11], [40, 1, 100, 2, 97]]
    T = 240
    q, k, v, g, beta = random_gdn_inputs(2, T, 2, 8, 4, seed=3)
    pos, doc_pos = packed_meta(lengths, first_doc_pos=[0, 37])
    o = ref_model.gated_delta_rule(q, k, v, g, beta, doc_pos)
    for b in range(2):
        for s, e in doc_spans(doc_pos[b]):  # each document chunked from its own first token
            oc, _ = chunk_gated_delta_rule(q[b, s:e], k[b, s:e], v[b, s:e], g[b, s:e], beta[b, s:e])
            assert torch.allclose(o[b, s:e], oc, rtol=0, atol=1e-12), (b, s, e)
    # without the resets the output differs after the first document
    o_nodocs = ref_model.gated_delta_rule(q, k, v, g, beta, packed_meta([[T]] * 2)[1])
    assert (o_nodocs[0, 1:] - o[0, 1:]).abs().max() > 1e-2


# ---------------------------------------------------------------- attention and conv with documents

def test_attention_with_documents_matches_per_document_loop():
    lengths = [[5, 1, 30, 12], [20, 28]]
    B, T, nh, nkv, hd = 2, 48, 4, 2, 8
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(B, T, nh, hd, generator=gen, dtype=F64)
    k = torch.randn(B, T, nkv, hd, generator=gen, dtype=F64)
    v = torch.randn(B, T, nkv, hd, generator=gen, dtype=F64)
    pos, doc_pos = packed_meta(lengths)
    o = ref_model.attention(q, k, v, pos, doc_pos)
    for b in range(B):
        for s, e in doc_spans(doc_pos[b]):
            for i in range(s, e):
                for h in range(nh):
                    kv = h // (nh // nkv)
                    scores = (k[b, s:i + 1, kv] @ q[b, i, h]) / hd ** 0.5
                    want = torch.softmax(scores, 0) @ v[b, s:i + 1, kv]
                    assert torch.allclose(o[b, i, h], want, rtol=0, atol=1e-12), (b, i, h)


def test_conv_with_documents_matches_per_document_conv1d():
    lengths = [[1, 2, 9, 3, 1, 8], [6, 18]]
    B, T, C, Kc = 2, 24, 5, 4
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(B, T, C, generator=gen, dtype=F64)
    w = torch.randn(C, 1, Kc, generator=gen, dtype=F64)
    pos, doc_pos = packed_meta(lengths, first_doc_pos=[0, 2])
    y = ref_model.causal_conv_silu(x, w, doc_pos)
    for b in range(B):
        for s, e in doc_spans(doc_pos[b]):
            # HF's formulation on one document: padding Kc-1 on both sides, keep the first T outputs
            want = F.silu(F.conv1d(x[b, s:e].t()[None], w, padding=Kc - 1, groups=C)[0, :, :e - s].t())
            if s == 0 and doc_pos[b, 0] > 0:
                continue  # the sample starts mid-document: checked below
            assert torch.allclose(y[b, s:e], want, rtol=0, atol=1e-13), (b, s, e)
    # sample 1 starts 2 tokens into its document; the tokens before it are not in the sample (zeros)
    want = F.silu(F.conv1d(x[1, :6].t()[None], w, padding=Kc - 1, groups=C)[0, :, :6].t())
    assert torch.allclose(y[1, :6], want, rtol=0, atol=1e-13)


def test_norms_and_gates_by_hand():
    x = torch.tensor([[3.0, 4.0]], dtype=F64)                      # mean(x^2) = 12.5, sum = 25
    w = torch.tensor([0.5, -0.25], dtype=F64)
    assert torch.allclose(ref_model.rms_norm(x, w, 0.5), x / 13 ** 0.5 * torch.tensor([1.5, 0.75]), atol=1e-15)
    z = torch.tensor([[0.0, 2.0]], dtype=F64)
    silu_z = torch.tensor([[0.0, 2.0 / (1 + np.exp(-2.0))]], dtype=F64)
    assert torch.allclose(ref_model.gated_rms_norm(x, z, w, 0.5), w * x / 13 ** 0.5 * silu_z, atol=1e-15)
    # eps 1e-6 on the SUM of squares: sum 1e-6 -> scale 1/sqrt(2e-6)
    y = ref_model.l2_norm(torch.tensor([[1e-3, 0.0]], dtype=F64))
    assert torch.allclose(y, torch.tensor([[1e-3 / (2e-6) ** 0.5, 0.0]], dtype=F64), rtol=1e-12)
    beta, g = ref_model.gdn_gates(torch.tensor([0.0, 2.0], dtype=F64), torch.tensor([0.5, 30.0], dtype=F64),
                                  torch.tensor([np.log(2.0), 0.0], dtype=F64), torch.tensor([-0.5, 1.0], dtype=F64))
    assert torch.allclose(beta, torch.tensor([0.5, 1 / (1 + np.exp(-2.0))], dtype=F64), atol=1e-15)
    assert torch.allclose(g, torch.tensor([-2 * np.log(2.0), -31.0], dtype=F64), atol=1e-12)


def test_gdn_value_head_uses_key_head_h_over_r(monkeypatch):
    """Value head h reads q/k of key head h // (nv/nk) and its own v rows (docs/design/model.md)."""
    cfg = small_config(linear_num_key_heads=2, linear_num_value_heads=6)   # r = 3
    P = ref_model.random_params(cfg, seed=14)
    name = "model.layers.0.linear_attn.in_proj_qkvz.weight"
    P[name] = P[name].clone().requires_grad_(True)
    seen = {}
    norm = ref_model.gated_rms_norm

    def capture(o, z, w, eps):
        seen["o"] = o
        return norm(o, z, w, eps)

    monkeypatch.setattr(ref_model, "gated_rms_norm", capture)
    x = torch.randn(1, 9, cfg.hidden_size, dtype=F64)
    ref_model.gdn_block(P, cfg, 0, x, torch.arange(9)[None])
    dk, dv, r = cfg.linear_key_head_dim, cfg.linear_value_head_dim, 3
    w = 2 * dk + 2 * r * dv
    for h in range(6):
        (grad,) = torch.autograd.grad(seen["o"][..., h, :].sum(), P[name], retain_graph=True)
        used = grad.abs().sum(1) > 0
        for kh in range(2):
            assert bool(used[kh * w:kh * w + 2 * dk].all()) == (kh == h // r), (h, kh)
        v_rows = [g * w + 2 * dk + j * dv for g in range(2) for j in range(r)]   # first row of each head's v
        assert [bool(used[row]) for row in v_rows] == [i == h for i in range(6)], h


def test_rope_rotates_only_the_first_rd_dims():
    x = torch.randn(1, 3, 2, 8, dtype=F64)
    pos = torch.tensor([[0, 5, 9]])
    y = ref_model.rope(x, pos, 4, 100.0)
    assert torch.equal(y[:, 0], x[:, 0])             # angle 0
    assert torch.equal(y[..., 4:], x[..., 4:])       # pass-through dims
    # pair (0, 2) at pos 5 rotates by 5 * 100^0 rad, pair (1, 3) by 5 * 100^(-1/2)
    for i, f in ((0, 1.0), (1, 0.1)):
        c, s = np.cos(5 * f), np.sin(5 * f)
        a, b = x[0, 1, :, i], x[0, 1, :, i + 2]
        assert torch.allclose(y[0, 1, :, i], a * c - b * s, atol=1e-14)
        assert torch.allclose(y[0, 1, :, i + 2], b * c + a * s, atol=1e-14)


# ---------------------------------------------------------------- layout

def test_layout_round_trips():
    for cfg in (small_config(), small_config(tie_word_embeddings=True, layer_types=[FULL, LINEAR]),
                small_config(linear_num_key_heads=1, num_key_value_heads=1)):
        hf = ref_model.random_params(cfg, seed=6)
        internal = layout.hf_to_internal(hf, cfg)
        assert {k: tuple(v.shape) for k, v in internal.items()} == layout.internal_shapes(cfg)
        assert list(internal) == list(layout.internal_shapes(cfg))
        back = layout.internal_to_hf(internal, cfg)
        assert list(back) == list(hf) and all(torch.equal(back[k], hf[k]) for k in hf)
        again = layout.hf_to_internal(back, cfg)
        internal2 = {k: torch.randn(v.shape, dtype=F64) for k, v in internal.items()}
        assert all(torch.equal(again[k], internal[k]) for k in internal)
        hf2 = layout.internal_to_hf(internal2, cfg)
        assert {k: tuple(v.shape) for k, v in hf2.items()} == ref_model.hf_shapes(cfg)
        round2 = layout.hf_to_internal(hf2, cfg)
        assert all(torch.equal(round2[k], internal2[k]) for k in internal2)


def test_internal_rows_are_what_the_model_computes():
    """The internal [q|k|v|z|b|a] and [q|gate|k|v] rows, applied to x, give the reference's
    own (HF-sliced) projections in global head order."""
    cfg = small_config(num_hidden_layers=2)
    hf = ref_model.random_params(cfg, seed=7)
    internal = layout.hf_to_internal(hf, cfg)
    x = torch.randn(2, 5, cfg.hidden_size, dtype=F64)
    # GDN, layer 0
    q, k, v, z, b, a = ref_model.gdn_projections(hf, cfg, 0, x)
    y = x @ internal["model.layers.0.linear_attn.in_proj"].t()
    Kd, Vd, nv = 2 * 4, 4 * 6, 4
    parts = torch.split(y, [Kd, Kd, Vd, Vd, nv, nv], dim=-1)
    for got, want in zip(parts, (q, k, v, z, b, a)):
        assert torch.allclose(got, want.reshape(2, 5, -1), rtol=0, atol=1e-14)
    w = hf["model.layers.0.linear_attn.conv1d.weight"]
    assert torch.equal(internal["model.layers.0.linear_attn.conv1d"], w[:, 0, :])
    # attention, layer 1
    q, gate, k, v = ref_model.attention_projections(hf, cfg, 1, x)
    y = x @ internal["model.layers.1.self_attn.in_proj"].t()
    parts = torch.split(y, [4 * 8, 4 * 8, 2 * 8, 2 * 8], dim=-1)
    for got, want in zip(parts, (q, gate, k, v)):
        assert torch.allclose(got, want.reshape(2, 5, -1), rtol=0, atol=1e-14)
    # MLP
    gu = x @ internal["model.layers.1.mlp.gate_up"].t()
    assert torch.allclose(gu[..., :12], x @ hf["model.layers.1.mlp.gate_proj.weight"].t(), atol=1e-14)
    assert torch.allclose(gu[..., 12:], x @ hf["model.layers.1.mlp.up_proj.weight"].t(), atol=1e-14)


def plan_parameters(ringscan, config, *sets):
    args = [ringscan, "plan", config, "--json"]
    for s in sets:
        args += ["--set", s]
    r = run(args)
    assert r.returncode in (0, 1), r.stderr  # 1: does not fit; the counts are still printed
    return json.loads(r.stdout)["parameters"]


@pytest.mark.parametrize("config,sets", [
    ("configs/tiny-cpu.yaml", ()),
    ("configs/tiny-cpu.yaml", ("model.tie_word_embeddings=true",
                               "model.layer_types=[full_attention, linear_attention, linear_attention, full_attention]")),
    ("configs/tiny-cpu.yaml", ("model.linear_num_key_heads=1", "model.num_key_value_heads=1")),
    ("configs/hybrid-1b-256k-h200x4.yaml", ()),
])
def test_internal_shapes_match_plan(ringscan, config, sets):
    _, resolved = make_case.resolve_config(str(ROOT / config), sets, str(ringscan))
    cfg = ModelConfig.from_mapping(resolved["model"])
    specs = layout.internal_specs(cfg)
    p = plan_parameters(ringscan, config, *sets)
    numel = {k: int(np.prod(shape)) for k, (shape, _) in specs.items()}
    assert sum(numel.values()) == p["total"]
    assert ref_model.param_count(cfg) == p["hf_state_dict"]
    for group in (layout.MATRIX, layout.NORM, layout.GDN_GATE, layout.CONV, layout.NORM_SCALE, "embedding"):
        assert sum(n for k, n in numel.items() if specs[k][1] == group) == p["groups"][group], group
    # matmul: every 2-D tensor but conv1d, plus the head when it is tied
    matmul = sum(n for k, n in numel.items() if len(specs[k][0]) == 2 and specs[k][1] != layout.CONV
                 and k != "model.embed_tokens")
    if cfg.tie_word_embeddings:
        matmul += cfg.vocab_size * cfg.hidden_size
    assert matmul == p["matmul"]


# ---------------------------------------------------------------- documents in the whole model

def test_document_boundaries_matter_and_isolate():
    cfg = small_config(num_hidden_layers=3, layer_types=[LINEAR, FULL, LINEAR])
    P = ref_model.random_params(cfg, seed=8)
    lengths = [[7, 1, 30, 10], [25, 23]]
    T = 48
    gen = torch.Generator().manual_seed(9)
    tokens = torch.randint(0, cfg.vocab_size, (2, T), generator=gen)
    pos, doc_pos = packed_meta(lengths)
    packed = ref_model.forward(P, cfg, tokens, pos, doc_pos)
    # the same tokens as one document each: different after the first document
    flat = ref_model.forward(P, cfg, tokens, *packed_meta([[T], [T]]))
    assert torch.allclose(flat[:, :7], packed[:, :7], rtol=0, atol=1e-12)
    assert (flat[0, 7:] - packed[0, 7:]).abs().max() > 1e-3
    # each document alone, as its own sample (positions kept, and restarted at 0) gives the same logits
    for b in range(2):
        for s, e in doc_spans(doc_pos[b]):
            alone = ref_model.forward(P, cfg, tokens[b:b + 1, s:e], pos[b:b + 1, s:e], doc_pos[b:b + 1, s:e])
            assert torch.allclose(alone[0], packed[b, s:e], rtol=0, atol=1e-12), (b, s, e)
            moved = ref_model.forward(P, cfg, tokens[b:b + 1, s:e], torch.arange(e - s)[None],
                                      doc_pos[b:b + 1, s:e])
            assert torch.allclose(moved[0], packed[b, s:e], rtol=0, atol=1e-10), (b, s, e)


def test_check_batch_rejects_malformed_metadata():
    cfg = small_config()
    tokens = torch.zeros(1, 6, dtype=torch.long)
    targets = torch.zeros(1, 6, dtype=torch.long)
    pos, doc_pos = packed_meta([[2, 4]])
    ref_model.check_batch(cfg, tokens, targets, pos, doc_pos)
    bad = doc_pos.clone()
    bad[0, 3] = 5
    with pytest.raises(ValueError):
        ref_model.check_batch(cfg, tokens, targets, pos, bad)
    with pytest.raises(ValueError):
        ref_model.check_batch(cfg, tokens, targets - 2, pos, doc_pos)
    with pytest.raises(ValueError):
        ref_model.check_batch(cfg, tokens, targets, pos.flip(1), doc_pos)


def test_loss_is_mean_over_tokens_with_a_target():
    cfg = small_config()
    P = ref_model.random_params(cfg, seed=10)
    tokens = torch.randint(0, cfg.vocab_size, (2, 9))
    targets = torch.randint(0, cfg.vocab_size, (2, 9))
    targets[0, 3] = targets[1, 8] = targets[1, 0] = -1
    pos, doc_pos = packed_meta([[9], [9]])
    logits = ref_model.forward(P, cfg, tokens, pos, doc_pos)
    keep = targets >= 0
    want = F.cross_entropy(logits[keep], targets[keep], reduction="mean")
    assert torch.allclose(ref_model.loss_fn(P, cfg, tokens, targets, pos, doc_pos), want, rtol=1e-14)


def test_gradcheck_tiny_model():
    cfg = small_config(vocab_size=7, hidden_size=8, intermediate_size=6, linear_value_head_dim=4)
    P = ref_model.random_params(cfg, seed=11, std=0.3)
    tokens = torch.randint(0, 7, (2, 10), generator=torch.Generator().manual_seed(12))
    targets = torch.randint(0, 7, (2, 10), generator=torch.Generator().manual_seed(13))
    targets[:, -1] = -1
    pos, doc_pos = packed_meta([[3, 1, 6], [10]], first_doc_pos=[0, 2])
    names = ["model.layers.0.linear_attn.A_log", "model.layers.0.linear_attn.dt_bias",
             "model.layers.0.linear_attn.norm.weight", "model.layers.0.linear_attn.conv1d.weight",
             "model.layers.0.linear_attn.in_proj_ba.weight", "model.layers.0.input_layernorm.weight",
             "model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight",
             "model.norm.weight"]

    def f(*xs):
        Q = dict(P)
        Q.update(zip(names, xs))
        return ref_model.loss_fn(Q, cfg, tokens, targets, pos, doc_pos)

    inputs = tuple(P[n].clone().requires_grad_(True) for n in names)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-8, rtol=1e-6)


# ---------------------------------------------------------------- files

def test_safetensors_round_trip_and_layout(tmp_path):
    tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array(2.5, dtype=np.float64),
               "c": np.array([-1, 7], dtype=np.int32), "d": np.array([[1 << 40]], dtype=np.int64),
               "e": np.zeros((0, 4), np.float32), "f": np.array([1, 0], dtype=np.uint8)}
    path = tmp_path / "x.safetensors"
    safetensors_io.save(path, tensors, {"k": "v"})
    back, meta = safetensors_io.load(path, with_metadata=True)
    assert meta == {"k": "v"} and list(back) == list(tensors)
    for k in tensors:
        assert back[k].dtype == tensors[k].dtype and back[k].shape == tensors[k].shape
        assert np.array_equal(back[k], tensors[k])
    # the bytes, read by hand: u64 header length, JSON, 8-byte aligned data, little-endian
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % 8 == 0
    header = json.loads(raw[8:8 + n])
    assert header["a"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
    assert header["b"] == {"dtype": "F64", "shape": [], "data_offsets": [24, 32]}
    assert struct.unpack("<d", raw[8 + n + 24:8 + n + 32])[0] == 2.5
    assert struct.unpack("<2i", raw[8 + n + 32:8 + n + 40]) == (-1, 7)


def test_safetensors_rejects_malformed(tmp_path):
    def write(header, data=b""):
        p = tmp_path / "bad.safetensors"
        h = json.dumps(header).encode()
        p.write_bytes(struct.pack("<Q", len(h)) + h + data)
        return p

    cases = [
        write({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),   # size mismatch
        write({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 4),   # past the end
        write({"a": {"dtype": "X9", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),    # dtype
        write({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
               "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),   # overlap
        write({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8),   # hole
        write({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 6),   # trailing bytes
    ]
    p = tmp_path / "short.safetensors"
    p.write_bytes(struct.pack("<Q", 1000) + b"{}")
    cases.append(p)
    p = tmp_path / "dup.safetensors"
    h = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    p.write_bytes(struct.pack("<Q", len(h)) + h + b"\0")
    cases.append(p)
    for c in cases:
        with pytest.raises(safetensors_io.SafetensorsError):
            safetensors_io.load(c)


def test_parse_config_show(ringscan):
    text, d = make_case.resolve_config(str(ROOT / "configs/tiny-cpu.yaml"),
                                       ["model.layer_types=[linear_attention, full_attention, "
                                        "linear_attention, full_attention]", "model.rope_theta=1234567.25"],
                                       str(ringscan))
    m = d["model"]
    assert m["hidden_size"] == 256 and m["rms_norm_eps"] == 1e-6 and m["rope_theta"] == 1234567.25
    assert m["layer_types"] == [LINEAR, FULL, LINEAR, FULL] and m["tie_word_embeddings"] is False
    assert d["run"]["name"] == "tiny-cpu" and d["data"]["seq_len"] == 512
    cfg = ModelConfig.from_mapping(m)
    assert [cfg.layer_type(i) for i in range(4)] == [LINEAR, FULL, LINEAR, FULL]
    assert ModelConfig.from_mapping(make_case.parse_config_show(text.replace(
        "layer_types: [linear_attention, full_attention, linear_attention, full_attention]",
        "layer_types: []"))["model"]).layer_type(3) == FULL


@pytest.fixture(scope="module")
def tiny_case(tmp_path_factory, ringscan):
    out = tmp_path_factory.mktemp("case")
    r = run(["/usr/bin/python3", PARITY / "make_case.py", "configs/tiny-cpu.yaml", out, "--seq-len", "256",
             "--set", "parallel.dp=2", "--set", "parallel.cp=2", "--ringscan", ringscan], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    _, resolved = make_case.resolve_config(str(ROOT / "configs/tiny-cpu.yaml"), (), str(ringscan))
    return out, ModelConfig.from_mapping(resolved["model"])


def test_make_case_files(tiny_case, ringscan):
    out, cfg = tiny_case
    # config.yaml: the resolved config, with the batch shape in it; ringscan reads it back unchanged
    text = (out / "config.yaml").read_text()
    d = make_case.parse_config_show(text)
    assert d["data"]["seq_len"] == 256 and d["data"]["micro_batch"] == 2 and d["parallel"]["cp"] == 2
    assert ModelConfig.from_mapping(d["model"]) == cfg
    r = run([ringscan, "config", "show", out / "config.yaml"])
    assert r.returncode == 0 and r.stdout == text, r.stderr
    specs = layout.internal_specs(cfg)
    w = safetensors_io.load(out / "weights.safetensors")
    assert list(w) == list(specs)
    assert all(w[k].dtype == np.float32 and w[k].shape == specs[k][0] for k in specs)
    b = safetensors_io.load(out / "batch.safetensors")
    assert sorted(b) == ["doc_pos", "pos", "targets", "tokens"]
    assert all(a.dtype == np.int32 and a.shape == (2, 256) for a in b.values())
    t = {k: torch.from_numpy(v.astype(np.int64)) for k, v in b.items()}
    ref_model.check_batch(cfg, t["tokens"], t["targets"], t["pos"], t["doc_pos"])
    # the promised document cases
    lengths = [e - s for row in t["doc_pos"] for s, e in doc_spans(row)]
    assert 1 in lengths and any(n < 64 for n in lengths) and any(n > 64 for n in lengths)
    starts = [s for row in t["doc_pos"] for s, _ in doc_spans(row)]
    assert any(s % 64 for s in starts) and t["doc_pos"][1, 0] > 0
    # targets: next token inside a document, -1 at each document's last token
    for row in range(2):
        for s, e in doc_spans(t["doc_pos"][row]):
            assert torch.equal(t["targets"][row, s:e - 1], t["tokens"][row, s + 1:e])
            assert t["targets"][row, e - 1] == -1
    ref = safetensors_io.load(out / "ref.safetensors")
    assert list(ref) == ["loss"] + list(specs)
    assert ref["loss"].shape == () and ref["loss"].dtype == np.float64
    for k in specs:
        assert ref[k].dtype == np.float64 and ref[k].shape == specs[k][0]
        assert np.linalg.norm(ref[k]) > 0, f"gradient of {k} is zero: not exercised"
    # the norm and gate weights are random, not the spec's init
    for k in specs:
        if specs[k][1] in (layout.NORM, layout.NORM_SCALE, layout.GDN_GATE):
            assert np.std(w[k]) > 0.1, k


def test_make_case_loss_recomputes_from_the_files(tiny_case):
    """Independent of make_case's in-memory path: internal F32 weights -> HF -> loss."""
    out, cfg = tiny_case
    w = safetensors_io.load(out / "weights.safetensors")
    P = layout.internal_to_hf({k: torch.from_numpy(v).to(F64) for k, v in w.items()}, cfg)
    b = {k: torch.from_numpy(v.astype(np.int64)) for k, v in safetensors_io.load(out / "batch.safetensors").items()}
    loss = ref_model.loss_fn(P, cfg, b["tokens"], b["targets"], b["pos"], b["doc_pos"])
    assert float(loss) == pytest.approx(float(safetensors_io.load(out / "ref.safetensors")["loss"]), rel=1e-14)


def _internal_grads(P, cfg, batch, dtype):
    loss, g = ref_model.loss_and_grads(P, cfg, *batch, dtype=dtype)
    out = {"loss": np.array(loss)}
    out.update({k: v.to(F64).numpy() for k, v in layout.hf_to_internal(g, cfg).items()})
    return out


def test_compare_passes_fp32_and_fails_bugs(tiny_case, tmp_path, monkeypatch):
    """An fp32 run of the reference passes the default bounds; plausible bugs do not."""
    out, cfg = tiny_case
    w = safetensors_io.load(out / "weights.safetensors")
    P = layout.internal_to_hf({k: torch.from_numpy(v).to(F64) for k, v in w.items()}, cfg)
    batch = [torch.from_numpy(v.astype(np.int64)) for v in
             (safetensors_io.load(out / "batch.safetensors")[k] for k in ("tokens", "targets", "pos", "doc_pos"))]
    ref = safetensors_io.load(out / "ref.safetensors")

    fp32 = _internal_grads(P, cfg, batch, torch.float32)
    ok, rows, problems = compare.compare(ref, fp32)
    assert ok, compare.format_table(rows[:5])
    assert rows[0][2] < 1e-5 * 5  # margin: fp32 is ~1e-5 at worst

    # through the CLI, from files
    safetensors_io.save(tmp_path / "grads.safetensors", {k: v.astype(np.float32) for k, v in fp32.items()})
    r = run(["/usr/bin/python3", PARITY / "compare.py", out / "ref.safetensors", tmp_path / "grads.safetensors"])
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr

    # a layout bug: two value heads of in_proj swapped in one layer
    bad = dict(fp32)
    name = "model.layers.1.linear_attn.in_proj"
    Kd = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    dv = cfg.linear_value_head_dim
    rows_v = bad[name].copy()
    rows_v[2 * Kd:2 * Kd + dv], rows_v[2 * Kd + dv:2 * Kd + 2 * dv] = \
        bad[name][2 * Kd + dv:2 * Kd + 2 * dv], bad[name][2 * Kd:2 * Kd + dv]
    bad[name] = rows_v
    safetensors_io.save(tmp_path / "bad.safetensors", bad)
    r = run(["/usr/bin/python3", PARITY / "compare.py", out / "ref.safetensors", tmp_path / "bad.safetensors"])
    assert r.returncode == 1 and "FAIL" in r.stdout and name in r.stdout.splitlines()[1]

    # a missing tensor and a wrong shape are failures too
    bad = dict(fp32)
    del bad["model.norm"]
    bad["lm_head"] = bad["lm_head"][:, :-1]
    ok, _, problems = compare.compare(ref, bad)
    assert not ok and len(problems) == 2

    # model bugs a C implementation could make, each must miss the bounds
    def zero_centred_gated_norm(x, z, w, eps):
        return ref_model.rms_norm(x, w, eps) * F.silu(z)

    def no_doc_reset_in_delta_rule(q, k, v, g, beta, doc_pos, **kw):
        return delta_rule(q, k, v, g, beta, torch.ones_like(doc_pos), **kw)

    def conv_taps_reversed(x, w, doc_pos):
        return causal_conv(x, w.flip(-1), doc_pos)

    def rope_interleaved_pairs(x, pos, rd, theta):  # GPT-J pairs (2i, 2i+1) instead of (i, i + rd/2)
        perm = torch.cat([torch.arange(0, rd, 2), torch.arange(1, rd, 2), torch.arange(rd, x.shape[-1])])
        return rope(x[..., perm], pos, rd, theta)[..., torch.argsort(perm)]

    causal_conv, delta_rule, rope = ref_model.causal_conv_silu, ref_model.gated_delta_rule, ref_model.rope
    for attr, fn in (("gated_rms_norm", zero_centred_gated_norm), ("gated_delta_rule", no_doc_reset_in_delta_rule),
                     ("causal_conv_silu", conv_taps_reversed), ("rope", rope_interleaved_pairs)):
        with monkeypatch.context() as m:
            m.setattr(ref_model, attr, fn)
            wrong = _internal_grads(P, cfg, batch, torch.float32)
        ok, rows, _ = compare.compare(ref, wrong)
        assert not ok, attr
        assert rows[0][2] > 1e-3, (attr, rows[0])
        print(f"{attr}: worst {rows[0][0]} {rows[0][2]:.2e}")
