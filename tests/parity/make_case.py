#!/usr/bin/python3
"""make_case.py — writes a whole-model parity case for a ringscan config:

    /usr/bin/python3 tests/parity/make_case.py CONFIG OUT_DIR [--set key=value ...]
        [--batch B] [--seq-len T] [--seed S] [--ringscan build/ringscan]

The config is resolved by `ringscan config show CONFIG [--set ...]` (so the
case uses exactly what the C trainer reads), with data.micro_batch = B and
data.seq_len = T set from --batch / --seq-len; its output is parsed here.
OUT_DIR gets (file contents are defined in tests/parity/README.md):
  config.yaml         the resolved config (`config show` output)
  weights.safetensors random weights, internal names and layout, F32
  batch.safetensors   tokens, targets, pos, doc_pos: I32 [B, T]
  ref.safetensors     "loss" (F64, shape []) and the gradient of every internal
                      parameter (F64), from ref_model.py run in float64 on the
                      same F32-rounded weights

The weights are random and non-trivial (not the init of the spec): every norm
weight, A_log and dt_bias random, matrices N(0, 0.02..0.1), so that every
gradient is exercised. The batch packs several documents per sample: shorter
and longer than the 64-token chunk, a 1-token document, documents starting
mid-chunk, and (sample 1 and later odd samples) a sample that starts inside a
document (doc_pos[0] > 0); --docs replaces that layout with explicit document
lengths per sample (the CP tests place boundaries on and next to segment
boundaries). Targets are the next token of the same document and
-1 at each document's last token.

Used by tests/test_reference.py and the C parity test.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import layout  # noqa: E402
import ref_model  # noqa: E402
import safetensors_io  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORMAT = "ringscan-parity-v1"


# ---------------------------------------------------------------- config

def _scalar(text):
    """One value of `config show`: quoted string, [list], true/false, int, float or bare word."""
    t = text.strip()
    if t.startswith('"') and t.endswith('"') and len(t) >= 2:
        return json.loads(t)  # config show escapes only " and \, which JSON reads the same
    if t.startswith("[") and t.endswith("]"):
        inner = t[1:-1].strip()
        return [_scalar(x) for x in inner.split(",")] if inner else []
    if t in ("true", "false"):
        return t == "true"
    try:
        return int(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        return t


def parse_config_show(text):
    """Parses the two-level YAML of `ringscan config show` into {section: {key: value}}."""
    out = {}
    section = None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            if not line.endswith(":"):
                raise ValueError(f"config show line {n}: expected 'section:', got {line!r}")
            section = out.setdefault(line[:-1].strip(), {})
        else:
            if section is None or ":" not in line:
                raise ValueError(f"config show line {n}: expected '  key: value', got {line!r}")
            key, value = line.strip().split(":", 1)
            section[key.strip()] = _scalar(value)
    return out


def resolve_config(config, sets=(), ringscan=None):
    """Runs `ringscan config show`; returns (its text, parsed dict)."""
    exe = ringscan or os.path.join(ROOT, "build", "ringscan")
    args = [exe, "config", "show", config]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"make_case: `{' '.join(args)}` failed ({r.returncode}):\n{r.stderr}")
    return r.stdout, parse_config_show(r.stdout)


# ---------------------------------------------------------------- weights and batch

def random_weights(cfg, seed):
    """Random HF-named weights, rounded to float32 (what the C side loads), as float64 tensors."""
    gen = torch.Generator().manual_seed(seed)

    def uni(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float64)

    P = {}
    for name, shape in ref_model.hf_shapes(cfg).items():
        if name.endswith(("linear_attn.norm.weight", "linear_attn.o_norm.weight")):
            t = uni(shape, 0.5, 1.5)              # plain scale around 1
        elif name.endswith("norm.weight"):
            t = uni(shape, -0.5, 0.5)             # zero-centred: scale 1 + w
        elif name.endswith("A_log"):
            t = uni(shape, -2.0, 1.0)             # A in [0.14, 2.7]
        elif name.endswith("dt_bias"):
            t = uni(shape, -1.5, 1.0)
        elif name.endswith("conv1d.weight"):
            t = 0.3 * torch.randn(shape, generator=gen, dtype=torch.float64)
        elif name == "model.embed_tokens.weight":
            t = 0.1 * torch.randn(shape, generator=gen, dtype=torch.float64)
        elif name == "lm_head.weight":
            t = 0.1 * torch.randn(shape, generator=gen, dtype=torch.float64)
        else:                                     # projections and MLP
            std = float(uni((), 0.02, 0.1)) if "down_proj" in name or "o_proj" in name \
                or "out_proj" in name else 0.06
            t = std * torch.randn(shape, generator=gen, dtype=torch.float64)
        P[name] = t.to(torch.float32).to(torch.float64)
    return P


def document_lengths(T, sample, rng):
    """Document lengths of one sample, summing to T. The first sample's fixed head covers
    every case named in the README; the rest is random."""
    fixed = [1, 70, 13, 64, 1, 150, 5] if sample % 2 == 0 else [40, 1, 100, 2, 64]
    lengths = []
    left = T
    for n in fixed:
        if left == 0:
            break
        lengths.append(min(n, left))
        left -= lengths[-1]
    while left > 0:
        n = int(min(left, rng.integers(1, 200)))
        lengths.append(n)
        left -= n
    return lengths


def make_batch(cfg, B, T, seed, docs=None):
    """tokens, targets, pos, doc_pos: int32 [B, T]. docs: None (the default layout above) or one
    {"lengths": [...], "carry": c} per sample: document lengths summing to T, the first one
    continuing a document that began c tokens before the sample."""
    if docs is not None:
        if len(docs) != B:
            raise SystemExit(f"make_case: --docs gives {len(docs)} samples, the batch has {B}")
        for i, d in enumerate(docs):
            if sum(d["lengths"]) != T or min(d["lengths"]) < 1 or d.get("carry", 0) < 0:
                raise SystemExit(f"make_case: --docs sample {i}: lengths must be >= 1 and sum to T = {T}, "
                                 f"carry >= 0; got {d}")
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab_size, size=(B, T)).astype(np.int32)
    targets = np.full((B, T), -1, np.int32)
    pos = np.tile(np.arange(T, dtype=np.int32), (B, 1))
    doc_pos = np.zeros((B, T), np.int32)
    for s in range(B):
        # odd samples start inside a document that began 37 tokens before the sample
        carry = 37 if s % 2 == 1 else 0
        lengths = document_lengths(T, s, rng)
        if docs is not None:
            carry, lengths = docs[s].get("carry", 0), docs[s]["lengths"]
        start = 0
        for i, n in enumerate(lengths):
            first = carry if i == 0 else 0
            doc_pos[s, start:start + n] = np.arange(first, first + n)
            targets[s, start:start + n - 1] = tokens[s, start + 1:start + n]  # last token: -1
            start += n
    return tokens, targets, pos, doc_pos


# ---------------------------------------------------------------- the case

def make_case(config, out_dir, sets=(), batch=2, seq_len=None, seed=1, ringscan=None, log=print, docs=None):
    # the batch shape goes into the config too, so config.yaml describes the case exactly
    sets = list(sets) + [f"data.micro_batch={batch}"] + ([f"data.seq_len={seq_len}"] if seq_len else [])
    text, resolved = resolve_config(config, sets, ringscan)
    cfg = ref_model.ModelConfig.from_mapping(resolved["model"])
    T = int(resolved["data"]["seq_len"])
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.yaml"), "w") as f:
        f.write(text)

    P = random_weights(cfg, seed)
    weights = {k: v.to(torch.float32).numpy() for k, v in layout.hf_to_internal(P, cfg).items()}
    meta = {"format": FORMAT, "config": os.path.abspath(config), "sets": json.dumps(list(sets)),
            "seed": str(seed)}
    safetensors_io.save(os.path.join(out_dir, "weights.safetensors"), weights, meta)

    tokens, targets, pos, doc_pos = make_batch(cfg, batch, T, seed, docs)
    safetensors_io.save(os.path.join(out_dir, "batch.safetensors"),
                        {"tokens": tokens, "targets": targets, "pos": pos, "doc_pos": doc_pos}, meta)

    t0 = time.time()
    loss, grads = ref_model.loss_and_grads(P, cfg, *(torch.from_numpy(a) for a in (tokens, targets, pos, doc_pos)))
    ref = {"loss": np.array(loss, dtype=np.float64)}
    ref.update({k: v.numpy() for k, v in layout.hf_to_internal(grads, cfg).items()})
    ref_meta = dict(meta, tokens_with_target=str(int((targets >= 0).sum())))
    safetensors_io.save(os.path.join(out_dir, "ref.safetensors"), ref, ref_meta)
    log(f"make_case: {out_dir}: B={batch} T={T} {len(weights)} tensors, "
        f"{sum(w.size for w in weights.values()):,} parameters, loss {loss:.10f} "
        f"(reference {time.time() - t0:.1f}s)")
    return loss


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("out_dir")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="config override, passed to `ringscan config show` (repeatable)")
    ap.add_argument("--batch", type=int, default=2, help="samples B (default 2; sets data.micro_batch)")
    ap.add_argument("--seq-len", type=int, default=None,
                    help="tokens per sample T (default data.seq_len; sets data.seq_len, which the config "
                         "validates against parallel.cp: T %% (2 cp 64) == 0)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ringscan", default=None, help="the ringscan binary (default build/ringscan)")
    ap.add_argument("--docs", default=None, metavar="JSON",
                    help='document layout per sample, e.g. \'[{"lengths": [64, 960], "carry": 0}, ...]\' '
                         "(lengths sum to T; carry = tokens of the first document before the sample)")
    a = ap.parse_args(argv)
    make_case(a.config, a.out_dir, a.sets, a.batch, a.seq_len, a.seed, a.ringscan,
              docs=json.loads(a.docs) if a.docs else None)


if __name__ == "__main__":
    main()
