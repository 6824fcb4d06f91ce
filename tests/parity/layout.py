"""layout.py — conversion between the Hugging Face state dict of the model
(names and shapes of docs/design/model.md) and ringscan's internal
parameter tensors (lib/model/model_params.h, built by model_params_build in
lib/model/model_params.c), in both directions.

Every conversion is a concatenation and row permutation (plus a reshape of
conv1d), so the same functions map gradients too: the gradient of an internal
tensor is the internal-layout image of the HF gradient.

Internal tensors (names without ".weight"), in model_params_build's order:
  model.embed_tokens [V, H]
  per layer i, prefix model.layers.{i}.:
    input_layernorm [H]
    GDN:        linear_attn.in_proj [2Kd + 2Vd + 2nv, H] rows [q | k | v | z | b | a], heads in
                global order; linear_attn.conv1d [Cc, Kc]; linear_attn.dt_bias [nv];
                linear_attn.A_log [nv]; linear_attn.norm [dv]; linear_attn.out_proj [H, Vd]
    KDA:        linear_attn.in_proj [Cc + 2dv + nv, H] rows [q | k | v | f_a | g_a | b] (HF q_proj, k_proj,
                v_proj, f_a_proj, g_a_proj, b_proj); linear_attn.conv1d [Cc, Kc] (q_conv1d, k_conv1d,
                v_conv1d); linear_attn.f_b_proj [nv dk, dv]; linear_attn.g_b_proj [Vd, dv];
                linear_attn.dt_bias [nv dk]; linear_attn.A_log [nv]; linear_attn.o_norm [dv];
                linear_attn.o_proj [H, Vd]
    attention:  self_attn.in_proj [2 nh hd + 2 nkv hd, H] rows [q | gate | k | v];
                self_attn.q_norm [hd]; self_attn.k_norm [hd]; self_attn.o_proj [H, nh hd]
    post_attention_layernorm [H]; mlp.gate_up [2I, H] rows [gate | up]; mlp.down_proj [H, I]
  model.norm [H]; lm_head [V, H] (absent when tied)

Used by make_case.py (weights out, gradients out) and tests/test_reference.py.
Tensors are torch tensors (numpy arrays are accepted and converted).
"""
import torch

from ref_model import LINEAR

# weight-decay groups of lib/model/model_params.h (ParamGroup), named as `plan --json` names them
MATRIX, EMBEDDING, NORM, GDN_GATE, CONV = "matrix", "embedding", "norm", "gdn_gate", "conv"
NORM_SCALE = "norm_scale"  # plain-scale norms (linear_attn.norm): not decayed unless train.decay_norm_scales


def internal_specs(cfg):
    """Ordered dict name -> (shape, group), exactly as model_params_build lays them out."""
    H, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    nk, nv, dk, dv = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, \
        cfg.linear_value_head_dim
    Kd, Vd = nk * dk, nv * dv
    Cc = 2 * Kd + Vd
    qd, kvd = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    s = {"model.embed_tokens": ((V, H), EMBEDDING)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        s[p + "input_layernorm"] = ((H,), NORM)
        if cfg.layer_type(i) == LINEAR and cfg.linear_attention == "kda":
            s[p + "linear_attn.in_proj"] = ((Cc + 2 * dv + nv, H), MATRIX)
            s[p + "linear_attn.conv1d"] = ((Cc, cfg.linear_conv_kernel_dim), CONV)
            s[p + "linear_attn.f_b_proj"] = ((nv * dk, dv), MATRIX)
            s[p + "linear_attn.g_b_proj"] = ((Vd, dv), MATRIX)
            s[p + "linear_attn.dt_bias"] = ((nv * dk,), GDN_GATE)
            s[p + "linear_attn.A_log"] = ((nv,), GDN_GATE)
            s[p + "linear_attn.o_norm"] = ((dv,), NORM_SCALE)
            s[p + "linear_attn.o_proj"] = ((H, Vd), MATRIX)
        elif cfg.layer_type(i) == LINEAR:
            s[p + "linear_attn.in_proj"] = ((Cc + Vd + 2 * nv, H), MATRIX)
            s[p + "linear_attn.conv1d"] = ((Cc, cfg.linear_conv_kernel_dim), CONV)
            s[p + "linear_attn.dt_bias"] = ((nv,), GDN_GATE)
            s[p + "linear_attn.A_log"] = ((nv,), GDN_GATE)
            s[p + "linear_attn.norm"] = ((dv,), NORM_SCALE)
            s[p + "linear_attn.out_proj"] = ((H, Vd), MATRIX)
        else:
            s[p + "self_attn.in_proj"] = ((2 * qd + 2 * kvd, H), MATRIX)
            s[p + "self_attn.q_norm"] = ((cfg.head_dim,), NORM)
            s[p + "self_attn.k_norm"] = ((cfg.head_dim,), NORM)
            s[p + "self_attn.o_proj"] = ((H, qd), MATRIX)
        s[p + "post_attention_layernorm"] = ((H,), NORM)
        s[p + "mlp.gate_up"] = ((2 * I, H), MATRIX)
        s[p + "mlp.down_proj"] = ((H, I), MATRIX)
    s["model.norm"] = ((H,), NORM)
    if not cfg.tie_word_embeddings:
        s["lm_head"] = ((V, H), EMBEDDING)
    return s


def internal_shapes(cfg):
    return {k: shape for k, (shape, _) in internal_specs(cfg).items()}


def gdn_in_proj_rows(cfg):
    """src[i] = the row of cat(in_proj_qkvz, in_proj_ba) that internal in_proj row i holds.
    HF qkvz (docs/design/model.md): nk groups of width w = 2dk + 2r dv; group g = [q_g | k_g | v of heads
    g*r..g*r+r-1 | z of the same heads]. HF ba: nk groups of 2r = [b of those r heads | a]."""
    nk, nv, dk, dv = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, \
        cfg.linear_value_head_dim
    r = nv // nk
    w = 2 * dk + 2 * r * dv
    n_qkvz = nk * w
    q = [h * w + e for h in range(nk) for e in range(dk)]
    k = [h * w + dk + e for h in range(nk) for e in range(dk)]
    v = [(h // r) * w + 2 * dk + (h % r) * dv + e for h in range(nv) for e in range(dv)]
    z = [(h // r) * w + 2 * dk + r * dv + (h % r) * dv + e for h in range(nv) for e in range(dv)]
    b = [n_qkvz + (h // r) * 2 * r + (h % r) for h in range(nv)]
    a = [n_qkvz + (h // r) * 2 * r + r + (h % r) for h in range(nv)]
    return torch.tensor(q + k + v + z + b + a, dtype=torch.long), n_qkvz


def attn_in_proj_rows(cfg):
    """src[i] = the row of cat(q_proj, k_proj, v_proj) that internal in_proj row i holds.
    HF q_proj (docs/design/model.md): per head h, rows [h*2hd, h*2hd+hd) are q and the next hd are the gate."""
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    nq = 2 * nh * hd
    q = [h * 2 * hd + e for h in range(nh) for e in range(hd)]
    gate = [h * 2 * hd + hd + e for h in range(nh) for e in range(hd)]
    kv = list(range(nq, nq + 2 * nkv * hd))  # k_proj rows, then v_proj rows, unchanged
    return torch.tensor(q + gate + kv, dtype=torch.long), nq


def _t(x):
    return torch.from_numpy(x) if not isinstance(x, torch.Tensor) else x


def _scatter_rows(x, src):
    """The inverse of x[src]: out[src[i]] = x[i]."""
    out = x.new_empty(x.shape)
    out[src] = x
    return out


KDA_IN_PROJ = ("q_proj", "k_proj", "v_proj", "f_a_proj", "g_a_proj", "b_proj")  # internal in_proj's row blocks
KDA_CONV = ("q_conv1d", "k_conv1d", "v_conv1d")                                 # internal conv1d's


def kda_row_blocks(cfg):
    """HF tensor suffix -> (internal tensor suffix, first row, rows) of a KDA layer's row blocks."""
    nk, nv, dk, dv = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, \
        cfg.linear_value_head_dim
    out, at = {}, 0
    for part, n in zip(KDA_IN_PROJ, (nk * dk, nk * dk, nv * dv, dv, dv, nv)):
        out[part] = ("in_proj", at, n)
        at += n
    at = 0
    for part, n in zip(KDA_CONV, (nk * dk, nk * dk, nv * dv)):
        out[part] = ("conv1d", at, n)
        at += n
    return out


def hf_to_internal(hf, cfg):
    """HF state dict (or its gradients) -> internal tensors (dict in model_params_build order)."""
    hf = {k: _t(v) for k, v in hf.items()}
    want = set(internal_specs(cfg))
    out = {}
    gdn_src, _ = gdn_in_proj_rows(cfg)
    attn_src, _ = attn_in_proj_rows(cfg)
    kda = cfg.linear_attention == "kda"
    for name in internal_specs(cfg):
        if kda and name.endswith(("linear_attn.in_proj", "linear_attn.conv1d")):  # row blocks of the HF tensors
            p = name[:-len("in_proj" if name.endswith("in_proj") else "conv1d")]
            parts = KDA_IN_PROJ if name.endswith("in_proj") else KDA_CONV
            out[name] = torch.cat([hf[p + part + ".weight"].reshape(hf[p + part + ".weight"].shape[0], -1)
                                   for part in parts])
        elif name in ("model.embed_tokens", "model.norm", "lm_head") or name.endswith("layernorm") \
                or name.endswith(("q_norm", "k_norm", "linear_attn.norm", "out_proj", "o_proj", "down_proj",
                                  "f_b_proj", "g_b_proj", "o_norm")):
            out[name] = hf[name + ".weight"]
        elif name.endswith(("dt_bias", "A_log")):
            out[name] = hf[name]
        elif name.endswith("linear_attn.conv1d"):
            w = hf[name + ".weight"]
            out[name] = w.reshape(w.shape[0], w.shape[2])
        elif name.endswith("linear_attn.in_proj"):
            p = name[:-len("in_proj")]
            out[name] = torch.cat([hf[p + "in_proj_qkvz.weight"], hf[p + "in_proj_ba.weight"]])[gdn_src]
        elif name.endswith("self_attn.in_proj"):
            p = name[:-len("in_proj")]
            out[name] = torch.cat([hf[p + "q_proj.weight"], hf[p + "k_proj.weight"], hf[p + "v_proj.weight"]])[attn_src]
        elif name.endswith("mlp.gate_up"):
            p = name[:-len("gate_up")]
            out[name] = torch.cat([hf[p + "gate_proj.weight"], hf[p + "up_proj.weight"]])
        else:
            raise AssertionError(f"no HF source for {name}")
    assert set(out) == want
    return out


def internal_to_hf(internal, cfg):
    """Internal tensors (or their gradients) -> HF state dict (in hf_shapes order)."""
    from ref_model import hf_shapes
    x = {k: _t(v) for k, v in internal.items()}
    gdn_src, n_qkvz = gdn_in_proj_rows(cfg)
    attn_src, nq = attn_in_proj_rows(cfg)
    nkvd = cfg.num_key_value_heads * cfg.head_dim
    I = cfg.intermediate_size
    out = {}
    blocks = kda_row_blocks(cfg) if cfg.linear_attention == "kda" else {}
    for name in hf_shapes(cfg):
        base = name[:-len(".weight")] if name.endswith(".weight") else name
        leaf = base.rsplit(".", 1)[-1]
        if ".linear_attn." in name and leaf in blocks:
            target, at, n = blocks[leaf]
            t = x[base[:-len(leaf)] + target][at:at + n]
            out[name] = t.reshape(n, 1, t.shape[1]) if target == "conv1d" else t
        elif base in x:
            t = x[base]
            out[name] = t.reshape(t.shape[0], 1, t.shape[1]) if base.endswith("linear_attn.conv1d") else t
        elif name.endswith("in_proj_qkvz.weight"):
            stacked = _scatter_rows(x[name[:-len("in_proj_qkvz.weight")] + "in_proj"], gdn_src)
            out[name] = stacked[:n_qkvz]
        elif name.endswith("in_proj_ba.weight"):
            stacked = _scatter_rows(x[name[:-len("in_proj_ba.weight")] + "in_proj"], gdn_src)
            out[name] = stacked[n_qkvz:]
        elif name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            p = name[:-len("q_proj.weight")]
            stacked = _scatter_rows(x[p + "in_proj"], attn_src)
            out[name] = {"q": stacked[:nq], "k": stacked[nq:nq + nkvd], "v": stacked[nq + nkvd:]}[name[len(p)]]
        elif name.endswith(("gate_proj.weight", "up_proj.weight")):
            p = name[:name.rindex("mlp.") + len("mlp.")]
            gu = x[p + "gate_up"]
            out[name] = gu[:I] if name.endswith("gate_proj.weight") else gu[I:]
        else:
            raise AssertionError(f"no internal source for {name}")
    return out
