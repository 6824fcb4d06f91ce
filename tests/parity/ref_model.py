"""ref_model.py — an independent PyTorch implementation of the ringscan model
(Qwen3-Next with a dense MLP in every layer), written from
docs/design/model.md, used as the whole-model parity reference for the
C trainer (make_case.py runs it; tests/test_reference.py checks it).

It is a reference, not fast code: plain torch ops on the Hugging Face
parameter layout (names and shapes of docs/design/model.md, e.g. the group-interleaved
in_proj_qkvz / in_proj_ba, the per-head [q, gate] interleaved q_proj, conv1d
[Cc, 1, Kc]), the gated delta rule token by token, attention with an explicit
[T, T] mask. Run it in torch.float64; autograd gives every gradient.

Inputs per sample follow lib/backend/backend.h: tokens, targets (-1 = no prediction,
otherwise the token this position predicts; no shift is applied here), pos
(position of the token in its sample: RoPE angle and causal order) and doc_pos
(tokens of the same document before it; 0 at a document start). Two tokens are
in the same document iff pos - doc_pos agree. Documents:
  - the conv reads 0 for taps that reach before the token's document start
    (and before the sample start),
  - the GDN state is reset to 0 at every token with doc_pos == 0,
  - attention sees only keys of the same document with pos_k <= pos_q.
Loss = mean cross-entropy over all tokens of the batch [B, T] with target >= 0.

Qwen3.5 dense (transformers' Qwen3_5ForCausalLM) is the same model with the GDN input projection cut
into four plain tensors: in_proj_qkv [2 nk dk + nv dv, H] (its output split [query | key | value] in
head order, the conv's channel order), in_proj_z [nv dv, H], in_proj_b and in_proj_a [nv, H], value
head h reading key head h // (nv / nk). The parameters P may use either naming (hf_shapes(cfg,
"qwen3_5") lists the Qwen3.5 one); next_to_qwen3_5 converts a Qwen3-Next state dict.

Kimi Delta Attention (linear_attention "kda", docs/design/kda.md) replaces the GDN mixer of every
linear layer by kimi_linear's KimiDeltaAttention, its tensors under linear_attn. with kimi_linear's
names: q_proj, k_proj, v_proj, three convs q_conv1d, k_conv1d, v_conv1d [D, 1, Kc] (SiLU), the decay
gate f = f_b_proj(f_a_proj(x)), g = -exp(A_log[h]) softplus(f + dt_bias) per key channel, beta =
sigmoid(b_proj(x)), L2-normalised q and k, the delta rule with the state's key rows decayed by
exp(g) each, o_norm (plain-scale RMSNorm) times sigmoid(g_b_proj(g_a_proj(x))), o_proj. Written here
from transformers' kimi_linear (torch_recurrent_kda, KimiLinearRMSNormGated) and FLA's
naive_recurrent_kda, independently of the C code.
"""
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

LINEAR = "linear_attention"
FULL = "full_attention"


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    full_attention_interval: int = 4
    layer_types: list = field(default_factory=list)  # empty: derived from the interval
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.25
    tie_word_embeddings: bool = False
    linear_attention: str = "gdn"  # or "kda": Kimi Delta Attention in every linear layer

    @classmethod
    def from_mapping(cls, m):
        """From a dict of config keys (e.g. the `model:` section of `ringscan config show`);
        keys this model does not use are ignored. A config.json's rope_parameters (Qwen3.5 keeps
        rope_theta and partial_rotary_factor there only) override the top-level keys."""
        names = set(cls.__dataclass_fields__)
        m = dict(m)
        for k in ("rope_theta", "partial_rotary_factor"):
            if isinstance(m.get("rope_parameters"), dict) and k in m["rope_parameters"]:
                m[k] = m["rope_parameters"][k]
        return cls(**{k: v for k, v in m.items() if k in names})

    def layer_type(self, i):
        if self.layer_types:
            return self.layer_types[i]
        return FULL if (i + 1) % self.full_attention_interval == 0 else LINEAR

    @property
    def rotary_dim(self):
        return int(self.head_dim * self.partial_rotary_factor)

    def __post_init__(self):
        if self.layer_types and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError("layer_types must have num_hidden_layers entries")
        for t in self.layer_types:
            if t not in (LINEAR, FULL):
                raise ValueError(f"unknown layer type {t!r}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.rotary_dim % 2:
            raise ValueError("the rotary dim must be even")
        if self.linear_attention not in ("gdn", "kda"):
            raise ValueError(f"unknown linear_attention {self.linear_attention!r}")
        if self.linear_attention == "kda" and (self.linear_num_key_heads != self.linear_num_value_heads or
                                               self.linear_key_head_dim != self.linear_value_head_dim):
            raise ValueError("kda needs as many key as value heads, of one width")


def hf_shapes(cfg, fmt="qwen3_next"):
    """Names and shapes of the Hugging Face state dict (docs/design/model.md), in a fixed order;
    fmt "qwen3_5": the four plain GDN input projections instead of in_proj_qkvz / in_proj_ba."""
    H, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    nk, nv, dk, dv = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, \
        cfg.linear_value_head_dim
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    Cc = 2 * nk * dk + nv * dv
    s = {"model.embed_tokens.weight": (V, H)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = (H,)
        s[p + "post_attention_layernorm.weight"] = (H,)
        s[p + "mlp.gate_proj.weight"] = (I, H)
        s[p + "mlp.up_proj.weight"] = (I, H)
        s[p + "mlp.down_proj.weight"] = (H, I)
        if cfg.layer_type(i) == LINEAR and cfg.linear_attention == "kda":
            Kc, a = cfg.linear_conv_kernel_dim, p + "linear_attn."
            s[a + "q_proj.weight"] = (nk * dk, H)
            s[a + "k_proj.weight"] = (nk * dk, H)
            s[a + "v_proj.weight"] = (nv * dv, H)
            s[a + "q_conv1d.weight"] = (nk * dk, 1, Kc)
            s[a + "k_conv1d.weight"] = (nk * dk, 1, Kc)
            s[a + "v_conv1d.weight"] = (nv * dv, 1, Kc)
            s[a + "f_a_proj.weight"] = (dv, H)
            s[a + "f_b_proj.weight"] = (nv * dk, dv)
            s[a + "b_proj.weight"] = (nv, H)
            s[a + "g_a_proj.weight"] = (dv, H)
            s[a + "g_b_proj.weight"] = (nv * dv, dv)
            s[a + "A_log"] = (nv,)
            s[a + "dt_bias"] = (nv * dk,)
            s[a + "o_norm.weight"] = (dv,)
            s[a + "o_proj.weight"] = (H, nv * dv)
            continue
        if cfg.layer_type(i) == LINEAR and fmt == "qwen3_5":
            s[p + "linear_attn.in_proj_qkv.weight"] = (Cc, H)
            s[p + "linear_attn.in_proj_z.weight"] = (nv * dv, H)
            s[p + "linear_attn.in_proj_b.weight"] = (nv, H)
            s[p + "linear_attn.in_proj_a.weight"] = (nv, H)
        elif cfg.layer_type(i) == LINEAR:
            s[p + "linear_attn.in_proj_qkvz.weight"] = (2 * nk * dk + 2 * nv * dv, H)
            s[p + "linear_attn.in_proj_ba.weight"] = (2 * nv, H)
        if cfg.layer_type(i) == LINEAR:
            s[p + "linear_attn.conv1d.weight"] = (Cc, 1, cfg.linear_conv_kernel_dim)
            s[p + "linear_attn.dt_bias"] = (nv,)
            s[p + "linear_attn.A_log"] = (nv,)
            s[p + "linear_attn.norm.weight"] = (dv,)
            s[p + "linear_attn.out_proj.weight"] = (H, nv * dv)
        else:
            s[p + "self_attn.q_proj.weight"] = (nh * hd * 2, H)
            s[p + "self_attn.k_proj.weight"] = (nkv * hd, H)
            s[p + "self_attn.v_proj.weight"] = (nkv * hd, H)
            s[p + "self_attn.o_proj.weight"] = (H, nh * hd)
            s[p + "self_attn.q_norm.weight"] = (hd,)
            s[p + "self_attn.k_norm.weight"] = (hd,)
    s["model.norm.weight"] = (H,)
    if not cfg.tie_word_embeddings:
        s["lm_head.weight"] = (V, H)
    return s


# ---------------------------------------------------------------- basic ops

def rms_norm(x, w, eps):
    """Zero-centred RMSNorm over the last dim: x / sqrt(mean(x^2) + eps) * (1 + w)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


def gated_rms_norm(x, z, w, eps):
    """GDN gated RMSNorm over the last dim: w * x / sqrt(mean(x^2) + eps) * silu(z) (plain w)."""
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)) * F.silu(z)


def l2_norm(x):
    """x / sqrt(sum(x^2) + 1e-6) over the last dim (eps on the sum)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


def gdn_gates(b, a, A_log, dt_bias):
    """beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias) (torch's softplus: linear above 20)."""
    return torch.sigmoid(b), -torch.exp(A_log) * F.softplus(a + dt_bias)


def causal_conv_silu(x, w, doc_pos):
    """Causal depthwise conv + SiLU. x [B, T, C], w [C, 1, Kc] (tap Kc-1 = current token),
    doc_pos [B, T]. Tap j looks back b = Kc-1-j tokens and reads 0 when b > doc_pos[t]
    (before the document) or b > t (before the sample)."""
    B, T, C = x.shape
    Kc = w.shape[-1]
    y = torch.zeros_like(x)
    for j in range(Kc):
        b = Kc - 1 - j
        if b >= T:
            continue
        shifted = torch.cat([x.new_zeros(B, b, C), x[:, :T - b]], dim=1)  # row t holds x[t - b]
        inside = (doc_pos >= b).to(x.dtype).unsqueeze(-1)
        y = y + shifted * inside * w[:, 0, j]
    return F.silu(y)


def gated_delta_rule(q, k, v, g, beta, doc_pos, initial_state=None, return_state=False):
    """The gated delta rule, token by token (docs/design/model.md).
    q, k [B, T, nv, dk] (already L2-normalised, key heads already repeated to nv),
    v [B, T, nv, dv], g, beta [B, T, nv], doc_pos [B, T]. Per value head, with state
    S [dk, dv] starting at initial_state (or 0) and reset to 0 where doc_pos == 0:
        S = exp(g_t) S;  u = S^T k_t;  S = S + k_t (beta_t (v_t - u))^T;  o_t = S^T q_t dk^-1/2.
    Returns o [B, T, nv, dv] (and the final state [B, nv, dk, dv]).
    g [B, T, nv, dk] (Kimi Delta Attention): a decay per key channel, S = Diag(exp(g_t)) S."""
    B, T, nv, dk = q.shape
    dv = v.shape[-1]
    scale = dk ** -0.5
    S = q.new_zeros(B, nv, dk, dv) if initial_state is None else initial_state
    keep = (doc_pos != 0).to(q.dtype)  # [B, T]
    outs = []
    for t in range(T):
        decay = torch.exp(g[:, t])[:, :, :, None] if g.dim() == 4 else torch.exp(g[:, t])[:, :, None, None]
        S = S * (keep[:, t, None, None, None] * decay)
        kt = k[:, t]                                           # [B, nv, dk]
        u = torch.einsum("bhkv,bhk->bhv", S, kt)               # memory read
        delta = beta[:, t, :, None] * (v[:, t] - u)            # [B, nv, dv]
        S = S + kt[:, :, :, None] * delta[:, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t] * scale))
    o = torch.stack(outs, dim=1)
    return (o, S) if return_state else o


def rope(x, pos, rd, theta):
    """Partial rotary embedding, rotate-half pairing inside the first rd dims of every head.
    x [B, T, heads, hd], pos [B, T]."""
    half = rd // 2
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2.0 / rd)
    ang = pos.to(torch.float64).unsqueeze(-1) * inv_freq                  # [B, T, half]
    cos = torch.cos(ang).to(x.dtype).unsqueeze(2)
    sin = torch.sin(ang).to(x.dtype).unsqueeze(2)
    x1, x2, rest = x[..., :half], x[..., half:rd], x[..., rd:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def attention_mask(pos, doc_pos):
    """[B, Tq, Tk] bool: key j visible to query i iff same document and pos_j <= pos_i."""
    doc = pos - doc_pos
    same = doc.unsqueeze(2) == doc.unsqueeze(1)
    causal = pos.unsqueeze(1) <= pos.unsqueeze(2)
    return same & causal


def attention(q, k, v, pos, doc_pos):
    """Softmax attention, scale hd^-1/2, GQA (query head h uses kv head h // (nh/nkv)).
    q [B, T, nh, hd], k, v [B, T, nkv, hd]. Returns [B, T, nh, hd]."""
    nh, nkv, hd = q.shape[2], k.shape[2], q.shape[3]
    k = k.repeat_interleave(nh // nkv, dim=2)
    v = v.repeat_interleave(nh // nkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * hd ** -0.5
    s = s.masked_fill(~attention_mask(pos, doc_pos).unsqueeze(1), float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


# ---------------------------------------------------------------- blocks

def gdn_projections(P, cfg, i, x):
    """The GDN input projections of layer i from the HF tensors, de-interleaved:
    q, k [B, T, nk, dk]; v, z [B, T, nv, dv]; b, a [B, T, nv] (value heads in global order)."""
    p = f"model.layers.{i}.linear_attn."
    B, T, _ = x.shape
    nk, nv, dk, dv = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, \
        cfg.linear_value_head_dim
    r = nv // nk
    if p + "in_proj_qkv.weight" in P:  # Qwen3.5: plain [query | key | value], z, b, a per value head
        qkv = x @ P[p + "in_proj_qkv.weight"].t()
        q = qkv[..., :nk * dk].reshape(B, T, nk, dk)
        k = qkv[..., nk * dk:2 * nk * dk].reshape(B, T, nk, dk)
        v = qkv[..., 2 * nk * dk:].reshape(B, T, nv, dv)
        z = (x @ P[p + "in_proj_z.weight"].t()).reshape(B, T, nv, dv)
        return q, k, v, z, x @ P[p + "in_proj_b.weight"].t(), x @ P[p + "in_proj_a.weight"].t()
    qkvz = (x @ P[p + "in_proj_qkvz.weight"].t()).view(B, T, nk, 2 * dk + 2 * r * dv)
    q = qkvz[..., :dk]
    k = qkvz[..., dk:2 * dk]
    v = qkvz[..., 2 * dk:2 * dk + r * dv].reshape(B, T, nv, dv)   # group g holds heads g*r .. g*r+r-1
    z = qkvz[..., 2 * dk + r * dv:].reshape(B, T, nv, dv)
    ba = (x @ P[p + "in_proj_ba.weight"].t()).view(B, T, nk, 2 * r)
    b = ba[..., :r].reshape(B, T, nv)
    a = ba[..., r:].reshape(B, T, nv)
    return q, k, v, z, b, a


def gdn_block(P, cfg, i, x, doc_pos):
    """Gated DeltaNet mixer of layer i on the normed input x [B, T, H]."""
    p = f"model.layers.{i}.linear_attn."
    B, T, _ = x.shape
    nk, nv, dk, dv = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, \
        cfg.linear_value_head_dim
    q, k, v, z, b, a = gdn_projections(P, cfg, i, x)
    mixed = torch.cat([q.reshape(B, T, nk * dk), k.reshape(B, T, nk * dk), v.reshape(B, T, nv * dv)], dim=-1)
    mixed = causal_conv_silu(mixed, P[p + "conv1d.weight"], doc_pos)
    q = mixed[..., :nk * dk].reshape(B, T, nk, dk)
    k = mixed[..., nk * dk:2 * nk * dk].reshape(B, T, nk, dk)
    v = mixed[..., 2 * nk * dk:].reshape(B, T, nv, dv)
    beta, g = gdn_gates(b, a, P[p + "A_log"], P[p + "dt_bias"])
    r = nv // nk
    q = l2_norm(q.repeat_interleave(r, dim=2))
    k = l2_norm(k.repeat_interleave(r, dim=2))
    o = gated_delta_rule(q, k, v, g, beta, doc_pos)
    o = gated_rms_norm(o, z, P[p + "norm.weight"], cfg.rms_norm_eps)
    return o.reshape(B, T, nv * dv) @ P[p + "out_proj.weight"].t()


def kda_block(P, cfg, i, x, doc_pos):
    """Kimi Delta Attention mixer of layer i on the normed input x [B, T, H] (the module docstring)."""
    p = f"model.layers.{i}.linear_attn."
    B, T, _ = x.shape
    nh, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    lin = lambda name, inp: inp @ P[p + name + ".weight"].t()  # noqa: E731
    q = causal_conv_silu(lin("q_proj", x), P[p + "q_conv1d.weight"], doc_pos).reshape(B, T, nh, dk)
    k = causal_conv_silu(lin("k_proj", x), P[p + "k_conv1d.weight"], doc_pos).reshape(B, T, nh, dk)
    v = causal_conv_silu(lin("v_proj", x), P[p + "v_conv1d.weight"], doc_pos).reshape(B, T, nh, dv)
    f = lin("f_b_proj", lin("f_a_proj", x)).reshape(B, T, nh, dk)
    g = -torch.exp(P[p + "A_log"]).reshape(nh, 1) * F.softplus(f + P[p + "dt_bias"].reshape(nh, dk))
    beta = torch.sigmoid(lin("b_proj", x))
    o = gated_delta_rule(l2_norm(q), l2_norm(k), v, g, beta, doc_pos)
    gate = lin("g_b_proj", lin("g_a_proj", x)).reshape(B, T, nh, dv)
    o = P[p + "o_norm.weight"] * (o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)) \
        * torch.sigmoid(gate)
    return o.reshape(B, T, nh * dv) @ P[p + "o_proj.weight"].t()


def attention_projections(P, cfg, i, x):
    """The attention input projections of layer i: q, gate [B, T, nh, hd]; k, v [B, T, nkv, hd]."""
    p = f"model.layers.{i}.self_attn."
    B, T, _ = x.shape
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    qg = (x @ P[p + "q_proj.weight"].t()).view(B, T, nh, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:]
    k = (x @ P[p + "k_proj.weight"].t()).view(B, T, nkv, hd)
    v = (x @ P[p + "v_proj.weight"].t()).view(B, T, nkv, hd)
    return q, gate, k, v


def attention_block(P, cfg, i, x, pos, doc_pos):
    """Gated softmax-attention mixer of layer i on the normed input x [B, T, H]."""
    p = f"model.layers.{i}.self_attn."
    B, T, _ = x.shape
    q, gate, k, v = attention_projections(P, cfg, i, x)
    q = rms_norm(q, P[p + "q_norm.weight"], cfg.rms_norm_eps)
    k = rms_norm(k, P[p + "k_norm.weight"], cfg.rms_norm_eps)
    q = rope(q, pos, cfg.rotary_dim, cfg.rope_theta)
    k = rope(k, pos, cfg.rotary_dim, cfg.rope_theta)
    o = attention(q, k, v, pos, doc_pos) * torch.sigmoid(gate)
    return o.reshape(B, T, -1) @ P[p + "o_proj.weight"].t()


def mlp_block(P, i, x):
    p = f"model.layers.{i}.mlp."
    return (F.silu(x @ P[p + "gate_proj.weight"].t()) * (x @ P[p + "up_proj.weight"].t())) \
        @ P[p + "down_proj.weight"].t()


# ---------------------------------------------------------------- model

def check_batch(cfg, tokens, targets, pos, doc_pos):
    """Raises ValueError unless the batch follows the backend.h conventions."""
    if not (tokens.shape == targets.shape == pos.shape == doc_pos.shape and tokens.dim() == 2):
        raise ValueError("tokens, targets, pos, doc_pos must all be [B, T]")
    if tokens.min() < 0 or tokens.max() >= cfg.vocab_size:
        raise ValueError("token out of range")
    if targets.min() < -1 or targets.max() >= cfg.vocab_size:
        raise ValueError("target out of range (-1 or a token id)")
    if (doc_pos < 0).any():
        raise ValueError("doc_pos < 0")
    if (pos[:, 1:] <= pos[:, :-1]).any():
        raise ValueError("pos must increase along the sample")
    step = doc_pos[:, 1:]
    if ((step != 0) & ((step != doc_pos[:, :-1] + 1) | (pos[:, 1:] != pos[:, :-1] + 1))).any():
        raise ValueError("inside a document, doc_pos and pos must go up by 1 per token")


def forward(P, cfg, tokens, pos, doc_pos, mixers=None):
    """Logits [B, T, V] for HF-named parameters P (a dict of tensors, one dtype). mixers (optional): layer index ->
    callable(h, doc_pos) giving that layer's mixer output [B, T, H] in place of this file's (kda_check.py plugs
    transformers' KimiDeltaAttention in there)."""
    x = P["model.embed_tokens.weight"][tokens.long()]
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        h = rms_norm(x, P[pre + "input_layernorm.weight"], cfg.rms_norm_eps)
        if mixers and i in mixers:
            x = x + mixers[i](h, doc_pos)
        elif cfg.layer_type(i) == LINEAR and cfg.linear_attention == "kda":
            x = x + kda_block(P, cfg, i, h, doc_pos)
        elif cfg.layer_type(i) == LINEAR:
            x = x + gdn_block(P, cfg, i, h, doc_pos)
        else:
            x = x + attention_block(P, cfg, i, h, pos, doc_pos)
        h = rms_norm(x, P[pre + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        x = x + mlp_block(P, i, h)
    x = rms_norm(x, P["model.norm.weight"], cfg.rms_norm_eps)
    head = P["model.embed_tokens.weight"] if cfg.tie_word_embeddings else P["lm_head.weight"]
    return x @ head.t()


def token_losses(logits, targets):
    """Per-token cross-entropy [B, T]; 0 where target < 0."""
    valid = targets >= 0
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, targets.clamp(min=0).long().unsqueeze(-1)).squeeze(-1)
    return torch.where(valid, lse - picked, torch.zeros_like(lse))


def loss_fn(P, cfg, tokens, targets, pos, doc_pos, check=True, mixers=None):
    """Mean cross-entropy over every token of the batch with target >= 0."""
    if check:
        check_batch(cfg, tokens, targets, pos, doc_pos)
    n = int((targets >= 0).sum())
    if n == 0:
        raise ValueError("no token has a target")
    return token_losses(forward(P, cfg, tokens, pos, doc_pos, mixers), targets).sum() / n


def loss_and_grads(P, cfg, tokens, targets, pos, doc_pos, dtype=torch.float64):
    """Runs forward and backward in `dtype`; returns (loss as float, dict name -> gradient)."""
    leaves = {k: v.detach().to(dtype).clone().requires_grad_(True) for k, v in P.items()}
    loss = loss_fn(leaves, cfg, tokens, targets, pos, doc_pos)
    loss.backward()
    return float(loss), {k: v.grad for k, v in leaves.items()}


def next_to_qwen3_5(P, cfg):
    """A Qwen3-Next state dict (in_proj_qkvz / in_proj_ba grouped by key head) as Qwen3.5's (four plain
    projections); the other tensors as they are. Works on numpy arrays or tensors."""
    nk, nv, dk, dv = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, \
        cfg.linear_value_head_dim
    r = nv // nk
    out = {}
    for name, w in P.items():
        if name.endswith("in_proj_qkvz.weight"):
            g = w.reshape(nk, 2 * dk + 2 * r * dv, -1)
            base = name[:-len("in_proj_qkvz.weight")]
            parts = [g[:, :dk], g[:, dk:2 * dk], g[:, 2 * dk:2 * dk + r * dv]]
            cat = torch.cat if isinstance(w, torch.Tensor) else __import__("numpy").concatenate
            out[base + "in_proj_qkv.weight"] = cat([x.reshape(-1, w.shape[1]) for x in parts])
            out[base + "in_proj_z.weight"] = g[:, 2 * dk + r * dv:].reshape(-1, w.shape[1])
        elif name.endswith("in_proj_ba.weight"):
            g = w.reshape(nk, 2 * r, -1)
            base = name[:-len("in_proj_ba.weight")]
            out[base + "in_proj_b.weight"] = g[:, :r].reshape(-1, w.shape[1])
            out[base + "in_proj_a.weight"] = g[:, r:].reshape(-1, w.shape[1])
        else:
            out[name] = w
    return out


def random_params(cfg, seed=0, dtype=torch.float64, std=0.05, fmt="qwen3_next"):
    """Random, non-trivial HF-named parameters for tests (not the init of docs/design/model.md): every norm
    weight, A_log and dt_bias random, so every gradient path is exercised. fmt as hf_shapes'."""
    gen = torch.Generator().manual_seed(seed)
    P = {}
    for name, shape in hf_shapes(cfg, fmt).items():
        if name.endswith(("linear_attn.norm.weight", "linear_attn.o_norm.weight")):
            t = 1.0 + 0.3 * (2 * torch.rand(shape, generator=gen, dtype=torch.float64) - 1)
        elif name.endswith("norm.weight"):  # zero-centred norms, q_norm, k_norm
            t = 0.3 * (2 * torch.rand(shape, generator=gen, dtype=torch.float64) - 1)
        elif name.endswith("A_log"):
            t = -1.5 + 2.0 * torch.rand(shape, generator=gen, dtype=torch.float64)
        elif name.endswith("dt_bias"):
            t = -1.0 + 2.0 * torch.rand(shape, generator=gen, dtype=torch.float64)
        elif name.endswith("conv1d.weight"):
            t = 0.3 * torch.randn(shape, generator=gen, dtype=torch.float64)
        elif name == "model.embed_tokens.weight":
            t = 0.5 * torch.randn(shape, generator=gen, dtype=torch.float64)
        else:
            t = std * torch.randn(shape, generator=gen, dtype=torch.float64)
        P[name] = t.to(dtype)
    return P


def param_count(cfg):
    return sum(math.prod(s) for s in hf_shapes(cfg).values())
