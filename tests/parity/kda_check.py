"""kda_check.py — ringscan's Kimi Delta Attention layers against transformers' own (issue 39's layer parity; run on
the GPU machine, where transformers 5.x with kimi_linear is installed):

    env -u PYTHONPATH python3 tests/parity/kda_check.py WORK [--impl transformers|ref] [--shape small|kimi]
                          [--batch B] [--seq-len T] [--seed S] [--hf-device cpu|cuda]
                          [--ringscan build/ringscan] [--parity-step build/parity_step]

transformers' KDA module (kimi_linear's KimiDeltaAttention; transformers' current class KimiLinearDeltaAttention)
is built from a KimiLinearConfig at the shape, with random weights; the same weights go into a ringscan KDA
folder (kimi_linear's checkpoint names under linear_attn., docs/design/kda.md), around which the rest of a small
ringscan hybrid (embedding, norms, gated softmax attention, dense MLP) is random too. The module's parameter names
are mapped onto those names by shape-checked aliases (f_a_proj / forget_gate.f_a_proj (transformers 5.17's forget
gate submodule) / forget_gate_down, b_proj / beta_proj, g_a_proj / output_gate_down, three convs or one packed
conv1d, A_log and dt_bias of any shape with the right size), so each naming runs; a parameter that maps to nothing
is a FAIL naming it. transformers 5.17's KimiLinearConfig takes the dims as linear_num_heads / linear_head_dim.

--impl ref (CI, no transformers): a stand-in module with kimi_linear's names computing with tests/parity/
ref_model.py replaces transformers' everywhere; --impl ref-transformers-names the same with an earlier transformers'
names and shapes (one packed conv1d, forget_gate_*, beta_proj, output_gate_*, A_log [nv, 1], dt_bias [nv, dk]).
They prove this script's plumbing and its name map, not transformers' conventions.

Checks, one PASS / FAIL / SKIP line each, then `kda_check: PASS` (exit 0) or `kda_check: FAIL` (exit 1):
  module   the class, its source file, the parameter map; o_norm's gate activation: kimi_linear's o_norm is
           FusedRMSNormGated(activation="sigmoid"); a transformers whose module says otherwise is set to sigmoid and
           said so (the FLA layer and the released checkpoints' code use sigmoid)
  layer    one KDA layer alone on random inputs, one document per row and several (each document its own call of
           the module: transformers' torch path ignores cu_seqlens): transformers' output against ref_model.py's
           float64 KDA on the same weights, within 1e-4 relative (fp32 chunked against float64); this pins the
           reference to transformers' semantics independently of the C code
  grads    build/parity_step --hf (the cpu oracle, fp32) on the folder against the torch model (ref_model's embedding,
           norms, attention and MLP in fp32 around transformers' KDA modules, documents split per call): the loss
           within 1e-4 and every gradient, the KDA tensors' taken from the modules, within max(1e-3, 2 x the torch
           model's own error against ref_model in float64), for a batch of one document per row ("single") and the
           data's document packing ("packed")
  broken   the same with two heads of each layer's dt_bias swapped on the transformers side (ringscan reads the
           right folder): the comparison must FAIL

--shape small: hidden 256, 4 layers (3 KDA : 1 attention), KDA 2 heads of 64, attention 4 / 2 heads of 64, vocab
512. --shape kimi: Kimi Linear's KDA head width (128), 4 heads, hidden 512, 2 layers (1 KDA : 1 attention).
--hf-device cuda runs transformers' module on the GPU (fp32; with FLA installed, transformers may then take FLA's
kernels: that is then also a check against them).
"""
import argparse
import inspect
import json
import os
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
import hf_check  # noqa: E402
import safetensors_io as st  # noqa: E402
from relerr import rel  # noqa: E402

SHAPES = {
    "small": dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                  full_attention_interval=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=64, linear_value_head_dim=64,
                  linear_conv_kernel_dim=4, tie_word_embeddings=False),
    "kimi": dict(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                 full_attention_interval=2, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                 linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=128, linear_value_head_dim=128,
                 linear_conv_kernel_dim=4, tie_word_embeddings=False),
}
ROPE_THETA, PARTIAL, EPS = 10000.0, 0.25, 1e-6
RESULTS = []

# our name (suffix after linear_attn.) -> names a KDA module may give the same tensor
ALIASES = {
    "q_proj.weight": ["q_proj.weight"],
    "k_proj.weight": ["k_proj.weight"],
    "v_proj.weight": ["v_proj.weight"],
    "q_conv1d.weight": ["q_conv1d.weight", "q_conv.weight", "q_conv1d.conv.weight"],
    "k_conv1d.weight": ["k_conv1d.weight", "k_conv.weight", "k_conv1d.conv.weight"],
    "v_conv1d.weight": ["v_conv1d.weight", "v_conv.weight", "v_conv1d.conv.weight"],
    "f_a_proj.weight": ["f_a_proj.weight", "forget_gate.f_a_proj.weight", "forget_gate_down.weight",
                        "f_proj.0.weight"],
    "f_b_proj.weight": ["f_b_proj.weight", "forget_gate.f_b_proj.weight", "forget_gate_up.weight",
                        "f_proj.1.weight"],
    "b_proj.weight": ["b_proj.weight", "beta_proj.weight"],
    "g_a_proj.weight": ["g_a_proj.weight", "output_gate_down.weight", "g_proj.0.weight"],
    "g_b_proj.weight": ["g_b_proj.weight", "output_gate_up.weight", "g_proj.1.weight"],
    "A_log": ["A_log", "forget_gate.A_log"],
    "dt_bias": ["dt_bias", "forget_gate.dt_bias"],
    "o_norm.weight": ["o_norm.weight"],
    "o_proj.weight": ["o_proj.weight"],
}
PACKED_CONV = ["conv1d.weight"]  # one conv over [q | k | v] (transformers' KimiLinearDeltaAttention)


def say(check, ok, detail=""):
    word = "PASS" if ok is True else "SKIP" if ok is None else "FAIL"
    RESULTS.append(ok)
    print(f"{word}  {check}{': ' + detail if detail else ''}", flush=True)
    return ok


def guarded(check, fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except SystemExit as e:
        say(check, False, str(e))
    except Exception as e:  # noqa: BLE001 — every failure is reported, the other checks go on
        traceback.print_exc()
        say(check, False, f"{type(e).__name__}: {e}")
    return None


def doc_cuts(doc_pos_row):
    """[(start, end)] of the documents of one row (a start wherever doc_pos == 0, and the row's start)."""
    starts = [0] + [t for t in range(1, len(doc_pos_row)) if int(doc_pos_row[t]) == 0]
    return list(zip(starts, starts[1:] + [len(doc_pos_row)]))


# ---------------------------------------------------------------- the KDA modules

# transformers' current KimiLinearDeltaAttention names for kimi_linear's (--impl ref-transformers-names)
TRANSFORMERS_NAMES = {"f_a_proj.weight": "forget_gate_down.weight", "f_b_proj.weight": "forget_gate_up.weight",
                      "b_proj.weight": "beta_proj.weight", "g_a_proj.weight": "output_gate_down.weight",
                      "g_b_proj.weight": "output_gate_up.weight"}


def ref_module_class(naming):
    """--impl ref*: a module computing with ref_model.kda_block, its parameters in kimi_linear's checkpoint names
    (naming "kimi") or in transformers' current ones ("transformers": one packed conv1d [Cc, 1, Kc], A_log [nv, 1],
    dt_bias [nv, dk], forget_gate_* / beta_proj / output_gate_*), so that the alias map is exercised without
    transformers."""
    import torch
    import ref_model

    class RefKimiDeltaAttention(torch.nn.Module):
        def __init__(self, shape):
            super().__init__()
            s = SHAPES[shape]
            self.cfg = ref_model.ModelConfig.from_mapping(dict(s, linear_attention="kda", num_hidden_layers=1,
                                                               layer_types=["linear_attention"], rms_norm_eps=EPS))
            pre = "model.layers.0.linear_attn."
            self.shapes = {k[len(pre):]: v for k, v in ref_model.hf_shapes(self.cfg).items() if k.startswith(pre)}
            shapes = dict(self.shapes)
            if naming == "transformers":
                nv, dk, Kc = s["linear_num_value_heads"], s["linear_key_head_dim"], s["linear_conv_kernel_dim"]
                cc = sum(shapes.pop(n)[0] for n in ("q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"))
                shapes = {TRANSFORMERS_NAMES.get(n, n): v for n, v in shapes.items()}
                shapes.update({"conv1d.weight": (cc, 1, Kc), "A_log": (nv, 1), "dt_bias": (nv, dk)})
            self.p = torch.nn.ParameterDict({n.replace(".", "__"): torch.nn.Parameter(torch.zeros(v))
                                             for n, v in shapes.items()})

        def named_parameters(self, *a, **kw):  # the names above, dotted
            for k, v in self.p.items():
                yield k.replace("__", "."), v

        def forward(self, hidden_states, **kw):
            mine = dict(self.named_parameters())
            if naming == "transformers":
                back = {v: k for k, v in TRANSFORMERS_NAMES.items()}
                conv = mine.pop("conv1d.weight")
                at = 0
                for n in ("q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"):
                    mine[n] = conv[at:at + self.shapes[n][0]]
                    at += self.shapes[n][0]
                mine = {back.get(n, n): v.reshape(self.shapes[back.get(n, n)]) for n, v in mine.items()}
            P = {"model.layers.0.linear_attn." + k: v for k, v in mine.items()}
            B, T, _ = hidden_states.shape
            doc_pos = torch.arange(T).repeat(B, 1)
            return ref_model.kda_block(P, self.cfg, 0, hidden_states.to(P[next(iter(P))].dtype), doc_pos), None

    return RefKimiDeltaAttention


def transformers_module(shape):
    """transformers' KDA class and a module built at the shape (fp32), and notes on what was found."""
    import torch
    from transformers.models.kimi_linear import modeling_kimi_linear as mk
    try:
        from transformers.models.kimi_linear import configuration_kimi_linear as ck
        Cfg = ck.KimiLinearConfig
    except ImportError:
        Cfg = mk.KimiLinearConfig
    cls = next((getattr(mk, n) for n in ("KimiDeltaAttention", "KimiLinearDeltaAttention") if hasattr(mk, n)), None)
    if cls is None:
        raise SystemExit(f"no KimiDeltaAttention / KimiLinearDeltaAttention in {mk.__file__}")
    s = SHAPES[shape]
    n, d, Kc = s["linear_num_value_heads"], s["linear_value_head_dim"], s["linear_conv_kernel_dim"]
    try:  # transformers 5.17: flat linear_num_heads / linear_head_dim, the forget gate a submodule (forget_gate.*)
        cfg = Cfg(hidden_size=s["hidden_size"], linear_num_heads=n, linear_head_dim=d, linear_conv_kernel_dim=Kc,
                  num_hidden_layers=1, layer_types=["linear_attention"], mlp_layer_types=["dense"],
                  rms_norm_eps=EPS, hidden_act="silu")
    except Exception:  # noqa: BLE001 — another version's keys: its defaults, then the attributes below
        cfg = None
    try:
        cfg = cfg or Cfg()
    except Exception:  # noqa: BLE001 — a config class that wants arguments
        cfg = Cfg(linear_attn_config={"kda_layers": [1], "full_attn_layers": [], "num_heads": n, "head_dim": d,
                                      "short_conv_kernel_size": Kc})
    # every naming of the dims the versions use: the config dict of the released checkpoints, and the flat keys
    attrs = dict(hidden_size=s["hidden_size"], rms_norm_eps=EPS, num_hidden_layers=1, layer_types=["linear_attention"],
                 linear_attn_config={"kda_layers": [1], "full_attn_layers": [], "num_heads": n, "head_dim": d,
                                     "short_conv_kernel_size": Kc},
                 linear_num_key_heads=n, linear_num_value_heads=n, linear_key_head_dim=d, linear_value_head_dim=d,
                 linear_attn_key_heads=n, linear_attn_value_heads=n, linear_attn_key_head_dim=d,
                 linear_attn_value_head_dim=d, linear_conv_kernel_dim=Kc, forget_gate_lower_bound=None,
                 linear_num_heads=n, linear_head_dim=d, hidden_act="silu",
                 use_full_rank_output_gate=False, mlp_layer_types=["dense"], first_k_dense_replace=1)
    for k, v in attrs.items():
        try:
            setattr(cfg, k, v)
        except Exception:  # noqa: BLE001 — a read-only property: the others define the shape
            pass
    try:
        cfg._attn_implementation = "eager"
    except Exception:  # noqa: BLE001
        pass
    mod = cls(cfg, 0)
    notes = [f"{cls.__name__} from {inspect.getsourcefile(cls)}"]
    if not hasattr(mod, "activation"):  # some versions read self.activation for the convs without setting it
        mod.activation = "silu"
        notes.append("module.activation was unset; set to silu (the convs' activation)")
    act = getattr(getattr(mod, "o_norm", None), "activation", None)
    if act is not None and act != "sigmoid":
        mod.o_norm.activation = "sigmoid"
        notes.append(f"o_norm.activation was {act!r}; set to 'sigmoid' (kimi_linear's FusedRMSNormGated("
                     f"activation='sigmoid'), FLA's KDA layer)")
    return mod.float(), notes


class KdaLayer:
    """One KDA module holding layer `i`'s tensors (our names <-> the module's), callable as a ref_model mixer."""

    def __init__(self, mod, P, i, cfg, device):
        import torch
        self.torch, self.mod, self.i, self.cfg, self.device = torch, mod.to(device), i, cfg, device
        self.prefix = f"model.layers.{i}.linear_attn."
        params = dict(mod.named_parameters())
        self.map, used = {}, set()  # our suffix -> (module name, slice or None)
        nk, dk = cfg.linear_num_key_heads, cfg.linear_key_head_dim
        Kd, Vd = nk * dk, cfg.linear_num_value_heads * cfg.linear_value_head_dim
        for ours, names in ALIASES.items():
            hit = next((n for n in names if n in params), None)
            if hit is None and ours.endswith("conv1d.weight"):
                hit = next((n for n in PACKED_CONV if n in params), None)
                if hit is not None:
                    a = {"q": 0, "k": Kd, "v": 2 * Kd}[ours[0]]
                    self.map[ours] = (hit, slice(a, a + (Vd if ours[0] == "v" else Kd)))
                    used.add(hit)
                    continue
            if hit is None:
                raise SystemExit(f"layer {i}: the module has no tensor for {ours} (its parameters: {sorted(params)})")
            want = int(np.prod(P[self.prefix + ours].shape))
            if params[hit].numel() != want:
                raise SystemExit(f"layer {i}: {hit} has {params[hit].numel()} elements, {ours} {want}")
            self.map[ours] = (hit, None)
            used.add(hit)
        self.zeroed = []
        for n, p in params.items():
            if n in used:
                continue
            if n.endswith(".bias"):  # e.g. FLA's g_proj bias: kimi_linear has none
                with torch.no_grad():
                    p.zero_()
                p.requires_grad_(False)
                self.zeroed.append(n)
            else:
                raise SystemExit(f"layer {i}: the module's parameter {n} maps to no kimi_linear tensor")
        self.load(P)

    def load(self, P):
        torch = self.torch
        params = dict(self.mod.named_parameters())
        with torch.no_grad():
            for ours, (name, sl) in self.map.items():
                src = torch.as_tensor(np.asarray(P[self.prefix + ours], np.float32))
                dst = params[name]
                if sl is None:
                    dst.copy_(src.reshape(dst.shape))
                else:
                    dst[sl].copy_(src.reshape(dst[sl].shape))

    def grads(self):
        """our full name -> gradient (numpy float64, our shape)"""
        params = dict(self.mod.named_parameters())
        shapes = {}
        import ref_model
        for k, v in ref_model.hf_shapes(self.cfg).items():
            shapes[k] = v
        out = {}
        for ours, (name, sl) in self.map.items():
            g = params[name].grad
            g = self.torch.zeros_like(params[name]) if g is None else g
            g = g if sl is None else g[sl]
            out[self.prefix + ours] = g.detach().double().cpu().numpy().reshape(shapes[self.prefix + ours])
        return out

    def zero_grad(self):
        for p in self.mod.parameters():
            p.grad = None

    def __call__(self, h, doc_pos):
        """The module on each document of each row on its own (transformers' torch path ignores cu_seqlens; a
        document starting before the row starts from nothing there as in ringscan)."""
        torch = self.torch
        rows = []
        for b in range(h.shape[0]):
            parts = []
            for s, e in doc_cuts(doc_pos[b].tolist()):
                x = h[b:b + 1, s:e].to(self.device, torch.float32)
                o = self.mod(hidden_states=x)
                o = o[0] if isinstance(o, (tuple, list)) else o
                parts.append(o.to(h.device, h.dtype)[0])
            rows.append(torch.cat(parts, 0))
        return torch.stack(rows, 0)


# ---------------------------------------------------------------- the folder and the case

def folder_config(s):
    """config.json of a ringscan KDA folder (what `ringscan export` writes for this model)."""
    L = s["num_hidden_layers"]
    types = ["full_attention" if (i + 1) % s["full_attention_interval"] == 0 else "linear_attention" for i in range(L)]
    return {"architectures": ["RingscanKdaHybridForCausalLM"], "model_type": "ringscan_kda_hybrid", **s,
            "hidden_act": "silu", "rms_norm_eps": EPS, "rope_theta": ROPE_THETA, "partial_rotary_factor": PARTIAL,
            "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA, "partial_rotary_factor": PARTIAL},
            "attention_bias": False, "linear_attention": "kda", "layer_types": types, "mlp_only_layers": list(range(L)),
            "num_experts": 0, "dtype": "float32"}


def write_folder(work, shape, seed):
    import torch
    import ref_model
    s = SHAPES[shape]
    c = folder_config(s)
    cfg = ref_model.ModelConfig.from_mapping(c)
    P = {k: v.float().numpy() for k, v in ref_model.random_params(cfg, seed, dtype=torch.float64).items()}
    for k in P:  # mixers that move the residual stream visibly (a wrong layer would show in the loss)
        if k.endswith(("o_proj.weight", "out_proj.weight")):
            P[k] = (P[k] * 4).astype(np.float32)
    d = work / "folder"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(c, indent=2))
    st.save(d / "model.safetensors", P, {"format": "pt"})
    return d, cfg, P


def case_dir(args, batch):
    s = SHAPES[args.shape]
    name, tokens, targets, pos, doc_pos = batch
    B, T = tokens.shape
    d = args.work / f"case-{name}"
    d.mkdir(parents=True, exist_ok=True)
    sets = [f"model.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in s.items()]
    sets += [f"model.rope_theta={ROPE_THETA}", f"model.partial_rotary_factor={PARTIAL}", f"model.rms_norm_eps={EPS}",
             "model.linear_attention=kda", f"data.micro_batch={B}", f"data.seq_len={T}", "parallel.dp=1",
             "parallel.cp=1", f"data.path={args.data}", "device.kind=cpu"]
    cmd = [args.ringscan, "config", "show", ROOT / "configs/tiny-cpu.yaml"]
    for x in sets:
        cmd += ["--set", x]
    (d / "config.yaml").write_text(hf_check.sh(cmd))
    st.save(d / "batch.safetensors", {"tokens": tokens, "targets": targets, "pos": pos, "doc_pos": doc_pos})
    return d


def ringscan_grads(args, case, folder):
    out = case / "grads.safetensors"
    r = subprocess.run([str(args.parity_step), str(case), "--hf", str(folder), "--out", str(out)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(f"parity_step failed ({r.returncode}): {(r.stdout + r.stderr).strip()[-1500:]}")
    got = st.load(out)
    return float(got.pop("loss").reshape(())), got


# ---------------------------------------------------------------- the checks

def build_layers(args, cfg, P):
    """One module per KDA layer, loaded with the folder's tensors; notes of the first."""
    layers, notes = {}, []
    for i in range(cfg.num_hidden_layers):
        if cfg.layer_type(i) != "linear_attention":
            continue
        if args.impl.startswith("ref"):
            naming = "transformers" if args.impl == "ref-transformers-names" else "kimi"
            mod, n = ref_module_class(naming)(args.shape).float(), [f"ref_model stand-in ({naming} names)"]
        else:
            mod, n = transformers_module(args.shape)
        layers[i] = KdaLayer(mod, P, i, cfg, args.hf_device)
        notes = notes or n
    return layers, notes


def check_module(args, cfg, P):
    layers, notes = build_layers(args, cfg, P)
    first = layers[min(layers)]
    m = ", ".join(f"{ours}<-{name}{'[' + str(sl.start) + ':' + str(sl.stop) + ']' if sl else ''}"
                  for ours, (name, sl) in first.map.items())
    say("module", True, "; ".join(notes) + f"; map {m}" + (f"; zeroed {first.zeroed}" if first.zeroed else ""))
    return layers


def check_layer(args, cfg, P, layers):
    """transformers' module against ref_model's float64 KDA on one layer, random inputs, one and several documents."""
    import torch
    import ref_model
    i = min(layers)
    P64 = {k: torch.from_numpy(np.asarray(v, np.float64)) for k, v in P.items()}
    g = torch.Generator().manual_seed(args.seed + 1)
    B, T, H = 2, args.seq_len, cfg.hidden_size
    x = torch.randn(B, T, H, generator=g, dtype=torch.float64)
    for name, cuts in (("one document", None), ("documents", [0, 1, 40, 41, 64, 65, 100, 170])):
        doc_pos = torch.arange(T).repeat(B, 1)
        if cuts:
            for b in range(B):
                for c0 in cuts:
                    c = min(T - 1, c0 + 7 * b)
                    doc_pos[b, c:] = torch.arange(T - c)
        with torch.no_grad():
            want = ref_model.kda_block(P64, cfg, i, x, doc_pos)
            got = layers[i](x.float(), doc_pos).double()
        e = rel(got.numpy(), want.numpy())
        say(f"layer {i} alone, {name}: {args.impl}'s output vs ref_model float64", e <= 1e-4,
            f"rel {e:.2e} (bound 1e-4)")


def torch_loss_and_grads(cfg, P, layers, batch, dtype):
    """The batch's loss and every gradient (our HF names) of ref_model around the KDA modules (layers; None:
    ref_model's own KDA), in dtype."""
    import torch
    import ref_model
    _, tokens, targets, pos, doc_pos = batch
    leaves = {k: torch.from_numpy(np.asarray(v)).to(dtype).requires_grad_(True) for k, v in P.items()
              if not (layers and any(k.startswith(f"model.layers.{i}.linear_attn.") for i in layers))}
    for lay in (layers or {}).values():
        lay.zero_grad()
    t = lambda a: torch.from_numpy(a).long()  # noqa: E731
    loss = ref_model.loss_fn(leaves, cfg, t(tokens), t(targets), t(pos), t(doc_pos), mixers=layers or None)
    loss.backward()
    grads = {k: v.grad.detach().double().numpy() for k, v in leaves.items()}
    for lay in (layers or {}).values():
        grads.update(lay.grads())
    return float(loss), grads


def compare(label, rs_loss, rs, loss, grads, allow, expect_fail=False):
    if set(rs) != set(grads):
        return say(label, expect_fail, f"tensor names differ: {sorted(set(rs) ^ set(grads))[:6]}")
    rows = sorted(((rel(rs[k], grads[k]) / allow[k], rel(rs[k], grads[k]), k) for k in rs), reverse=True)
    le = abs(rs_loss - loss) / abs(loss)
    ok = le <= 1e-4 and rows[0][0] <= 1.0
    kda = max((r for r in rows if ".linear_attn." in r[2]), default=(0, 0, "-"))
    detail = (f"loss ringscan {rs_loss:.8f} torch {loss:.8f} rel {le:.2e} (bound 1e-4); worst gradient {rows[0][2]} "
              f"rel {rows[0][1]:.2e} (bound {allow[rows[0][2]]:.2e}); worst KDA tensor {kda[2]} {kda[1]:.2e}; "
              f"{len(rows)} tensors")
    if expect_fail:
        return say(label + " (must fail)", not ok, detail)
    return say(label, ok, detail)


def check_grads(args, cfg, P, folder, layers, batches):
    for batch in batches:
        case = case_dir(args, batch)
        rs_loss, rs = ringscan_grads(args, case, folder)
        loss, grads = torch_loss_and_grads(cfg, P, layers, batch, __import__("torch").float32)
        _, exact = torch_loss_and_grads(cfg, P, None, batch, __import__("torch").float64)
        allow = {k: max(1e-3, 2 * rel(grads[k], exact[k])) for k in grads}
        compare(f"grads {batch[0]} (cpu oracle vs {args.impl})", rs_loss, rs, loss, grads, allow)
        if batch[0] == "packed":
            broken = dict(P)
            for i in layers:  # two heads of dt_bias swapped on the torch side only
                k = f"model.layers.{i}.linear_attn.dt_bias"
                dt = np.asarray(P[k]).reshape(cfg.linear_num_value_heads, -1).copy()
                broken[k] = dt[[1, 0, *range(2, dt.shape[0])]].reshape(-1)
                layers[i].load(broken)
            bl, bg = torch_loss_and_grads(cfg, broken, layers, batch, __import__("torch").float32)
            for i in layers:
                layers[i].load(P)
            compare("broken dt_bias heads swapped (packed)", rs_loss, rs, bl, bg, allow, expect_fail=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work", type=Path)
    ap.add_argument("--impl", choices=["transformers", "ref", "ref-transformers-names"], default="transformers")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hf-device", default="cpu")
    ap.add_argument("--ringscan", type=Path, default=ROOT / "build/ringscan")
    ap.add_argument("--parity-step", type=Path, default=ROOT / "build/parity_step")
    args = ap.parse_args(argv)
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    try:
        import torch
        torch.manual_seed(args.seed)
        version = "none: ref_model.py stands in"
        if args.impl == "transformers":
            import transformers
            from transformers.models.kimi_linear import modeling_kimi_linear  # noqa: F401
            version = transformers.__version__
    except Exception as e:  # noqa: BLE001
        say("transformers with kimi_linear", False, f"{type(e).__name__}: {e}")
        print("kda_check: FAIL")
        return 1
    print(f"kda_check: torch {torch.__version__}, transformers {version}, shape {args.shape}, batch {args.batch} x "
          f"{args.seq_len}, module on {args.hf_device}", flush=True)
    args.data = args.work / "recall.tok"
    if not args.data.exists():
        hf_check.sh([args.ringscan, "data", "synth", args.data, "--seed", "1"])
    batches = hf_check.make_batches(args.data, args.batch, args.seq_len)
    made = guarded("folder", write_folder, args.work, args.shape, args.seed)
    if made:
        folder, cfg, P = made
        layers = guarded("module", check_module, args, cfg, P)
        if layers:
            guarded("layer", check_layer, args, cfg, P, layers)
            guarded("grads", check_grads, args, cfg, P, folder, layers, batches)
    ok = bool(RESULTS) and all(r is not False for r in RESULTS)
    n_fail = sum(r is False for r in RESULTS)
    print(f"kda_check: {'PASS' if ok else 'FAIL'} ({len(RESULTS)} checks, {n_fail} failed, "
          f"{sum(r is None for r in RESULTS)} skipped)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
