"""qwen35_train_hf.py — transformers' side of the continued-training proof of issue 36 (bench/gpu_runs.sh
qwen35-train; run on the GPU machine, where transformers >= 5 with qwen3_5 is installed):

    python3 tests/parity/qwen35_train_hf.py save CONFIG.yaml OUT_DIR [--seed S]
    python3 tests/parity/qwen35_train_hf.py load EXPORT_DIR SOURCE_DIR [--tokens N]

save  builds transformers' Qwen3_5ForCausalLM at the shape of CONFIG.yaml's model section (every key
      model.init_from compares: vocab, hidden, intermediate, layers, full_attention_interval as
      layer_types, heads, head dim, partial rotary factor, rope_theta, the GDN heads and dims, the conv
      width, rms_norm_eps, tied embeddings), with transformers' own random initialisation on the GPU
      (seeded), and saves it in bf16 with save_pretrained: the folder `ringscan train` imports through
      model.init_from. Prints the parameter count and the folder's size.
load  loads EXPORT_DIR (`ringscan export --format qwen3_5` of the trained run) with
      AutoModelForCausalLM.from_pretrained in fp32 (loading info: nothing missing, unexpected or
      mismatched), checks it is a Qwen3_5ForCausalLM with SOURCE_DIR's config, runs N tokens through it
      on the GPU and checks the logits are finite; then the same tokens through SOURCE_DIR's model: how far the
      training moved the logits (said, not bounded: a few steps at a small learning rate move them a
      little, but not zero).

Output: one line per check, `PASS  ...` or `FAIL  ...`, then `qwen35_train_hf: PASS` (exit 0) or
`qwen35_train_hf: FAIL` (exit 1); exit 2 for bad arguments or a missing package (named).
"""
import argparse
import json
import sys
from pathlib import Path

RESULTS = []


def say(check, ok, detail=""):
    RESULTS.append(bool(ok))
    print(f"{'PASS' if ok else 'FAIL'}  {check}{': ' + detail if detail else ''}", flush=True)


def need(pkg):
    try:
        return __import__(pkg)
    except ImportError as e:
        print(f"qwen35_train_hf: {pkg} is not importable ({e}); install it on the GPU machine", file=sys.stderr)
        sys.exit(2)


def text_config(yaml_path):
    """Qwen3_5TextConfig from the ringscan config's model section (the keys model.init_from compares)."""
    yaml = need("yaml")
    from transformers import Qwen3_5TextConfig
    try:
        m = yaml.safe_load(Path(yaml_path).read_text())["model"]
    except (OSError, KeyError, TypeError, yaml.YAMLError) as e:
        print(f"qwen35_train_hf: {yaml_path}: cannot read its model section ({e})", file=sys.stderr)
        sys.exit(2)
    L, every = int(m["num_hidden_layers"]), int(m.get("full_attention_interval", 4))
    types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(L)]
    hd, prf = int(m["head_dim"]), float(m["partial_rotary_factor"])
    half = int(hd * prf) // 2  # the interleaved mrope sections cover the rotary half-dims (text: plain 1-D RoPE)
    section = [half // 3 + (i < half % 3) for i in range(3)]  # 64 rotary dims: [11, 11, 10], as published
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim")
    return Qwen3_5TextConfig(**{k: int(m[k]) for k in keys}, num_hidden_layers=L, head_dim=hd, layer_types=types,
                             rms_norm_eps=float(m["rms_norm_eps"]), tie_word_embeddings=bool(m["tie_word_embeddings"]),
                             max_position_embeddings=262144, hidden_act="silu",
                             rope_parameters={"rope_type": "default", "rope_theta": float(m["rope_theta"]),
                                              "partial_rotary_factor": prf, "mrope_section": section,
                                              "mrope_interleaved": True})


def cmd_save(a):
    torch = need("torch")
    from transformers import Qwen3_5ForCausalLM
    cfg = text_config(a.config)
    torch.manual_seed(a.seed)
    with torch.device("cuda"):
        model = Qwen3_5ForCausalLM(cfg)
    n = sum(p.numel() for p in model.parameters())
    model.to(torch.bfloat16).save_pretrained(a.out, max_shard_size="2GB")
    size = sum(f.stat().st_size for f in Path(a.out).glob("*.safetensors"))
    conf = json.loads((Path(a.out) / "config.json").read_text())
    say("save", conf.get("model_type") == "qwen3_5_text",
        f"Qwen3_5ForCausalLM, {n:,} parameters (transformers' init, seed {a.seed}), bf16, {size / 2**30:.2f} GiB in "
        f"{a.out} (model_type {conf.get('model_type')})")


def cmd_load(a):
    torch = need("torch")
    from transformers import AutoModelForCausalLM, Qwen3_5ForCausalLM
    how = "AutoModelForCausalLM"
    try:
        model, info = AutoModelForCausalLM.from_pretrained(a.export, dtype=torch.float32, output_loading_info=True)
    except (ValueError, KeyError) as e:  # the Auto mapping lacking qwen3_5_text: said, then the class itself
        how = f"Qwen3_5ForCausalLM (AutoModelForCausalLM refused: {type(e).__name__}: {str(e)[:120]})"
        model, info = Qwen3_5ForCausalLM.from_pretrained(a.export, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    say("export loads in transformers", not bad and type(model).__name__ == "Qwen3_5ForCausalLM",
        f"{type(model).__name__} by {how}; loading info {bad or 'clean (nothing missing, unexpected or mismatched)'}")
    src = json.loads((Path(a.source) / "config.json").read_text())
    out = model.config.to_dict()
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads", "layer_types",
            "tie_word_embeddings")
    diff = [k for k in keys if src.get(k) != out.get(k)]
    say("export config == source config", not diff, f"keys differing: {diff}" if diff else f"{len(keys)} keys equal")
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, src["vocab_size"], (1, a.tokens), generator=g).cuda()
    model = model.cuda().eval()
    with torch.no_grad():
        got = model(input_ids=ids).logits.float()
    fin = bool(torch.isfinite(got).all())
    say("export logits finite", fin and got.shape[-1] == src["vocab_size"],
        f"shape {tuple(got.shape)}, max |logit| {got.abs().max().item():.3f}")
    del model
    torch.cuda.empty_cache()
    ref = Qwen3_5ForCausalLM.from_pretrained(a.source, dtype=torch.float32).cuda().eval()
    with torch.no_grad():
        want = ref(input_ids=ids).logits.float()
    moved = (got - want).abs().max().item()
    say("training moved the model", moved > 0, f"max |logit(export) - logit(source)| over {a.tokens} tokens {moved:.4f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("config")
    s.add_argument("out")
    s.add_argument("--seed", type=int, default=1)
    ld = sub.add_parser("load")
    ld.add_argument("export")
    ld.add_argument("source")
    ld.add_argument("--tokens", type=int, default=32)
    a = p.parse_args()
    try:
        (cmd_save if a.cmd == "save" else cmd_load)(a)
    except Exception as e:  # noqa: BLE001 — reported as this script's FAIL with its reason
        import traceback
        traceback.print_exc()
        say(a.cmd, False, f"{type(e).__name__}: {e}")
    ok = bool(RESULTS) and all(RESULTS)
    print(f"qwen35_train_hf: {'PASS' if ok else 'FAIL'}", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
