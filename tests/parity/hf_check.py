"""hf_check.py — the export against Hugging Face transformers: transformers loads `ringscan export`'s
folder as Qwen3NextForCausalLM, and its loss AND every parameter gradient on fixed batches equal
ringscan's (build/parity_step --hf: the same folder read by ringscan's import, gradients written back
under the Hugging Face names by the export's row maps).

    /usr/bin/python3 tests/parity/hf_check.py RUN_DIR DATA WORK [--impl transformers|ref] [--scale S]...
                     [--format qwen3_next|qwen3_5] [--break none|swap-v-heads|deinterleave|swap-z-qkv|rope-dims]
                     [--batch B] [--seq-len T] [--loss-tol X] [--grad-tol Y]

RUN_DIR   a trained ringscan run (e.g. configs/tiny-cpu.yaml); it is exported to WORK/hf (fp32)
DATA      a flat token file (held-out data); the batches are its first samples, read as ringscan
          reads them (data_read_sample: targets the next token of the same document, else -1)
--scale   the GDN and attention output projections (linear_attn.out_proj, self_attn.o_proj) are
          multiplied by S in the folder both sides load (default: 1 and 30). After a short training
          run the mixers add about 1% to the residual stream, so a wrong GDN layout moves the loss by
          ~1e-5 only; at 30x it moves it visibly.
--format  the folder exported and compared: qwen3_next (Qwen3NextForCausalLM, default) or qwen3_5
          (Qwen3_5ForCausalLM: in_proj_qkv / in_proj_z / in_proj_b / in_proj_a)
--break   a deliberately wrong layout in the folder transformers loads (ringscan loads the right
          one): value heads 0 and 1 swapped (in_proj_qkvz, or in_proj_qkv's value block), in_proj_qkvz
          de-interleaved ([q | k | v | z] blocks; qwen3_next), the rows of value head 0 exchanged between
          in_proj_qkv and in_proj_z (swap-z-qkv; qwen3_5), or config.json's partial_rotary_factor doubled
          (rope-dims: the wrong rotary dims). The check must then FAIL: the device suite runs them.
--impl    transformers (default; needs torch >= 2 and transformers 5.x) or ref: tests/parity/
          ref_model.py (float64), which reads the same HF names and layouts (a CI-able stand-in)

Two batches per scale, B samples of T tokens each:
  single  every row one sequence (doc_pos = pos, targets = the next token, the last one -1):
          transformers' own loss (labels=input_ids, its shifted mean) against ringscan's
  packed  the data's document packing: transformers does not reset its state at a document start
          inside a row, so each document (a run of tokens of equal pos - doc_pos) is its own
          sequence (position_ids = ringscan's pos, so RoPE angles are the same), its per-token
          cross-entropy summed and back-propagated; loss and gradients are divided by the batch's
          token count, as ringscan's step does.
Bounds: loss |a - b| / |b| <= 1e-4; each gradient tensor ||a - b|| / ||b|| <= max(1e-3, 2 x transformers'
own error on that tensor), its own error measured against ref_model.py in float64 on the same folder
(transformers runs the delta rule in fp32 whatever the weights' dtype, and the per-head A_log / dt_bias
gradients, sums of many cancelling terms, carry ~1e-3 of it; on the GPU machine ringscan differed from
transformers by 1.3e-3 to 2.1e-3 there and by < 1e-3 everywhere else). Exit 0 when every comparison
passes, 1 otherwise.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
import safetensors_io as st  # noqa: E402

FLAT_MAGIC = b"RSTOKENS"


def read_flat(path):
    """tokens (int64 array) and doc_start offsets of a flat token file (docs/data-format.md)."""
    raw = Path(path).read_bytes()
    if raw[:8] != FLAT_MAGIC:
        raise SystemExit(f"hf_check: {path} is not a flat token file")
    tb = int(np.frombuffer(raw, "<u4", 1, 12)[0])
    n_tokens, n_docs = (int(x) for x in np.frombuffer(raw, "<u8", 2, 24))
    starts = np.frombuffer(raw, "<u8", n_docs + 1, 64).astype(np.int64)
    off = 64 + 8 * (n_docs + 1)
    toks = np.frombuffer(raw, "<u2" if tb == 2 else "<u4", n_tokens, off).astype(np.int64)
    return toks, starts


def make_batches(data, B, T):
    """(name, tokens, targets, pos, doc_pos) int32 [B, T]: the packed samples 0..B-1, and the same
    tokens as single sequences."""
    toks, starts = read_flat(data)
    if len(toks) < B * T + 1:
        raise SystemExit(f"hf_check: {data} has {len(toks)} tokens; need {B * T + 1}")
    doc = np.searchsorted(starts, np.arange(len(toks)), side="right") - 1
    tokens = toks[:B * T].reshape(B, T)
    same_next = (doc[1:B * T + 1] == doc[:B * T]).reshape(B, T)
    targets = np.where(same_next, toks[1:B * T + 1].reshape(B, T), -1)
    pos = np.tile(np.arange(T), (B, 1))
    doc_pos = np.zeros((B, T), np.int64)
    for b in range(B):
        for t in range(1, T):
            doc_pos[b, t] = doc_pos[b, t - 1] + 1 if doc[b * T + t] == doc[b * T + t - 1] else 0
    single_t = np.concatenate([tokens[:, 1:], np.full((B, 1), -1)], axis=1)
    i32 = lambda *a: [x.astype(np.int32) for x in a]  # noqa: E731
    return [("single", *i32(tokens, single_t, pos, pos)), ("packed", *i32(tokens, targets, pos, doc_pos))]


def text_of(out):
    """a subprocess output that may be bytes (TimeoutExpired keeps bytes even with text=True), str or None"""
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


def sh(args, **kw):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"hf_check: {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r.stdout


def write_folder(dst, src, tensors, rope_dims=False):
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    if rope_dims:  # the wrong rotary dims: twice the partial rotary factor
        cfg = json.loads((src / "config.json").read_text())
        rp = cfg.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": cfg.get("rope_theta", 10000.0)})
        f = 2 * (rp.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or 0.25)
        rp["partial_rotary_factor"] = f
        if "partial_rotary_factor" in cfg:
            cfg["partial_rotary_factor"] = f
        (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    st.save(dst / "model.safetensors", tensors, {"format": "pt"})


def load_folder(folder):
    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update(st.load(f))
    return out


def broken(tensors, cfg, how):
    """A copy of the state dict with a wrong GDN input layout."""
    nk, nv, dk, dv = (cfg[k] for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                       "linear_value_head_dim"))
    r, out = nv // nk, dict(tensors)
    w = 2 * dk + 2 * r * dv
    if how == "rope-dims":
        return out
    for name, a in tensors.items():
        if name.endswith("in_proj_qkv.weight"):  # Qwen3.5: [q | k | v] plain
            a, v0 = a.copy(), 2 * nk * dk
            if how == "swap-v-heads":
                a[[*range(v0, v0 + dv), *range(v0 + dv, v0 + 2 * dv)]] = \
                    a[[*range(v0 + dv, v0 + 2 * dv), *range(v0, v0 + dv)]]
            elif how == "swap-z-qkv":
                zname = name.replace("in_proj_qkv", "in_proj_z")
                z = tensors[zname].copy()
                a[v0:v0 + dv], z[:dv] = tensors[zname][:dv], tensors[name][v0:v0 + dv]
                out[zname] = z
            out[name] = a
            continue
        if not name.endswith("in_proj_qkvz.weight"):
            continue
        a = a.copy()
        if how == "swap-v-heads":
            h0, h1 = ((g // r) * w + 2 * dk + (g % r) * dv for g in (0, 1))
            a[[*range(h0, h0 + dv), *range(h1, h1 + dv)]] = a[[*range(h1, h1 + dv), *range(h0, h0 + dv)]]
        else:  # de-interleaved: all q, all k, all v, all z
            g = a.reshape(nk, w, -1)
            a = np.concatenate([g[:, :dk].reshape(-1, a.shape[1]), g[:, dk:2 * dk].reshape(-1, a.shape[1]),
                                g[:, 2 * dk:2 * dk + r * dv].reshape(-1, a.shape[1]),
                                g[:, 2 * dk + r * dv:].reshape(-1, a.shape[1])])
        out[name] = a
    return out


# ---------------------------------------------------------------- the Hugging Face side

class TransformersModel:
    def __init__(self, folder, device="cpu"):
        import torch
        import transformers
        self.torch, self.device = torch, device
        if device != "cpu":  # fp32 on the GPU means fp32: no TF32 in matmuls or convolutions
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        q35 = json.loads((Path(folder) / "config.json").read_text())["model_type"].startswith("qwen3_5")
        cls = transformers.Qwen3_5ForCausalLM if q35 else transformers.Qwen3NextForCausalLM
        prefix = "Qwen3_5" if q35 else "Qwen3Next"
        kw = {"attn_implementation": "eager", "output_loading_info": True}
        try:
            model, info = cls.from_pretrained(folder, dtype=torch.float32, **kw)
        except TypeError:
            model, info = cls.from_pretrained(folder, torch_dtype=torch.float32, **kw)
        bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        if bad:
            raise SystemExit(f"hf_check: transformers loaded {folder} with {bad}")
        for i, layer in enumerate(model.model.layers):
            if type(layer.mlp).__name__ != prefix + "MLP":
                raise SystemExit(f"hf_check: layer {i} has {type(layer.mlp).__name__}: not dense")
            la = getattr(layer, "linear_attn", None)
            if la is not None and type(la.norm).__name__ != prefix + "RMSNormGated":
                raise SystemExit("hf_check: transformers picked fla's kernels; run without fla on PYTHONPATH (the "
                                 "check uses transformers' torch path on CPU)")
        self.model = model.float().to(device).train()
        self.version = transformers.__version__
        self.params = dict(model.named_parameters())

    def logits(self, ids, pos):
        t = self.torch
        out = self.model(input_ids=t.from_numpy(ids).long()[None].to(self.device),
                         position_ids=t.from_numpy(pos).long()[None].to(self.device))
        return out.logits[0].float()

    def mean_loss(self, tokens):
        """transformers' own loss: labels = input_ids, shifted inside, mean over B x (T-1)."""
        t = self.torch.from_numpy(tokens).long().to(self.device)
        return self.model(input_ids=t, labels=t).loss


class RefModel:
    """tests/parity/ref_model.py on the same HF state dict (float64)."""

    def __init__(self, folder, device="cpu"):
        import torch
        import ref_model
        if device != "cpu":
            raise SystemExit("hf_check: ref_model.py runs on the cpu only")
        self.torch, self.ref, self.device = torch, ref_model, device
        cfg = json.loads((Path(folder) / "config.json").read_text())
        self.cfg = ref_model.ModelConfig.from_mapping(cfg)
        self.params = {k: torch.from_numpy(v).double().requires_grad_(True) for k, v in load_folder(folder).items()}
        self.version = "ref_model (float64)"

    def logits(self, ids, pos):
        t = self.torch
        ids_, pos_ = t.from_numpy(ids).long()[None], t.from_numpy(pos).long()[None]
        return self.ref.forward(self.params, self.cfg, ids_, pos_, pos_ - pos_[:, :1])[0]

    def mean_loss(self, tokens):
        t = self.torch
        B, T = tokens.shape
        targets = t.from_numpy(np.concatenate([tokens[:, 1:], np.full((B, 1), -1)], 1)).long()
        pos = t.arange(T).repeat(B, 1)
        return self.ref.loss_fn(self.params, self.cfg, t.from_numpy(tokens).long(), targets, pos, pos)


def hf_loss_and_grads(m, name, tokens, targets, pos, doc_pos):
    """Loss and gradients (name -> numpy) of the batch as ringscan defines it, on the HF side."""
    torch = m.torch
    for p in m.params.values():
        p.grad = None
    n = int((targets >= 0).sum())
    if name == "single":
        loss = m.mean_loss(tokens)
        loss.backward()
        total = float(loss)
        scale = 1.0
    else:
        total = 0.0
        for b in range(tokens.shape[0]):
            start = pos[b] - doc_pos[b]
            cuts = [0] + [t for t in range(1, len(start)) if start[t] != start[t - 1]] + [len(start)]
            for s, e in zip(cuts[:-1], cuts[1:]):
                tg = torch.from_numpy(targets[b, s:e]).long().to(m.device)
                keep = tg >= 0
                if not keep.any():
                    continue
                lg = m.logits(tokens[b, s:e], pos[b, s:e])
                ce = torch.nn.functional.cross_entropy(lg[keep], tg[keep], reduction="sum")
                ce.backward()
                total += float(ce)
        total /= n
        scale = 1.0 / n
    return total, {k: p.grad.detach().double().cpu().numpy() * scale for k, p in m.params.items() if p.grad is not None}


# ---------------------------------------------------------------- the check

def rel(a, b):
    nb = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / (nb if nb > 0 else 1.0)


def check_one(args, label, rs_folder, hf_folder, batch, impl):
    name, tokens, targets, pos, doc_pos = batch
    case = args.work / f"case-{label}-{name}"
    case.mkdir(parents=True, exist_ok=True)
    B, T = tokens.shape
    text = sh([args.ringscan, "config", "show", args.run / "config.resolved.yaml", "--set", f"data.micro_batch={B}",
               "--set", f"data.seq_len={T}", "--set", "parallel.dp=1", "--set", "parallel.cp=1",
               "--set", f"data.path={args.data}", "--set", "device.kind=cpu"])
    (case / "config.yaml").write_text(text)
    st.save(case / "batch.safetensors", {"tokens": tokens, "targets": targets, "pos": pos, "doc_pos": doc_pos})
    sh([args.parity_step, case, "--hf", rs_folder, "--out", case / "grads_hf.safetensors"])
    got = st.load(case / "grads_hf.safetensors")
    rs_loss = float(got.pop("loss").reshape(()))
    hf = impl(hf_folder)
    hf_loss, hf_grads = hf_loss_and_grads(hf, name, tokens, targets, pos, doc_pos)
    if set(hf_grads) != set(got):
        raise SystemExit(f"hf_check: tensor names differ: {sorted(set(hf_grads) ^ set(got))[:6]}")
    # transformers runs the delta rule in fp32 whatever the weights' dtype (torch_chunk_gated_delta_rule casts),
    # and the per-head A_log / dt_bias gradients are sums of many cancelling terms: its own error there is
    # ~1e-3. Each tensor's bound is max(--grad-tol, 2 x transformers' error against ref_model in float64 on
    # the same folder): the same model whatever its layout, so a wrong layout is not absorbed.
    allow = {k: args.grad_tol for k in got}
    if impl is TransformersModel:
        _, exact = hf_loss_and_grads(RefModel(hf_folder), name, tokens, targets, pos, doc_pos)
        allow = {k: max(args.grad_tol, 2 * rel(hf_grads[k], exact[k])) for k in got}
    rows = sorted(((rel(got[k], hf_grads[k]) / allow[k], rel(got[k], hf_grads[k]), k) for k in got), reverse=True)
    loss_err = abs(rs_loss - hf_loss) / abs(hf_loss)
    ok = loss_err <= args.loss_tol and rows[0][0] <= 1.0
    print(f"{label:>10} {name:>6}: loss ringscan {rs_loss:.8f} {hf.version} {hf_loss:.8f} rel {loss_err:.2e} "
          f"(bound {args.loss_tol:g}); worst gradient {rows[0][2]} rel {rows[0][1]:.2e} (bound {allow[rows[0][2]]:.2e}), "
          f"median {sorted(r[1] for r in rows)[len(rows) // 2]:.2e} over {len(rows)} tensors: {'ok' if ok else 'FAIL'}")
    for f, e, k in rows[:args.top]:
        print(f"{'':>19}{e:.2e}  {k} (bound {allow[k]:.2e})")
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("data", type=Path)
    ap.add_argument("work", type=Path)
    ap.add_argument("--impl", choices=["transformers", "ref"], default="transformers")
    ap.add_argument("--scale", type=float, action="append")
    ap.add_argument("--format", choices=["qwen3_next", "qwen3_5"], default="qwen3_next")
    ap.add_argument("--break", dest="brk", choices=["none", "swap-v-heads", "deinterleave", "swap-z-qkv", "rope-dims"],
                    default="none")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--loss-tol", type=float, default=1e-4)
    ap.add_argument("--grad-tol", type=float, default=1e-3)
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--ringscan", type=Path, default=ROOT / "build/ringscan")
    ap.add_argument("--parity-step", type=Path, default=ROOT / "build/parity_step")
    args = ap.parse_args(argv)
    if (args.brk == "deinterleave" and args.format != "qwen3_next") or \
            (args.brk == "swap-z-qkv" and args.format != "qwen3_5"):
        ap.error(f"--break {args.brk} is a break of the other format")
    args.run, args.data, args.work = args.run.resolve(), args.data.resolve(), args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    impl = TransformersModel if args.impl == "transformers" else RefModel
    base = args.work / "hf"
    if base.exists():
        shutil.rmtree(base)
    print(sh([args.ringscan, "export", args.run, base, "--format", args.format]).strip().splitlines()[-1])
    cfg = json.loads((base / "config.json").read_text())
    tensors = load_folder(base)
    ok = True
    for s in args.scale or [1.0, 30.0]:
        scaled = {k: (v * np.float32(s) if k.endswith(("linear_attn.out_proj.weight", "self_attn.o_proj.weight"))
                      else v) for k, v in tensors.items()}
        label = f"x{s:g}" + ("" if args.brk == "none" else f"/{args.brk}")
        rs_folder = args.work / f"hf-x{s:g}"
        write_folder(rs_folder, base, scaled)
        hf_folder = rs_folder
        if args.brk != "none":
            hf_folder = args.work / f"hf-x{s:g}-{args.brk}"
            write_folder(hf_folder, base, broken(scaled, cfg, args.brk), rope_dims=args.brk == "rope-dims")
        for batch in make_batches(args.data, args.batch, args.seq_len):
            ok &= check_one(args, label, rs_folder, hf_folder, batch, impl)
    print(f"hf_check: {'PASS' if ok else 'FAIL'} ({args.impl}, {args.format}"
          f"{', wrong layout ' + args.brk if args.brk != 'none' else ''})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
