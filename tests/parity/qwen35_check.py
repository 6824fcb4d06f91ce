"""qwen35_check.py — ringscan's Qwen3.5 import and export against transformers' own Qwen3_5ForCausalLM
(issue 36's proof; run on the GPU machine, where transformers >= 5 with qwen3_5 is installed):

    env -u PYTHONPATH python3 tests/parity/qwen35_check.py WORK [--shape small|0.8b] [--devices cpu,cuda]
                          [--impl transformers|ref] [--batch B] [--seq-len T] [--ringscan build/ringscan]
                          [--parity-step build/parity_step] [--hf-device cpu|cuda] [--threads N]

--impl ref (CI, no transformers): the folders are written by safetensors_io from ref_model.random_params
(the same names, shapes and config.json keys as transformers' save), and tests/parity/ref_model.py
(float64) stands in for transformers everywhere; the mrope check is skipped. It proves this script's
plumbing, not transformers' conventions.

Checks, one PASS / FAIL / SKIP line each, then `qwen35_check: PASS` (exit 0) or `qwen35_check: FAIL` (exit 1):
  mrope      Qwen3_5TextRotaryEmbedding with the three position ids equal (text) gives plain 1-D RoPE over
             the first rotary dims, rotate-half pairing (cos/sin of cat(freqs, freqs), inv_freq =
             theta^(-2i/rd)): what ringscan computes; and with unequal ids it does not (the check is live).
  save       transformers builds Qwen3_5ForCausalLM at the shape with random non-trivial weights (every norm,
             A_log, dt_bias random) and saves it: fp32 (sharded, with an index) and bf16; and, when
             transformers can build it, the composite Qwen3_5ForConditionalGeneration with the same language
             model (model.language_model.*) and a small vision tower.
  grads      build/parity_step --hf on each folder, on each device, against transformers' autograd on the
             same folder (fp32, torch path on CPU), a single-sequence and a document-packed batch: cpu (fp32
             oracle): loss within 1e-4, each gradient within max(1e-3, 2 x transformers' own error against
             ref_model.py in float64) — tests/parity/hf_check.py's bounds; cuda (bf16 activations): loss within
             1e-2, each gradient within max(1e-2, 2 x the cpu bf16 emulation's error) — model_check's bounds
             (tests/cuda/compare_bf16.py).
  composite  the composite folder gives the text folder's loss and gradients bitwise (cpu), and its vision
             tower is said to be left aside.
  export     ringscan export --format qwen3_5 of the fp32 and composite folders (fp32) and of the bf16 folder
             (bf16): the same tensors bitwise; transformers loads the export with nothing missing or
             unexpected and its logits equal the source's.
  broken     deliberately wrong layouts in the folder transformers loads (ringscan loads the right one): the
             rows of value head 0 exchanged between in_proj_qkv and in_proj_z, value heads 0 and 1 swapped,
             the rotary dims doubled (partial_rotary_factor): each comparison must FAIL.

--shape small: hidden 256, 4 layers (3 GDN : 1 attention), attention 4 heads / 2 kv of 256 with partial
rotary 0.25 (64 rotary dims) and rope_theta 1e7, GDN 2 key / 4 value heads of 128, vocab 512 (Qwen3.5's
head dims at a small width). --shape 0.8b: the published Qwen3.5-0.8B shape (vocab 248,320, hidden
1,024, 24 layers, 8 / 2 heads of 256, GDN 16 / 16 heads of 128, intermediate 3,584, tied embeddings): the
float64 reference is slow there, so --seq-len 128 --checks grads --folders text-fp32 (the loss and every
gradient on cpu and cuda; the other checks and folders are the small shape's).
--checks / --folders: the checks after mrope and save, and the folders the grads check runs on.
"""
import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
import hf_check  # noqa: E402
import safetensors_io as st  # noqa: E402

SHAPES = {
    "small": dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=256, linear_num_key_heads=2,
                  linear_num_value_heads=4, linear_key_head_dim=128, linear_value_head_dim=128,
                  linear_conv_kernel_dim=4, tie_word_embeddings=False),
    "0.8b": dict(vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                 linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
                 linear_conv_kernel_dim=4, tie_word_embeddings=True),
}
ROPE_THETA, PARTIAL = 1e7, 0.25
RESULTS = []


def say(check, ok, detail=""):
    word = "PASS" if ok is True else "SKIP" if ok is None else "FAIL"
    RESULTS.append(ok)
    print(f"{word}  {check}{': ' + detail if detail else ''}", flush=True)
    return ok


def guarded(check, fn, *a, **kw):
    """Runs one check; an exception is that check's FAIL (with its traceback), not the end of the script."""
    try:
        return fn(*a, **kw)
    except SystemExit as e:
        say(check, False, str(e))
    except Exception as e:  # noqa: BLE001 — every failure is reported, the other checks go on
        traceback.print_exc()
        say(check, False, f"{type(e).__name__}: {e}")
    return None


# ---------------------------------------------------------------- transformers' side

def text_config(shape):
    from transformers import Qwen3_5TextConfig
    s = SHAPES[shape]
    L = s["num_hidden_layers"]
    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(L)]
    return Qwen3_5TextConfig(**s, layer_types=types, rms_norm_eps=1e-6, max_position_embeddings=32768,
                             rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA,
                                              "partial_rotary_factor": PARTIAL, "mrope_section": [11, 11, 10],
                                              "mrope_interleaved": True})


def randomize(model, seed):
    """Random, non-trivial weights (ref_model.random_params' distributions) by parameter name; a tied embedding
    as an lm head (0.05), so that the loss stays near ln(vocab) and bf16's error in the gradients stays small."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            u = lambda lo, hi: lo + (hi - lo) * torch.rand(p.shape, generator=g)  # noqa: E731
            if name.endswith("linear_attn.norm.weight"):
                t = u(0.7, 1.3)
            elif name.endswith("norm.weight"):
                t = u(-0.3, 0.3)
            elif name.endswith("A_log"):
                t = u(-1.5, 0.5)
            elif name.endswith("dt_bias"):
                t = u(-1.0, 1.0)
            elif name.endswith("conv1d.weight"):
                t = 0.3 * torch.randn(p.shape, generator=g)
            elif name.endswith("embed_tokens.weight"):  # tied: it is the lm head too, and logits of std 16
                std = 0.05 if model.config.tie_word_embeddings else 0.5  # (0.5 x sqrt(1024)) saturate the softmax
                t = std * torch.randn(p.shape, generator=g)
            elif name.endswith(("out_proj.weight", "o_proj.weight")):
                t = 0.2 * torch.randn(p.shape, generator=g)  # mixers that move the residual stream visibly
            else:
                t = 0.05 * torch.randn(p.shape, generator=g)
            p.copy_(t.to(p.dtype))


def check_mrope(shape):
    """Qwen3.5's interleaved multimodal RoPE on text (three equal position ids) is plain 1-D RoPE."""
    import torch
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m
    cfg = text_config(shape)
    rot = m.Qwen3_5TextRotaryEmbedding(cfg)
    T = 300
    pos = torch.arange(T)[None]
    x = torch.zeros(1, T, 8, dtype=torch.float32)
    cos, sin = rot(x, pos[None].expand(3, 1, T))
    rd = int(cfg.head_dim * PARTIAL)
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd))
    f = pos[0, :, None].double() * inv[None]
    want_cos, want_sin = torch.cat([f, f], -1).cos(), torch.cat([f, f], -1).sin()
    # float32 angles of up to T radians carry ~T x 6e-8 of rounding; a wrong pairing or rotary width is O(1)
    err = max(float((cos[0].double() - want_cos).abs().max()), float((sin[0].double() - want_sin).abs().max()))
    ok = cos.shape[-1] == rd and err <= 1e-4
    say("mrope == 1-D rope on text", ok, f"rotary dims {cos.shape[-1]} (want {rd}), max |diff| against float64 "
        f"1-D RoPE {err:.2e} (bound 1e-4)")
    # the same rotation of a head as ringscan's (rotate-half inside the first rd dims, the rest passed)
    q = torch.randn(1, 2, T, cfg.head_dim)
    qe, _ = m.apply_rotary_pos_emb(q, q, cos, sin)
    half = rd // 2
    r1, r2 = q[..., :half], q[..., half:rd]
    c, s_ = cos[0, None, None, :, :half], sin[0, None, None, :, :half]
    mine = torch.cat([r1 * c - r2 * s_, r2 * c + r1 * s_, q[..., rd:]], -1)
    e2 = float((qe - mine).abs().max())
    say("rope pairing (rotate-half over the first rotary dims)", e2 <= 1e-5, f"max |diff| {e2:.2e}")
    other = torch.stack([pos, pos + 7, pos + 13])  # unequal ids: the sections must matter
    c2, _ = rot(x, other)
    live = float((c2 - cos).abs().max())
    say("mrope sections live with unequal ids (the check above can fail)", live > 1e-3, f"max |diff| {live:.2e}")


def save_folders_ref(work, shape, seed):
    """--impl ref: the three folders written without transformers (config.json as transformers saves it)."""
    import ref_model
    s = SHAPES[shape]
    L = s["num_hidden_layers"]
    text = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", **s, "hidden_act": "silu",
            "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(L)],
            "rms_norm_eps": 1e-6, "attention_bias": False, "dtype": "float32",
            "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA, "partial_rotary_factor": PARTIAL,
                                "mrope_section": [11, 11, 10], "mrope_interleaved": True}}
    P = {k: v.float().numpy() for k, v in ref_model.random_params(ref_model.ModelConfig.from_mapping(text), seed,
                                                                  fmt="qwen3_5").items()}
    f32, b16, comp = work / "text-fp32", work / "text-bf16", work / "composite"
    for d in (f32, b16, comp):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    names, wmap = list(P), {}
    for i in range(3):
        part = names[i * len(names) // 3:(i + 1) * len(names) // 3]
        f = f"model-{i + 1:05d}-of-00003.safetensors"
        st.save(f32 / f, {k: P[k] for k in part}, {"format": "pt"})
        wmap.update({k: f for k in part})
    (f32 / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    (f32 / "config.json").write_text(json.dumps(text, indent=2))
    st.save(b16 / "model.safetensors", P, {"format": "pt"}, bf16=True)
    (b16 / "config.json").write_text(json.dumps(dict(text, dtype="bfloat16"), indent=2))
    tc = dict(text)
    tc.pop("architectures")
    (comp / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5ForConditionalGeneration"],
                                                  "model_type": "qwen3_5", "text_config": tc, "vision_config": {},
                                                  "tie_word_embeddings": s["tie_word_embeddings"]}, indent=2))
    ct = {("model.language_model." + k[6:] if k.startswith("model.") else k): v for k, v in P.items()}
    ct["model.visual.blocks.0.attn.qkv.weight"] = np.ones((48, 16), np.float32)
    st.save(comp / "model.safetensors", ct, {"format": "pt"})
    say("save fp32 (sharded), bf16 and composite folders (ref_model weights)", True, f"{len(P)} tensors")
    return None, f32, b16, comp


def save_folders(work, shape, seed, need=("text-bf16", "composite")):
    """The fp32 text folder, and the bf16 and composite ones where `need` names them (None where not)."""
    import torch
    from transformers import Qwen3_5ForCausalLM
    torch.manual_seed(seed)
    cfg = text_config(shape)
    model = Qwen3_5ForCausalLM(cfg).float()
    randomize(model, seed)
    f32, b16 = work / "text-fp32", work / "text-bf16"
    for d in (f32, b16):
        shutil.rmtree(d, ignore_errors=True)
    total = sum(p.numel() for p in model.parameters()) * 4
    model.save_pretrained(f32, safe_serialization=True, max_shard_size=max(total // 3, 1 << 20))
    if "text-bf16" in need:
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(b16, safe_serialization=True)
    else:
        b16 = None
    sharded = (f32 / "model.safetensors.index.json").exists()
    say(f"save fp32 (sharded){' and bf16' if b16 else ''} text folders", True,
        f"{sum(p.numel() for p in model.parameters()):,} parameters, fp32 {'sharded' if sharded else 'one file'}")
    comp = work / "composite"
    shutil.rmtree(comp, ignore_errors=True)
    if "composite" not in need:
        return model, f32, b16, None
    try:
        from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
        cc = Qwen3_5Config(text_config=cfg.to_dict(),
                           vision_config=dict(depth=1, hidden_size=64, num_heads=2, intermediate_size=128,
                                              out_hidden_size=cfg.hidden_size, patch_size=8,
                                              num_position_embeddings=16),
                           tie_word_embeddings=cfg.tie_word_embeddings)
        cm = Qwen3_5ForConditionalGeneration(cc).float()
        cm.model.language_model.load_state_dict(model.model.state_dict(), strict=True)  # raises on a mismatch
        if not cfg.tie_word_embeddings:
            cm.lm_head.load_state_dict(model.lm_head.state_dict())
        cm.save_pretrained(comp, safe_serialization=True)
        names = hf_check.load_folder(comp).keys()
        lm = sum(k.startswith("model.language_model.") for k in names)
        vis = sum(k.startswith("model.visual.") for k in names)
        ok = lm > 0 and vis > 0
        say("save composite Qwen3_5ForConditionalGeneration", ok, f"{lm} language-model and {vis} vision tensors")
    except Exception as e:  # noqa: BLE001 — not constructible in this transformers: said, not failed
        traceback.print_exc()
        say("save composite Qwen3_5ForConditionalGeneration", None, f"not constructible here ({type(e).__name__}: {e})")
        comp = None
    return model, f32, b16, comp


# ---------------------------------------------------------------- ringscan's side

def case_dir(args, name, batch, shape):
    """A parity_step case directory (config.yaml + batch.safetensors) for the shape."""
    s = SHAPES[shape]
    _, tokens, targets, pos, doc_pos = batch
    B, T = tokens.shape
    d = args.work / f"case-{name}"
    d.mkdir(parents=True, exist_ok=True)
    sets = [f"model.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in s.items()]
    sets += [f"model.rope_theta={ROPE_THETA}", f"model.partial_rotary_factor={PARTIAL}", "model.rms_norm_eps=1e-6",
             "model.full_attention_interval=4", f"data.micro_batch={B}", f"data.seq_len={T}", "parallel.dp=1",
             "parallel.cp=1", f"data.path={args.data}", "device.kind=cpu"]
    cmd = [args.ringscan, "config", "show", ROOT / "configs/tiny-cpu.yaml"]
    for x in sets:
        cmd += ["--set", x]
    (d / "config.yaml").write_text(hf_check.sh(cmd))
    st.save(d / "batch.safetensors", {"tokens": tokens, "targets": targets, "pos": pos, "doc_pos": doc_pos})
    return d


def ringscan_grads(args, case, folder, device, tag):
    out = case / f"grads-{tag}.safetensors"
    cmd = [args.parity_step, case, "--hf", folder, "--out", out]
    if device == "cuda":
        cmd += ["--set", "device.kind=cuda"]
    else:
        cmd += ["--threads", str(args.threads)] + (["--emulate-bf16"] if device == "bf16emu" else [])
    t0 = time.monotonic()
    try:
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=args.step_timeout)
    except subprocess.TimeoutExpired as e:
        raise SystemExit(f"parity_step {device} on {folder.name}: no answer in {args.step_timeout} s; its output so far: "
                         f"{hf_check.text_of(e.stdout) + hf_check.text_of(e.stderr)}"[-800:])
    print(f"  parity_step {device} on {folder.name} ({case.name}): {time.monotonic() - t0:.1f} s", flush=True)
    if r.returncode != 0:
        raise SystemExit(f"parity_step {device} on {folder.name} failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    got = st.load(out)
    return float(got.pop("loss").reshape(())), got, r.stdout + r.stderr


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not np.all(np.isfinite(a)):
        return float("inf")
    nb = float(np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / (nb if nb > 0 else 1.0)


def compare(label, rs_loss, rs, hf_loss, hf, allow, loss_tol, expect_fail=False):
    if set(rs) != set(hf):
        return say(label, expect_fail, f"tensor names differ: {sorted(set(rs) ^ set(hf))[:6]}")
    rows = sorted(((rel(rs[k], hf[k]) / allow[k], rel(rs[k], hf[k]), k) for k in rs), reverse=True)
    le = abs(rs_loss - hf_loss) / abs(hf_loss)
    ok = le <= loss_tol and rows[0][0] <= 1.0
    detail = (f"loss ringscan {rs_loss:.8f} transformers {hf_loss:.8f} rel {le:.2e} (bound {loss_tol:g}); worst "
              f"gradient {rows[0][2]} rel {rows[0][1]:.2e} (bound {allow[rows[0][2]]:.2e}) over {len(rows)} tensors")
    if expect_fail:
        return say(label + " (a wrong layout must fail the comparison)", not ok, detail)
    return say(label, ok, detail)


# ---------------------------------------------------------------- the checks

def check_grads(args, folders, batches, cache):
    """ringscan against transformers on the text folders, every device and batch; the composite folder
    through ringscan alone (check_composite compares it with the text folder)."""
    for fname, folder in folders.items():
        if folder is None:
            continue
        for batch in batches:
            bname = batch[0]
            case = cache.setdefault(("case", bname), case_dir(args, bname, batch, args.shape))
            if fname != "composite":
                t0 = time.monotonic()
                hf = hf_check.TransformersModel(folder, args.hf_device)
                hf_loss, hf_grads = hf_check.hf_loss_and_grads(hf, *batch)
                print(f"  transformers on {args.hf_device}, {fname} ({bname}): {time.monotonic() - t0:.1f} s", flush=True)
                if "cpu" in args.devices:  # the cpu bound: transformers' own error against float64 (slow at 0.8b)
                    exact = hf_check.hf_loss_and_grads(hf_check.RefModel(folder), *batch)[1]
                    own = {k: max(1e-3, 2 * rel(hf_grads[k], exact[k])) for k in exact}
                    if fname == "text-fp32":
                        cache[("text-fp32", bname, "allow")] = own
            for dev in args.devices:
                label = f"grads {fname} {bname} {dev}"
                try:
                    rs_loss, rs, log = ringscan_grads(args, case, folder, dev, f"{fname}-{dev}")
                except SystemExit as e:
                    say(label, False, str(e))
                    continue
                cache[(fname, bname, dev)] = (rs_loss, rs, log)
                if fname == "composite":
                    continue
                if dev == "cpu":
                    compare(label, rs_loss, rs, hf_loss, hf_grads, own, 1e-4)
                else:
                    emu = ringscan_grads(args, case, folder, "bf16emu", f"{fname}-emu")
                    allow = {k: max(1e-2, 2 * rel(emu[1][k], hf_grads[k])) for k in rs}
                    compare(label + " (bf16 activations)", rs_loss, rs, hf_loss, hf_grads, allow, 1e-2)


def check_composite(args, cache, batches):
    """The composite folder's loss and gradients are the text folder's: bitwise on cpu; on cuda within 1e-6
    (the same weights and kernels; said if a kernel's reduction order is not fixed)."""
    for batch in batches:
        b = batch[0]
        for dev in args.devices:
            t, c = cache.get(("text-fp32", b, dev)), cache.get(("composite", b, dev))
            if not t or not c:
                say(f"composite == text ({b}, {dev})", None, "no composite folder or no run")
                continue
            worst = max([abs(c[0] - t[0]) / abs(t[0])] + [rel(c[1][k], t[1][k]) for k in t[1] if k in c[1]])
            same = set(t[1]) == set(c[1]) and (worst == 0.0 if dev == "cpu" else worst <= 1e-6)
            say(f"composite == text ({b}, {dev})", same,
                f"loss {c[0]!r} vs {t[0]!r}, worst relative difference {worst:.2e} "
                f"({'bitwise' if dev == 'cpu' else 'bound 1e-6'})")


def check_export(args, f32, b16, comp, batch):
    import torch
    for name, src, opts in (("fp32", f32, []), ("bf16", b16, ["--dtype", "bf16"]), ("composite", comp, [])):
        if src is None:
            say(f"export {name}", None, "no such folder")
            continue
        out = args.work / f"export-{name}"
        shutil.rmtree(out, ignore_errors=True)
        log = hf_check.sh([args.ringscan, "export", src, out, "--format", "qwen3_5", *opts])
        if name == "composite":
            note = [line for line in log.splitlines() if "left aside" in line]
            say("composite import names the vision tower left aside", "model.visual.* (the vision tower" in log,
                note[0] if note else "no 'left aside' line in export's output")
        want = hf_check.load_folder(f32 if name == "composite" else src)
        got = hf_check.load_folder(out)
        same = set(want) == set(got) and all(np.array_equal(want[k], got[k]) for k in want)
        say(f"export {name}: tensors bitwise", same, f"{len(got)} tensors; differ: {sorted(set(want) ^ set(got))[:4]}")
        m_src = hf_check.TransformersModel(f32 if name == "composite" else src)
        m_out = hf_check.TransformersModel(out)  # raises on missing / unexpected keys
        _, tokens, _, pos, _ = batch
        with torch.no_grad():
            a = m_src.logits(tokens[0], pos[0]).numpy()
            b = m_out.logits(tokens[0], pos[0]).numpy()
        d = float(np.abs(a - b).max())
        say(f"export {name}: transformers loads it, logits equal the source's", d == 0.0, f"max |diff| {d:.3e}")


def check_broken(args, f32, batch, cache):
    """Wrong layouts in the folder transformers loads must fail the cpu comparison."""
    cfg = json.loads((f32 / "config.json").read_text())
    tensors = hf_check.load_folder(f32)
    bname = batch[0]
    rs_loss, rs, _ = cache[("text-fp32", bname, "cpu")]
    for how in ("swap-z-qkv", "swap-v-heads", "rope-dims"):
        d = args.work / f"broken-{how}"
        shutil.rmtree(d, ignore_errors=True)
        hf_check.write_folder(d, f32, hf_check.broken(tensors, cfg, how), rope_dims=how == "rope-dims")
        hf = hf_check.TransformersModel(d)
        hf_loss, hf_grads = hf_check.hf_loss_and_grads(hf, *batch)
        allow = cache.get(("text-fp32", bname, "allow")) or {k: 1e-3 for k in rs}
        compare(f"broken {how} ({bname}, cpu)", rs_loss, rs, hf_loss, hf_grads, allow, 1e-4, expect_fail=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work", type=Path)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--devices", default="cpu,cuda")
    ap.add_argument("--impl", choices=["transformers", "ref"], default="transformers")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--checks", default="grads,composite,export,broken",
                    help="the checks after mrope and save (comma-separated; the 0.8b shape: grads alone is minutes)")
    ap.add_argument("--folders", default="text-fp32,text-bf16,composite",
                    help="the saved folders the grads check runs on")
    ap.add_argument("--hf-device", default="cpu",
                    help="where transformers' model runs (fp32, TF32 off; cuda: the 0.8b shape in seconds)")
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1),
                    help="OpenBLAS threads of the cpu and emulated-bf16 parity_step runs (results do not depend on it)")
    ap.add_argument("--step-timeout", type=int, default=900, help="seconds one parity_step run may take")
    ap.add_argument("--ringscan", type=Path, default=ROOT / "build/ringscan")
    ap.add_argument("--parity-step", type=Path, default=ROOT / "build/parity_step")
    args = ap.parse_args(argv)
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    args.devices = [d for d in args.devices.split(",") if d]
    checks = set(c for c in args.checks.split(",") if c)
    unknown = checks - {"grads", "composite", "export", "broken"}
    if unknown:
        ap.error(f"--checks: unknown {sorted(unknown)} (grads, composite, export, broken)")
    if checks & {"composite", "broken"} and "grads" not in checks:
        ap.error("--checks: composite and broken compare the grads check's runs: name grads too")
    try:
        import torch
        if args.impl == "transformers":
            import transformers
            from transformers import Qwen3_5ForCausalLM  # noqa: F401
            version = transformers.__version__
        else:
            hf_check.TransformersModel = hf_check.RefModel  # ref_model.py stands in (the same interface)
            version = "none: ref_model.py stands in"
    except Exception as e:  # noqa: BLE001
        say("transformers with Qwen3_5ForCausalLM", False, f"{type(e).__name__}: {e}")
        print("qwen35_check: FAIL")
        return 1
    print(f"qwen35_check: torch {torch.__version__}, transformers {version}, shape {args.shape}, "
          f"devices {args.devices}, batch {args.batch} x {args.seq_len}", flush=True)
    args.data = args.work / "recall.tok"
    if not args.data.exists():
        hf_check.sh([args.ringscan, "data", "synth", args.data, "--seed", "1"])
    batches = hf_check.make_batches(args.data, args.batch, args.seq_len)
    if args.impl == "transformers":
        guarded("mrope", check_mrope, args.shape)
        need = set(args.folders.split(",")) | ({"text-bf16", "composite"} if checks & {"export", "composite"} else set())
        saved = guarded("save", save_folders, args.work, args.shape, args.seed, need)
    else:
        say("mrope == 1-D rope on text", None, "needs transformers")
        saved = guarded("save", save_folders_ref, args.work, args.shape, args.seed)
    if saved:
        _, f32, b16, comp = saved
        want = [f for f in args.folders.split(",") if f]
        folders = {k: v for k, v in {"text-fp32": f32, "text-bf16": b16, "composite": comp}.items() if k in want}
        cache = {}
        if "grads" in checks:
            guarded("grads", check_grads, args, folders, batches, cache)
        if "composite" in checks:
            guarded("composite", check_composite, args, cache, batches)
        if "export" in checks:
            guarded("export", check_export, args, f32, b16, comp, batches[0])
        if "broken" not in checks:
            pass
        elif ("text-fp32", batches[0][0], "cpu") in cache:
            guarded("broken", check_broken, args, f32, batches[0], cache)
        else:
            say("broken layouts", False, "no cpu run of the fp32 folder to compare with")
    ok = bool(RESULTS) and all(r is not False for r in RESULTS)
    n_fail = sum(r is False for r in RESULTS)
    print(f"qwen35_check: {'PASS' if ok else 'FAIL'} ({len(RESULTS)} checks, {n_fail} failed, "
          f"{sum(r is None for r in RESULTS)} skipped)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
