"""test_init.py — the initial weights are the documented streams whatever the host's threads do.

model_init_weights (lib/model/model.c) fills the buffer in pieces on the host's threads, each piece's
stream skipped ahead to its first element. Here a run whose embedding (20,000 x 256 = 5.12M elements)
spans two pieces trains one step at lr 0 (the checkpoint holds the initial weights), is exported, and
its embedding must equal, bitwise, N(0, 0.02) drawn from tensor 0's SplitMix64 stream by Box-Muller
(lib/core/rng.h), element after element as one stream, reimplemented here.
"""
import sys

import numpy as np

from conftest import ROOT, run

sys.path.insert(0, str(ROOT / "tests" / "parity"))
import safetensors_io  # noqa: E402
from test_data import Rng  # noqa: E402  (lib/core/rng.h in Python, one draw at a time)

GAMMA = np.uint64(0x9E3779B97F4A7C15)


def mix(z):
    """rng_mix over a numpy uint64 array (test_data.mix takes one Python int)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def normal_stream(seed, stream, n):
    """n values of rng_normal from rng_init(seed, stream): two draws each (the stream's start from test_data's
    Rng, its draws here in numpy, vectorised)."""
    with np.errstate(over="ignore"):
        s0 = np.uint64(Rng(seed, stream).s)
        draws = mix(s0 + np.arange(1, 2 * n + 1, dtype=np.uint64) * GAMMA)
    u = ((draws >> np.uint64(11)).astype(np.float64) + 0.5) / 9007199254740992.0
    return np.sqrt(-2.0 * np.log(u[0::2])) * np.cos(6.283185307179586476925 * u[1::2])


def test_initial_embedding_is_one_stream(ringscan, recall_tok, tmp_path):
    out = tmp_path / "run"
    r = run([ringscan, "train", ROOT / "configs/tiny-cpu.yaml", "--set", f"data.path={recall_tok}",
             "--set", "model.vocab_size=20000", "--set", "parallel.cp=1", "--set", "train.steps=1",
             "--set", "train.warmup_steps=0", "--set", "train.lr=0", "--set", "train.min_lr=0",
             "--set", "checkpoint.every=1", "--set", "run.seed=1234", "--set", f"run.out_dir={out}"])
    assert r.returncode == 0, r.stdout + r.stderr
    r = run([ringscan, "export", out, tmp_path / "hf", "--dtype", "fp32"])
    assert r.returncode == 0, r.stdout + r.stderr
    got = np.asarray(safetensors_io.load(tmp_path / "hf" / "model.safetensors")["model.embed_tokens.weight"],
                     np.float32).ravel()
    want = (0.02 * normal_stream(1234, 0, got.size)).astype(np.float32)
    assert got.size == 20000 * 256
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} elements differ, first at {bad[:5]}"
