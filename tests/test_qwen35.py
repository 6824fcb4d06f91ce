"""test_qwen35.py — Qwen3.5 dense checkpoints in and out (issue 36, the cpu part): `ringscan export
--format qwen3_5` (a Qwen3_5ForCausalLM folder) and model.init_from / export of Qwen3.5 folders, text-only
(model_type qwen3_5_text) and composite (qwen3_5: the language model under model.language_model.*, the
vision tower model.visual.* and the MTP layer mtp.* left aside and said so), fp32 and bf16, sharded with
an index, tied embeddings; and each bad input refused before anything is written.

The Qwen3.5 folders are written here, without transformers: tests/parity/ref_model.py's next_to_qwen3_5
cuts a Qwen3-Next export's grouped in_proj_qkvz / in_proj_ba into Qwen3.5's four plain projections (the
split transformers' Qwen3_5GatedDeltaNet makes), and config.json is written as transformers saves it
(rope keys only in rope_parameters, with mrope_section). The loss against a PyTorch model of those names
is tests/parity/hf_check.py --format qwen3_5 --impl ref; against transformers itself,
tests/parity/qwen35_check.py on the GPU machine (tests/cuda/gpu_regress.sh part `qwen35`)."""
import json
import struct
import sys

import numpy as np
import pytest

from conftest import ROOT, run
from test_hf import FROZEN, TINY, bf16_round, export, header, latest_model, tensors, train

sys.path.insert(0, str(ROOT / "tests" / "parity"))
import safetensors_io as st  # noqa: E402

torch = pytest.importorskip("torch")
import ref_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny_run(ringscan, recall_tok, tmp_path_factory):
    return train(ringscan, recall_tok, tmp_path_factory.mktemp("q35") / "run")


@pytest.fixture(scope="module")
def next_folder(ringscan, tiny_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("q35next") / "hf"
    export(ringscan, tiny_run, out)
    return out


def text_config(next_cfg, dtype="float32"):
    """config.json of a Qwen3_5ForCausalLM with the model of a Qwen3-Next export, as transformers saves it."""
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
            "linear_value_head_dim", "linear_conv_kernel_dim", "full_attention_interval", "layer_types",
            "rms_norm_eps", "tie_word_embeddings", "hidden_act", "attention_bias", "max_position_embeddings")
    c = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", **{k: next_cfg[k] for k in keep}}
    pairs = int(next_cfg["head_dim"] * next_cfg["partial_rotary_factor"]) // 2
    c.update(attn_output_gate=True, mtp_num_hidden_layers=1, mlp_only_layers=[], dtype=dtype,
             rope_parameters={"rope_type": "default", "rope_theta": next_cfg["rope_theta"],
                              "partial_rotary_factor": next_cfg["partial_rotary_factor"],
                              "mrope_section": [(pairs + 2) // 3, (pairs + 1) // 3, pairs // 3],
                              "mrope_interleaved": True})
    return c


def composite_config(text):
    t = dict(text, model_type="qwen3_5_text")
    t.pop("architectures")
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": t,
            "vision_config": {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 16, "num_heads": 2,
                              "out_hidden_size": text["hidden_size"]},
            "tie_word_embeddings": text["tie_word_embeddings"], "image_token_id": 248056}


EXTRA_MTP = {"mtp.fc.weight": np.ones((4, 4), np.float32), "mtp.norm.weight": np.zeros(4, np.float32)}
EXTRA_VISUAL = {"model.visual.patch_embed.proj.weight": np.ones((16, 12), np.float32),
                "model.visual.blocks.0.attn.qkv.weight": np.ones((48, 16), np.float32)}


def write_folder(folder, ts, cfg, bf16=False, shards=1):
    """config.json and the tensors: model.safetensors, or `shards` files with model.safetensors.index.json."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    names = list(ts)
    if shards == 1:
        st.save(folder / "model.safetensors", ts, {"format": "pt"}, bf16=bf16)
        return folder
    wmap = {}
    for s in range(shards):
        part = names[s * len(names) // shards:(s + 1) * len(names) // shards]
        f = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        st.save(folder / f, {k: ts[k] for k in part}, {"format": "pt"}, bf16=bf16)
        wmap.update({k: f for k in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    return folder


def qwen35_tensors(next_folder):
    cfg = json.loads((next_folder / "config.json").read_text())
    return ref_model.next_to_qwen3_5(st.load(next_folder / "model.safetensors"), ref_model.ModelConfig.from_mapping(cfg))


def composite_tensors(ts):
    out = {("model.language_model." + k[6:] if k.startswith("model.") else k): v for k, v in ts.items()}
    return {**out, **EXTRA_VISUAL, **EXTRA_MTP}


def test_export_qwen3_5(ringscan, tiny_run, next_folder, tmp_path):
    """export --format qwen3_5: a Qwen3_5ForCausalLM folder whose tensors are the Qwen3-Next export's cut as
    transformers cuts them (ref_model.next_to_qwen3_5), bitwise; and back through the import, bitwise."""
    out = tmp_path / "q35"
    r = export(ringscan, tiny_run, out, "--format", "qwen3_5")
    assert "(qwen3_5)" in r.stdout, r.stdout
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5ForCausalLM"] and cfg["model_type"] == "qwen3_5_text"
    assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                      "mrope_section": [3, 3, 2], "mrope_interleaved": True}
    assert "rope_theta" not in cfg and "num_experts" not in cfg and cfg["attn_output_gate"] is True
    rcfg = ref_model.ModelConfig.from_mapping(cfg)
    h = header(out / "model.safetensors")
    h.pop("__metadata__")
    assert {k: tuple(v["shape"]) for k, v in h.items()} == ref_model.hf_shapes(rcfg, "qwen3_5")
    want, got = qwen35_tensors(next_folder), st.load(out / "model.safetensors")
    assert set(want) == set(got)
    for k in want:
        assert np.array_equal(want[k], got[k]), k
    again = tmp_path / "again"
    export(ringscan, out, again, "--format", "qwen3_5")
    assert (again / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    back = tmp_path / "back"
    export(ringscan, out, back)  # Qwen3.5 folder -> Qwen3-Next folder: the original export's bytes
    assert (back / "model.safetensors").read_bytes() == (next_folder / "model.safetensors").read_bytes()


def first_loss(run_dir):
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])["loss"]


def init_run(ringscan, recall_tok, src, out, extra=()):
    r = run([ringscan, "train", ROOT / "configs/tiny-cpu.yaml", *TINY, *FROZEN, "--set", f"data.path={recall_tok}",
             "--set", "train.steps=1", "--set", f"run.out_dir={out}", "--set", f"model.init_from={src}", *extra])
    return r


def test_init_from_qwen3_5_text_and_composite(ringscan, recall_tok, tiny_run, next_folder, tmp_path):
    """model.init_from of a text-only folder (fp32, one file), the composite folder (fp32, 3 shards with an
    index, the vision tower and the MTP layer beside the language model) and a bf16 text folder (2 shards):
    the runs start from the source's weights exactly (bf16: its rounding), the text-only and composite
    runs give the same loss bitwise, and the composite's left-aside tensors are named."""
    ts = qwen35_tensors(next_folder)
    tcfg = text_config(json.loads((next_folder / "config.json").read_text()))
    folders = {
        "text": write_folder(tmp_path / "text", {**ts, **EXTRA_MTP}, tcfg),
        "composite": write_folder(tmp_path / "composite", composite_tensors(ts), composite_config(tcfg), shards=3),
        "bf16": write_folder(tmp_path / "bf16", ts, dict(tcfg, dtype="bfloat16"), bf16=True, shards=2),
    }
    src = st.load(latest_model(tiny_run))
    losses = {}
    for name, folder in folders.items():
        out = tmp_path / f"run-{name}"
        r = init_run(ringscan, recall_tok, folder, out)
        assert r.returncode == 0, (name, r.stdout[-1500:], r.stderr)
        if name == "composite":
            assert "left aside 2 tensors of model.visual.* (the vision tower" in r.stdout, r.stdout
            assert "and 2 tensors of mtp.* (the multi-token-prediction layer" in r.stdout, r.stdout
        if name == "text":
            assert "left aside 2 tensors of mtp.*" in r.stdout and "model.visual" not in r.stdout, r.stdout
        got = st.load(latest_model(out))
        for k in src:  # lr 0: the run's checkpoint holds the imported weights
            want = bf16_round(src[k]) if name == "bf16" else src[k]
            assert np.array_equal(want, got[k]), (name, k)
        losses[name] = first_loss(out)
    assert losses["text"] == losses["composite"], losses
    # the composite folder exported as a text-only Qwen3.5 folder: the language model only, bitwise
    e = tmp_path / "from-composite"
    r = export(ringscan, folders["composite"], e, "--format", "qwen3_5")
    assert "left aside 2 tensors of model.visual.*" in r.stdout, r.stdout
    got = st.load(e / "model.safetensors")
    assert set(got) == set(ts) and all(np.array_equal(got[k], ts[k]) for k in ts)
    # bf16 source exported in bf16: the same bits again
    b = tmp_path / "bf16-again"
    export(ringscan, folders["bf16"], b, "--format", "qwen3_5", "--dtype", "bf16")
    assert {k: v for k, (_, v) in tensors(b).items()}.keys() == ts.keys()
    for k, (dt, v) in tensors(b).items():
        assert dt == "BF16" and np.array_equal(v, bf16_round(ts[k])), k


def test_qwen3_5_tied_embeddings(ringscan, recall_tok, tmp_path):
    """Tied embeddings: no lm_head in the folder; the import and export round trip; a composite folder
    whose two tie_word_embeddings disagree is refused."""
    tied = train(ringscan, recall_tok, tmp_path / "tied", steps=1, extra=["--set", "model.tie_word_embeddings=true"])
    q = tmp_path / "q35"
    export(ringscan, tied, q, "--format", "qwen3_5")
    cfg = json.loads((q / "config.json").read_text())
    ts = st.load(q / "model.safetensors")
    assert cfg["tie_word_embeddings"] is True and "lm_head.weight" not in ts
    tie = ["--set", "model.tie_word_embeddings=true"]
    r = init_run(ringscan, recall_tok, q, tmp_path / "run", tie)
    assert r.returncode == 0, r.stderr
    src, got = st.load(latest_model(tied)), st.load(latest_model(tmp_path / "run"))
    assert set(src) == set(got) and all(np.array_equal(src[k], got[k]) for k in src)
    comp = composite_config(cfg)
    comp["text_config"]["tie_word_embeddings"] = False
    c = write_folder(tmp_path / "composite", composite_tensors(ts), comp)
    r = init_run(ringscan, recall_tok, c, tmp_path / "run2", tie)
    assert r.returncode == 2 and "text_config.tie_word_embeddings is false" in r.stderr, r.stderr
    assert not (tmp_path / "run2").exists()


def lying_header(folder):
    """model.safetensors whose header gives one tensor a shape larger than its bytes."""
    p = folder / "model.safetensors"
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n])
    h["model.norm.weight"]["shape"] = [h["model.norm.weight"]["shape"][0] * 2]
    text = json.dumps(h, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    p.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


def _cfg(fn):
    def edit(folder):
        cfg = json.loads((folder / "config.json").read_text())
        fn(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))
    return edit


def _tensors(fn):
    def edit(folder):
        ts = st.load(folder / "model.safetensors")
        fn(ts)
        st.save(folder / "model.safetensors", ts, {"format": "pt"})
    return edit


def _nan(ts):
    a = ts["model.layers.0.linear_attn.in_proj_z.weight"].copy()
    a[3, 5] = np.nan
    ts["model.layers.0.linear_attn.in_proj_z.weight"] = a


BAD = [  # (name, edit of the text-only fp32 folder, extra --set, words of the message)
    ("moe-type", _cfg(lambda c: c.update(model_type="qwen3_5_moe_text")), [], ["qwen3_5_moe_text", "mixture-of-experts"]),
    ("num-experts", _cfg(lambda c: c.update(num_experts=8)), [], ["num_experts is 8", "mixture-of-experts"]),
    ("shape", _tensors(lambda t: t.update({"model.layers.0.linear_attn.in_proj_z.weight":
                                           t["model.layers.0.linear_attn.in_proj_z.weight"][:128]})), [],
     ["tensor model.layers.0.linear_attn.in_proj_z.weight in", "has shape [128, 256]", "[256, 256]"]),
    ("missing", _tensors(lambda t: t.pop("model.layers.1.linear_attn.in_proj_b.weight")), [],
     ["no tensor model.layers.1.linear_attn.in_proj_b.weight"]),
    ("extra", _tensors(lambda t: t.update({"model.layers.0.mlp.experts.0.up_proj.weight": np.ones((4, 4), np.float32)})),
     [], ["tensor model.layers.0.mlp.experts.0.up_proj.weight in", "not part of the qwen3_5 model"]),
    ("qwen3-next-names", _tensors(lambda t: t.update({"model.layers.0.linear_attn.in_proj_ba.weight":
                                                      np.ones((8, 256), np.float32)})), [],
     ["in_proj_ba.weight", "not part of the qwen3_5 model"]),
    ("vocab", _cfg(lambda c: c.update(vocab_size=512)), [], ["config.json has vocab_size = 512",
                                                             "model.vocab_size = 256"]),
    ("vocab-of-the-data", None, ["--set", "model.vocab_size=128"], ["vocab_size", "128"]),
    ("nan", _tensors(_nan), [], ["in_proj_z.weight", "not finite", "element 773"]),
    ("header", lying_header, [], ["model.safetensors", "model.norm.weight"]),
    ("mrope-yarn", _cfg(lambda c: c["rope_parameters"].update(rope_type="yarn")), [], ["rope_type is \"yarn\""]),
    ("no-gate", _cfg(lambda c: c.update(attn_output_gate=False)), [], ["attn_output_gate is not true"]),
]


@pytest.mark.parametrize("name,edit,sets,words", BAD, ids=[b[0] for b in BAD])
def test_qwen3_5_bad_input_refused(ringscan, recall_tok, next_folder, tmp_path, name, edit, sets, words):
    """Each bad Qwen3.5 folder: model.init_from exits 2 with one message naming the file or tensor and the
    reason, before anything is written (no run directory); export refuses what it can see without a
    training config the same way (nothing written)."""
    tcfg = text_config(json.loads((next_folder / "config.json").read_text()))
    folder = write_folder(tmp_path / "q35", qwen35_tensors(next_folder), tcfg)
    if edit:
        edit(folder)
    r = init_run(ringscan, recall_tok, folder, tmp_path / "run", sets)
    assert r.returncode == 2, (r.stdout[-1000:], r.stderr)
    for w in words:
        assert w in r.stderr, (w, r.stderr)
    assert not (tmp_path / "run").exists(), "nothing may be written on a refused import"
    if name not in ("vocab", "vocab-of-the-data"):  # the folder alone is consistent there
        r = export(ringscan, folder, tmp_path / "out", ok=False)
        assert r.returncode == 2, r.stdout + r.stderr
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob("out.tmp.*"))


def test_qwen3_5_against_the_reference(ringscan, tiny_run, recall_tok, tmp_path):
    """hf_check.py --format qwen3_5 with ref_model.py reading the Qwen3.5 names (written from transformers'
    Qwen3_5GatedDeltaNet): ringscan's import of the exported Qwen3.5 folder gives the reference's loss and
    gradients (mixers x30, single and document-packed batches); the rows of value head 0 exchanged between
    in_proj_qkv and in_proj_z, or the rotary dims doubled, in the reference's copy fail the check."""
    check = [sys.executable, ROOT / "tests/parity/hf_check.py", tiny_run, recall_tok, tmp_path, "--impl", "ref",
             "--format", "qwen3_5", "--seq-len", "128", "--scale", "30", "--top", "0"]
    r = run(check)
    assert r.returncode == 0 and "hf_check: PASS (ref, qwen3_5)" in r.stdout, r.stdout + r.stderr
    assert r.stdout.count(": ok") == 2
    for brk in ("swap-z-qkv", "rope-dims"):
        r = run(check + ["--break", brk])
        assert r.returncode == 1 and "hf_check: FAIL" in r.stdout, (brk, r.stdout + r.stderr)
        assert r.stdout.count("tensors: FAIL") == 2, (brk, r.stdout)


def test_qwen35_check_plumbing(tmp_path):
    """tests/parity/qwen35_check.py (the GPU machine's proof against transformers) with ref_model.py standing
    in for transformers, on cpu: every check of its flow runs and passes — folders saved fp32 sharded, bf16 and
    composite, loss and gradients against the reference, composite == text bitwise, export back with equal
    logits — and each deliberately wrong layout (z <-> qkv rows, value heads, rotary dims) fails its
    comparison, as it must."""
    r = run([sys.executable, ROOT / "tests/parity/qwen35_check.py", tmp_path, "--impl", "ref", "--devices", "cpu",
             "--seq-len", "128"], timeout=900)
    assert r.returncode == 0 and "qwen35_check: PASS (18 checks, 0 failed, 1 skipped)" in r.stdout, r.stdout + r.stderr
    assert r.stdout.count("PASS  broken") == 3 and r.stdout.count("PASS  grads") == 4, r.stdout
    assert "left aside 1 tensors of model.visual.*" in r.stdout, r.stdout
