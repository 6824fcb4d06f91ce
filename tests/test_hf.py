"""test_hf.py — `ringscan export` (a Hugging Face Qwen3NextForCausalLM folder) and the import of such a
folder or a ringscan checkpoint (model.init_from): the structure transformers needs, the interleaved
layouts against tests/parity/layout.py, bf16 rounding, sharding, atomicity and refusals, and
export -> import -> export bitwise. transformers itself is not needed here: the proof against it is
tests/parity/hf_check.py (tests/cuda/gpu_regress.sh part `hf`)."""
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, run

sys.path.insert(0, str(ROOT / "tests" / "parity"))
import safetensors_io as st  # noqa: E402

TINY = ["--set", "parallel.cp=1", "--set", "data.seq_len=128", "--set", "data.micro_batch=2",
        "--set", "train.warmup_steps=1", "--set", "checkpoint.every=0"]


def train(ringscan, recall_tok, out, steps=2, extra=()):
    r = run([ringscan, "train", ROOT / "configs/tiny-cpu.yaml", *TINY, "--set", f"data.path={recall_tok}",
             "--set", f"train.steps={steps}", "--set", f"run.out_dir={out}", *extra])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    return out


@pytest.fixture(scope="module")
def tiny_run(ringscan, recall_tok, tmp_path_factory):
    return train(ringscan, recall_tok, tmp_path_factory.mktemp("hf") / "run")


def export(ringscan, src, out, *opts, ok=True):
    r = run([ringscan, "export", src, out, *opts])
    if ok:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def header(path):
    """The safetensors header of a file: name -> {dtype, shape, data_offsets} (and __metadata__)."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n])


def tensors(folder):
    """name -> (dtype, numpy array as float32) over every safetensors file of an export."""
    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        h = header(f)
        for name, a in st.load(f).items():
            out[name] = (h[name]["dtype"], a)
    return out


def expected_shapes(cfg):
    """The HF state dict of docs/design/model.md (names and shapes), from config.json."""
    H, I, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    nk, nv, dk, dv = (cfg[k] for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                       "linear_value_head_dim"))
    nh, nkv, hd, Kc = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], \
        cfg["linear_conv_kernel_dim"]
    s = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H], "lm_head.weight": [V, H]}
    for i in range(L):
        p = f"model.layers.{i}."
        s.update({p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
                  p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H],
                  p + "mlp.down_proj.weight": [H, I]})
        if cfg["layer_types"][i] == "linear_attention":
            s.update({p + "linear_attn.in_proj_qkvz.weight": [2 * nk * dk + 2 * nv * dv, H],
                      p + "linear_attn.in_proj_ba.weight": [2 * nv, H],
                      p + "linear_attn.conv1d.weight": [2 * nk * dk + nv * dv, 1, Kc],
                      p + "linear_attn.dt_bias": [nv], p + "linear_attn.A_log": [nv],
                      p + "linear_attn.norm.weight": [dv], p + "linear_attn.out_proj.weight": [H, nv * dv]})
        else:
            s.update({p + "self_attn.q_proj.weight": [2 * nh * hd, H], p + "self_attn.k_proj.weight": [nkv * hd, H],
                      p + "self_attn.v_proj.weight": [nkv * hd, H], p + "self_attn.o_proj.weight": [H, nh * hd],
                      p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd]})
    return s


def test_export_structure(ringscan, tiny_run, tmp_path):
    out = tmp_path / "hf"
    r = export(ringscan, tiny_run, out)
    assert "export: done" in r.stdout and "step 2" in r.stdout, r.stdout
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3NextForCausalLM"] and cfg["model_type"] == "qwen3_next"
    L = cfg["num_hidden_layers"]
    assert cfg["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] and L == 4
    assert cfg["mlp_only_layers"] == list(range(L)) and cfg["decoder_sparse_step"] == 1
    assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    assert cfg["rope_theta"] == 10000.0 and cfg["partial_rotary_factor"] == 0.25 and cfg["rms_norm_eps"] == 1e-6
    assert cfg["linear_conv_kernel_dim"] == 4 and cfg["linear_num_value_heads"] == 4 and cfg["dtype"] == "float32"
    assert cfg["tie_word_embeddings"] is False and cfg["attention_bias"] is False and cfg["hidden_act"] == "silu"
    h = header(out / "model.safetensors")
    assert h.pop("__metadata__") == {"format": "pt"}  # transformers refuses files without it
    want = expected_shapes(cfg)
    assert {k: v["shape"] for k, v in h.items()} == want
    assert {v["dtype"] for v in h.values()} == {"F32"}
    assert sum(int(np.prod(s)) for s in want.values()) == 2767448  # `ringscan plan configs/tiny-cpu.yaml`


def test_export_layout_matches_the_reference(ringscan, tiny_run, tmp_path):
    """The C permutation equals layout.py's (which the whole-model parity against PyTorch checks)."""
    torch = pytest.importorskip("torch")  # noqa: F841 (layout.py runs on torch)
    import layout
    from ref_model import ModelConfig
    out = tmp_path / "hf"
    export(ringscan, tiny_run, out)
    cfg = ModelConfig.from_mapping(json.loads((out / "config.json").read_text()))
    step = (tiny_run / "ckpt/LATEST").read_text().strip()
    want = layout.internal_to_hf(st.load(tiny_run / "ckpt" / step / "model.safetensors"), cfg)
    got = st.load(out / "model.safetensors")
    assert set(want) == set(got)
    for k in want:
        assert np.array_equal(want[k].numpy(), got[k]), k


def bf16_round(a):
    """fp32 -> bf16 (round to nearest even) -> fp32, in numpy."""
    b = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32)


def test_export_bf16_sharded_and_round_trip(ringscan, tiny_run, tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    export(ringscan, tiny_run, a)
    r = export(ringscan, tiny_run / "ckpt" / (tiny_run / "ckpt/LATEST").read_text().strip(), b, "--dtype", "bf16",
               "--shard-gib", "0.002")
    shards = sorted(p.name for p in b.glob("*.safetensors"))
    assert len(shards) == 3 and shards[0] == "model-00001-of-00003.safetensors", shards
    assert r.stdout.count("export: model-0000") == 3  # a progress line per file
    idx = json.loads((b / "model.safetensors.index.json").read_text())
    f32, b16 = tensors(a), tensors(b)
    assert set(idx["weight_map"]) == set(b16) == set(f32)
    for name, file in idx["weight_map"].items():
        assert name in header(b / file)
    assert idx["metadata"]["total_size"] == sum(2 * v.size for _, v in b16.values())
    assert json.loads((b / "config.json").read_text())["dtype"] == "bfloat16"
    for k, (dt, v) in b16.items():
        assert dt == "BF16" and np.array_equal(v, bf16_round(f32[k][1])), k
    # HF folder -> export again: the same bytes (the import scatters exactly what the export gathered)
    export(ringscan, b, c, "--dtype", "bf16", "--shard-gib", "0.002")
    for f in shards:
        assert (b / f).read_bytes() == (c / f).read_bytes(), f
    d = tmp_path / "d"
    export(ringscan, a, d)
    assert (a / "model.safetensors").read_bytes() == (d / "model.safetensors").read_bytes()


def test_export_refuses(ringscan, tiny_run, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("x")
    r = export(ringscan, tiny_run, full, ok=False)
    assert r.returncode == 2 and "is not empty" in r.stderr and "hint" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # no temporary folder left
    r = export(ringscan, tmp_path / "nothing", tmp_path / "out", ok=False)
    assert r.returncode == 2 and "neither a ringscan run directory" in r.stderr, r.stderr
    for bad in (["--dtype", "fp8"], ["--shard-gib", "0"], ["--bogus"]):
        r = export(ringscan, tiny_run, tmp_path / "out", *bad, ok=False)
        assert r.returncode == 2 and "ringscan export:" in r.stderr, (bad, r.stderr)
    assert not (tmp_path / "out").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    export(ringscan, tiny_run, empty)  # an empty directory is fine
    assert (empty / "model.safetensors").exists()


FROZEN = ["--set", "train.lr=0", "--set", "train.min_lr=0"]  # AdamW with lr 0 leaves every weight as it was


def latest_model(run_dir):
    return run_dir / "ckpt" / (run_dir / "ckpt/LATEST").read_text().strip() / "model.safetensors"


@pytest.mark.parametrize("opts", [[], ["--dtype", "bf16", "--shard-gib", "0.002"]])
def test_export_import_export_bitwise(ringscan, recall_tok, tiny_run, tmp_path, opts):
    """export -> model.init_from (a new run, one step at lr 0) -> export: the same safetensors bytes."""
    a, b = tmp_path / "a", tmp_path / "b"
    export(ringscan, tiny_run, a, *opts)
    r = run([ringscan, "train", ROOT / "configs/tiny-cpu.yaml", *TINY, *FROZEN, "--set", f"data.path={recall_tok}",
             "--set", "train.steps=1", "--set", f"run.out_dir={tmp_path / 'run'}", "--set", f"model.init_from={a}"])
    assert r.returncode == 0 and f"init: weights from {a}" in r.stdout, r.stdout[-1500:] + r.stderr
    export(ringscan, tmp_path / "run", b, *opts)
    files = sorted(p.name for p in a.glob("*.safetensors"))
    assert files == sorted(p.name for p in b.glob("*.safetensors")) and files
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    if not opts:  # fp32: the imported run's own checkpoint holds the source run's weights exactly
        src, got = st.load(latest_model(tiny_run)), st.load(latest_model(tmp_path / "run"))
        assert set(src) == set(got) and all(np.array_equal(src[k], got[k]) for k in src)


def test_init_from_ringscan_run(ringscan, recall_tok, tiny_run, tmp_path):
    out = tmp_path / "run"
    r = run([ringscan, "train", ROOT / "configs/tiny-cpu.yaml", *TINY, *FROZEN, "--set", f"data.path={recall_tok}",
             "--set", "train.steps=1", "--set", f"run.out_dir={out}", "--set", f"model.init_from={tiny_run}"])
    assert r.returncode == 0, r.stderr
    src, got = st.load(latest_model(tiny_run)), st.load(latest_model(out))
    assert all(np.array_equal(src[k], got[k]) for k in src)
    # the optimizer starts fresh: its moments are one step's, not the source run's accumulated ones
    opt = st.load(latest_model(out).with_name("optim.safetensors"))
    src_opt = st.load(latest_model(tiny_run).with_name("optim.safetensors"))
    assert not np.array_equal(opt["v.lm_head"], src_opt["v.lm_head"])


@pytest.mark.parametrize("dtype,bad", [(np.float32, np.nan), (np.float16, np.inf)])
def test_weights_that_are_not_finite_are_refused(ringscan, recall_tok, tiny_run, tmp_path, dtype, bad):
    """A Hugging Face folder with one embedding row NaN (F32) or Inf (F16): model.init_from and export both
    refuse it, exit 2, naming the tensor, the file and the first element; nothing is written."""
    hf = tmp_path / "hf"
    export(ringscan, tiny_run, hf)
    ts = st.load(hf / "model.safetensors")
    emb = np.array(ts["model.embed_tokens.weight"], dtype=np.float32)
    emb[7, :] = bad
    ts["model.embed_tokens.weight"] = emb
    ts = {k: np.asarray(v, dtype=dtype) for k, v in ts.items()}
    st.save(hf / "model.safetensors", ts, {"format": "pt"})
    run_dir = tmp_path / "run"
    r = run([ringscan, "train", ROOT / "configs/tiny-cpu.yaml", *TINY, "--set", f"data.path={recall_tok}",
             "--set", "train.steps=1", "--set", f"run.out_dir={run_dir}", "--set", f"model.init_from={hf}"])
    assert r.returncode == 2, r.stdout[-1500:] + r.stderr
    assert "tensor model.embed_tokens.weight in" in r.stderr and "not finite" in r.stderr, r.stderr
    assert f"element {7 * emb.shape[1]}" in r.stderr, r.stderr
    assert not run_dir.exists()
    r = export(ringscan, hf, tmp_path / "out", ok=False)
    assert r.returncode == 2 and "model.embed_tokens.weight" in r.stderr and "not finite" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no output, no temporary folder


def test_init_from_refuses_mismatch(ringscan, recall_tok, tiny_run, tmp_path):
    hf = tmp_path / "hf"
    export(ringscan, tiny_run, hf)
    # a folder whose config.json agrees with the config but one tensor's shape does not
    lying = tmp_path / "lying"
    export(ringscan, tiny_run, lying)
    ts = st.load(lying / "model.safetensors")
    ts["model.layers.0.mlp.gate_proj.weight"] = ts["model.layers.0.mlp.gate_proj.weight"][:384]
    st.save(lying / "model.safetensors", ts, {"format": "pt"})
    base = [ringscan, "train", ROOT / "configs/tiny-cpu.yaml", *TINY, "--set", f"data.path={recall_tok}",
            "--set", "train.steps=1", "--set", f"run.out_dir={tmp_path / 'run'}"]
    cases = [  # (init_from, extra sets, what the message must name)
        (hf, ["model.intermediate_size=384"],
         [f"{hf}/config.json has intermediate_size = 512", "model.intermediate_size = 384", "model.init_from"]),
        (lying, [], ["model.layers.0.mlp.gate_proj.weight", "[384, 256]", "[512, 256]", "model.init_from"]),
        (tiny_run, ["model.intermediate_size=384"], ["(its saved config) has intermediate_size = 512",
                                                     "model.intermediate_size = 384"]),
        (hf, ["model.full_attention_interval=2"], ["layer 1 of kind linear_attention", "makes it full_attention"]),
        (tmp_path / "nowhere", [], ["no such directory"]),
        (tmp_path, [], ["neither a Hugging Face model folder"]),
    ]
    for src, sets, words in cases:
        cmd = base + ["--set", f"model.init_from={src}"]
        for s in sets:
            cmd += ["--set", s]
        r = run(cmd)
        assert r.returncode == 2, (src, sets, r.stdout[-1000:], r.stderr)
        for w in words:
            assert w in r.stderr, (w, r.stderr)
        assert not (tmp_path / "run").exists(), "nothing may be written on a refused import"


def test_init_from_refuses_a_tie_mismatch(ringscan, recall_tok, tiny_run, tmp_path):
    """Issue 35, item 1: a run with its own (trained) lm_head imported into a config with tied embeddings
    used to drop the lm_head silently (rc 0); the other way round has no lm_head to start from. Both are
    refused with the reason, from the run directory, a checkpoint directory and its export; nothing written."""
    hf = tmp_path / "hf"
    export(ringscan, tiny_run, hf)
    step = tiny_run / "ckpt" / (tiny_run / "ckpt/LATEST").read_text().strip()
    for src in (tiny_run, step, hf):
        r = run([ringscan, "train", ROOT / "configs/tiny-cpu.yaml", *TINY, "--set", f"data.path={recall_tok}",
                 "--set", "train.steps=1", "--set", f"run.out_dir={tmp_path / 'run'}",
                 "--set", f"model.init_from={src}", "--set", "model.tie_word_embeddings=true"])
        assert r.returncode == 2, (src, r.stdout[-1000:], r.stderr)
        assert "tie_word_embeddings = false" in r.stderr and "model.tie_word_embeddings = true" in r.stderr, r.stderr
        assert "trained lm_head would be dropped" in r.stderr, r.stderr
        assert not (tmp_path / "run").exists()
    tied = train(ringscan, recall_tok, tmp_path / "tied", steps=1, extra=["--set", "model.tie_word_embeddings=true"])
    r = run([ringscan, "train", ROOT / "configs/tiny-cpu.yaml", *TINY, "--set", f"data.path={recall_tok}",
             "--set", "train.steps=1", "--set", f"run.out_dir={tmp_path / 'run'}", "--set", f"model.init_from={tied}"])
    assert r.returncode == 2 and "no lm_head of its own" in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


def edit_config(folder, edit):
    """Rewrites folder/config.json with edit(dict) applied (edit may also return raw text)."""
    cfg = json.loads((folder / "config.json").read_text())
    out = edit(cfg)
    (folder / "config.json").write_text(out if isinstance(out, str) else json.dumps(cfg))


def _set(**kv):
    def edit(cfg):
        for k, v in kv.items():
            if v is None:
                cfg.pop(k, None)
            else:
                cfg[k] = v
    return edit


CONFIG_ATTACKS = [  # (name, edit of config.json, words the message must hold)
    ("invalid-json", lambda c: "{\"model_type\": \"qwen3_next\",", ["config.json", "not a JSON object"]),
    ("experts", _set(num_experts=8, mlp_only_layers=None), ["mixture-of-experts", "num_experts 8"]),
    ("layer-types", _set(layer_types=["linear_attention", "full_attention"] * 2),
     ["layer 1 of kind full_attention", "makes it linear_attention"]),
    ("hidden-size", _set(hidden_size=128), ["hidden_size = 128", "model.hidden_size = 256"]),
    ("rope-theta", lambda c: (c.update(rope_theta=1e6), c["rope_parameters"].update(rope_theta=1e6)),
     ["rope_theta = 1000000", "model.rope_theta = 10000"]),
    ("rope-theta-ambiguous", _set(rope_theta=1e6), ["rope_theta is 1e+06 but rope_parameters.rope_theta is 10000"]),
    ("partial-rotary", lambda c: (c.update(partial_rotary_factor=0.5),
                                  c["rope_parameters"].update(partial_rotary_factor=0.5)),
     ["partial_rotary_factor = 0.5", "model.partial_rotary_factor = 0.25"]),
    ("rms-norm-eps", _set(rms_norm_eps=1e-5), ["rms_norm_eps = 1e-05", "model.rms_norm_eps = 1e-06"]),
    ("tie", _set(tie_word_embeddings=True), ["tie_word_embeddings = true"]),
    ("yarn", lambda c: c["rope_parameters"].update(rope_type="yarn"), ["rope_type is \"yarn\"", "plain RoPE"]),
    ("bias", _set(attention_bias=True), ["attention_bias is not false"]),
    ("act", _set(hidden_act="gelu"), ["hidden_act is \"gelu\""]),
    ("moe-type", _set(model_type="qwen3_5_moe"), ["qwen3_5_moe", "mixture-of-experts"]),
    ("other-type", _set(model_type="llama"), ["model_type is \"llama\""]),
]


@pytest.mark.parametrize("name,edit,words", CONFIG_ATTACKS, ids=[c[0] for c in CONFIG_ATTACKS])
def test_init_from_reads_config_json(ringscan, recall_tok, tiny_run, tmp_path, name, edit, words):
    """Issue 35, item 1: model.init_from from a Hugging Face folder read only the tensors; a config.json that
    is not JSON, describes a MoE model, other layer kinds, another hidden size, RoPE or norm epsilon imported
    with rc 0. Now the import reads config.json with export's own reader (hf_read_config) and compares its
    model with the config being trained: exit 2 naming the file and the key, nothing written; and export
    refuses the same folders."""
    hf = tmp_path / "hf"
    export(ringscan, tiny_run, hf)
    edit_config(hf, edit)
    r = run([ringscan, "train", ROOT / "configs/tiny-cpu.yaml", *TINY, "--set", f"data.path={recall_tok}",
             "--set", "train.steps=1", "--set", f"run.out_dir={tmp_path / 'run'}", "--set", f"model.init_from={hf}"])
    assert r.returncode == 2, r.stdout[-1000:] + r.stderr
    assert f"{hf}/config.json" in r.stderr and "model.init_from" in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)
    assert not (tmp_path / "run").exists()
    if name not in ("layer-types", "hidden-size", "rope-theta", "partial-rotary", "rms-norm-eps", "tie"):
        r = export(ringscan, hf, tmp_path / "out", ok=False)  # a folder's own values: export has no config to differ
        assert r.returncode == 2 and f"{hf}/config.json" in r.stderr, r.stderr
        assert not (tmp_path / "out").exists()


def test_hf_check_against_the_reference(ringscan, tiny_run, recall_tok, tmp_path):
    """tests/parity/hf_check.py end to end with ref_model.py standing in for transformers (the device suite's
    part `hf` runs transformers): the export read back by ringscan's import and by a PyTorch model of the HF
    layout gives the same loss and gradients, mixers x30, single and document-packed batches; and a wrong
    GDN layout in the reference's copy fails the check."""
    pytest.importorskip("torch")
    check = [sys.executable, ROOT / "tests/parity/hf_check.py", tiny_run, recall_tok, tmp_path, "--impl", "ref",
             "--seq-len", "128", "--scale", "30", "--top", "0"]
    r = run(check)
    assert r.returncode == 0 and "hf_check: PASS" in r.stdout, r.stdout + r.stderr
    assert r.stdout.count(": ok") == 2 and "x30 packed" in r.stdout and "x30 single" in r.stdout
    r = run(check + ["--break", "swap-v-heads"])
    assert r.returncode == 1 and r.stdout.count("tensors: FAIL") == 2 and "hf_check: FAIL" in r.stdout, r.stdout + r.stderr
