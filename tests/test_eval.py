"""test_eval.py — `ringscan eval`: held-out loss and loss by context bucket, the JSON it writes, the same
numbers under cp 2 and dp 2 as on one rank (within fp32 rounding), and bad input."""
import json
import math

import pytest

from conftest import run
from test_hf import train


@pytest.fixture(scope="module")
def eval_setup(ringscan, recall_tok, tmp_path_factory):
    d = tmp_path_factory.mktemp("eval")
    r = run([ringscan, "data", "synth", d / "held.tok", "--tokens", "40000", "--seed", "11"])
    assert r.returncode == 0, r.stderr
    return train(ringscan, recall_tok, d / "run", steps=3), d / "held.tok"


def evaluate(ringscan, run_dir, data, out, np_=1, sets=(), tokens=2048):
    cmd = [ringscan, "eval", run_dir, "--data", data, "--out", out, "--tokens", tokens]
    for s in sets:
        cmd += ["--set", s]
    if np_ > 1:
        cmd = ["mpirun", "-np", np_, "--oversubscribe"] + cmd
    r = run(cmd)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(out.read_text()), r.stdout


def test_eval_json(ringscan, eval_setup, tmp_path):
    run_dir, data = eval_setup
    e, out = evaluate(ringscan, run_dir, data, tmp_path / "e.json")
    assert e["format"] == "ringscan-eval" and e["step"] == 3 and e["seq_len"] == 128 and e["samples"] == 16
    assert e["tokens"] == 2048 and e["world"] == {"dp": 1, "cp": 1} and e["backend"] == "cpu"
    b = e["buckets"]
    assert b[0]["from"] == 0 and b[0]["to"] == 1 and all(x["to"] == 2 * x["from"] for x in b[1:])
    assert b[-1]["from"] == 64 and b[-1]["to"] == 128  # contexts up to seq_len - 1
    assert sum(x["tokens"] for x in b) == e["predicted_tokens"] < 2048
    mean = sum(x["loss"] * x["tokens"] for x in b) / e["predicted_tokens"]
    assert abs(mean - e["loss"]) < 1e-9 and abs(math.exp(e["loss"]) - e["perplexity"]) < 1e-6 * e["perplexity"]
    assert 1.0 < e["loss"] < 6.0 and len({round(x["loss"], 6) for x in b}) == len(b)
    assert "loss %.6f" % e["loss"] in out and "[64, 128)" in out
    # the default output is RUN_DIR/eval.json, where `ringscan plot` looks
    r = run([ringscan, "eval", run_dir, "--data", data, "--tokens", "256"])
    assert r.returncode == 0 and json.loads((run_dir / "eval.json").read_text())["samples"] == 2, r.stderr


@pytest.mark.parametrize("layout", [["parallel.cp=2"], ["parallel.dp=2", "data.micro_batch=1"]])
def test_eval_layouts_agree(ringscan, eval_setup, tmp_path, layout):
    run_dir, data = eval_setup
    base = ["data.seq_len=256"]  # eval at twice the trained context (and cp 2 needs 2 x 2 x 64)
    one, _ = evaluate(ringscan, run_dir, data, tmp_path / "one.json", sets=base)
    two, _ = evaluate(ringscan, run_dir, data, tmp_path / "two.json", np_=2, sets=base + layout)
    assert one["seq_len"] == 256 and one["buckets"][-1]["to"] == 256
    assert two["world"] != one["world"] and two["predicted_tokens"] == one["predicted_tokens"]
    assert abs(two["loss"] - one["loss"]) <= 1e-5 * one["loss"], (one["loss"], two["loss"])
    for a, b in zip(one["buckets"], two["buckets"]):
        assert (a["from"], a["tokens"]) == (b["from"], b["tokens"])
        assert abs(a["loss"] - b["loss"]) <= 2e-5 * a["loss"], (a, b)


def test_eval_bad_input(ringscan, eval_setup, tmp_path):
    run_dir, data = eval_setup
    out = tmp_path / "e.json"
    r = run([ringscan, "eval", run_dir, "--data", tmp_path / "missing.tok", "--out", out])
    assert r.returncode == 2 and "missing.tok" in r.stderr and not out.exists(), r.stderr
    r = run([ringscan, "eval", tmp_path, "--data", data, "--out", out])
    assert r.returncode == 2 and "neither a ringscan run directory" in r.stderr and not out.exists()
    r = run([ringscan, "eval", run_dir, "--data", data, "--out", out, "--set", "data.micro_batch=1000"])
    assert r.returncode == 2 and "needs more" in r.stderr and not out.exists(), r.stderr
    r = run([ringscan, "eval", run_dir, "--data", data, "--out", out, "--set", "parallel.cp=2"])
    assert r.returncode == 2 and not out.exists()  # 2 ranks wanted, 1 launched
    r = run([ringscan, "eval", run_dir])
    assert r.returncode == 2 and "--data" in r.stderr
