"""test_config_errors.py — every malformed config is refused with exit 2 and a
message that names the place (file:line:col, the key, the --set), and nothing
is written.

Each case is a YAML text (written to a real file), optional --set overrides,
and the substrings the error output must contain. Every case runs through both
`ringscan config check` and `ringscan plan`, since both load configs the same
way; the run directory named in the config must not appear.
"""
import pytest

from conftest import run

# (id, yaml text, extra args, substrings that must appear in stderr)
CASES = [
    # --- YAML syntax: file:line:col of the problem
    ("syntax-unclosed-flow", "model: {hidden_size: 12\n", [], ["bad.yaml:2:1", "YAML syntax error"]),
    ("syntax-tab-indent", "model:\n\thidden_size: 64\n", [], ["bad.yaml:2:1", "YAML syntax error"]),
    ("syntax-nested-colon", "model: hidden_size: 3\n", [], ["bad.yaml:1:19", "mapping values are not allowed"]),
    ("syntax-second-document", "run:\n  seed: 1\n---\nrun:\n  seed: 2\n", [], ["bad.yaml:4:1", "second YAML document"]),
    ("top-level-list", "- a\n- b\n", [], ["bad.yaml:1:1", "top level must be a mapping"]),
    ("top-level-scalar", "hello\n", [], ["bad.yaml:1:1", "top level must be a mapping"]),
    ("section-not-mapping", "model: 5\n", [], ["bad.yaml:1:1", "model is a section"]),
    ("key-is-a-list", "? [a, b]\n: 1\n", [], ["bad.yaml:1:3", "keys must be plain names"]),
    ("nesting-too-deep", "run:\n  name: x\nmodel: {a: " + "[" * 100 + "]" * 100 + "}\n", [],
     ["bad.yaml:3:75", "more than 64 nested '[' or '{'"]),
    ("nesting-in-quotes-is-text", "run:\n  name: \"" + "[" * 100 + "\"\n", [], ["bad.yaml:2:9", "run.name", "not allowed"]),
    # --- unknown keys, with a suggestion
    ("unknown-section", "modle:\n  hidden_size: 8\n", [], ["bad.yaml:1:1", "unknown key \"modle\"", "did you mean 'model'"]),
    ("unknown-key-typo", "model:\n  hiden_size: 64\n", [], ["bad.yaml:2:3", "did you mean 'model.hidden_size'"]),
    ("key-in-wrong-section", "model:\n  seq_len: 512\n", [], ["bad.yaml:2:3", "did you mean 'data.seq_len'"]),
    ("unknown-key-no-guess", "data:\n  zzzzqqq: 1\n", [], ["bad.yaml:2:3", "unknown key \"data.zzzzqqq\"", "config dump"]),
    # --- types, at the value's line:col
    ("int-got-word", "model:\n  hidden_size: abc\n", [], ["bad.yaml:2:16", "model.hidden_size", "expected an integer", "\"abc\""]),
    ("int-got-quoted", "model:\n  hidden_size: \"256\"\n", [], ["bad.yaml:2:16", "quoted, so a string"]),
    ("int-got-float", "train:\n  steps: 1.5\n", [], ["bad.yaml:2:10", "train.steps", "expected an integer"]),
    ("int-got-mapping", "model:\n  hidden_size: {a: 1}\n", [], ["bad.yaml:2:16", "got a mapping"]),
    ("int-overflow", "train:\n  steps: 99999999999999999999999\n", [], ["bad.yaml:2:10", "expected an integer"]),
    ("float-got-word", "train:\n  lr: fast\n", [], ["bad.yaml:2:7", "train.lr", "expected a finite number"]),
    ("float-nan", "train:\n  lr: .nan\n", [], ["bad.yaml:2:7", "expected a finite number"]),
    ("bool-yes", "model:\n  tie_word_embeddings: yes\n", [], ["bad.yaml:2:24", "expected true or false"]),
    ("enum-unknown", "checkpoint:\n  activations: partial\n", [],
     ["bad.yaml:2:16", "checkpoint.activations", "none | full | remat"]),
    ("enum-list-bad-item", "model:\n  num_hidden_layers: 2\n  layer_types: [linear_attention, mamba]\n", [],
     ["bad.yaml:3:16", "item 1 is \"mamba\"", "linear_attention | full_attention"]),
    ("enum-list-not-list", "model:\n  layer_types: linear_attention\n", [], ["bad.yaml:2:16", "expected a list"]),
    ("string-control-char", "run:\n  name: \"a\\x01b\"\n", [], ["bad.yaml:2:9", "expected no control characters"]),
    # --- ranges quote the value and the range
    ("range-layers-zero", "model:\n  num_hidden_layers: 0\n", [], ["bad.yaml:2:22", "= 0 is out of range [1, 1024]"]),
    ("range-beta2", "train:\n  beta2: 1.5\n", [], ["bad.yaml:2:10", "train.beta2 = 1.5 is out of range [0, 0.999999]"]),
    ("range-negative-cp", "parallel:\n  cp: -2\n", [], ["bad.yaml:2:7", "parallel.cp = -2 is out of range"]),
    ("duplicate-key", "data:\n  seq_len: 512\n  seq_len: 1024\n", [], ["bad.yaml:3:3", "given twice (first at line 2)"]),
    # checkpoint.keep_layers: an integer or auto, at most the layers, not with offload
    ("keep-layers-word", "checkpoint:\n  keep_layers: most\n", [],
     ["bad.yaml:2:16", "checkpoint.keep_layers", "expected an integer or auto", "\"most\""]),
    ("keep-layers-negative", "checkpoint:\n  keep_layers: -1\n", [],
     ["bad.yaml:2:16", "checkpoint.keep_layers = -1 is out of range"]),
    ("keep-layers-too-many", "model:\n  num_hidden_layers: 8\ncheckpoint:\n  keep_layers: 9\n", [],
     ["checkpoint.keep_layers = 9 (bad.yaml:4:3)", "model.num_hidden_layers = 8 (bad.yaml:2:3)", "at most 8"]),
    ("keep-layers-offload", "checkpoint:\n  keep_layers: auto\n  offload: host\n", [],
     ["checkpoint.keep_layers = auto (bad.yaml:2:3)", "checkpoint.offload = host (bad.yaml:3:3)"]),
    # --- cross-key rules quote both keys and values
    ("seq-not-divisible", "data:\n  seq_len: 1000\nparallel:\n  cp: 2\n", [],
     ["data.seq_len = 1000 (bad.yaml:2:3)", "parallel.cp = 2 (bad.yaml:4:3)", "= 256", "768 or 1024"]),
    ("seq-below-one-unit", "data:\n  seq_len: 64\nparallel:\n  cp: 2\n", [], ["= 256", "nearest valid: 256\n"]),
    ("value-heads-multiple", "model:\n  linear_num_key_heads: 3\n  linear_num_value_heads: 4\n", [],
     ["model.linear_num_value_heads = 4", "model.linear_num_key_heads = 3", "multiple"]),
    ("gqa-groups", "model:\n  num_attention_heads: 6\n  num_key_value_heads: 4\n", [],
     ["model.num_attention_heads = 6", "model.num_key_value_heads = 4"]),
    ("world-vs-slurm", "parallel:\n  dp: 2\n  cp: 2\nslurm:\n  nodes: 1\n  gpus_per_node: 2\n", [],
     ["slurm.nodes = 1", "slurm.gpus_per_node = 2", "parallel.dp = 2", "parallel.cp = 2", "= 4 ranks"]),
    ("layer-types-length", "model:\n  num_hidden_layers: 3\n  layer_types: [linear_attention, full_attention]\n", [],
     ["model.layer_types has 2 entries", "model.num_hidden_layers = 3"]),
    ("warmup-longer", "train:\n  steps: 10\n  warmup_steps: 20\n", [],
     ["train.warmup_steps = 20", "train.steps = 10"]),
    ("rotary-odd", "model:\n  head_dim: 64\n  partial_rotary_factor: 0.3\n", [], ["= 19 rotary dims must be even"]),
    ("attention-bias", "model:\n  attention_bias: true\n", [], ["model.attention_bias = true (bad.yaml:2:3)"]),
    ("cpu-head-dim", "model:\n  head_dim: 1024\n", [],
     ["model.head_dim = 1024 (bad.yaml:2:3)", "device.kind = cpu (default)", "up to 512"]),
    ("cpu-rows-int", "data:\n  seq_len: 2147483648\n", [], ["= 2147483648 rows per rank", "at most 2147483647"]),
    ("cuda-head-dim", "model:\n  head_dim: 96\ndevice:\n  kind: cuda\n", [],
     ["model.head_dim = 96", "device.kind = cuda"]),
    ("stop-after-last", "train:\n  steps: 10\n  warmup_steps: 1\nrun:\n  stop_after_step: 11\n", [],
     ["run.stop_after_step = 11", "train.steps = 10"]),
    ("max-positions-short", "model:\n  max_position_embeddings: 1024\ndata:\n  seq_len: 4096\n", [],
     ["model.max_position_embeddings = 1024", "data.seq_len = 4096"]),
    # --- values that would reach a Slurm script
    ("slurm-injection", "slurm:\n  partition: \"gpu; rm -rf ~\"\n", [], ["bad.yaml:2:14", "slurm.partition", "not allowed"]),
    ("slurm-bad-time", "slurm:\n  time: 1 day\n", [], ["bad.yaml:2:9", "slurm.time", "Slurm time"]),
    ("out-dir-shell", "run:\n  out_dir: \"runs/$(reboot)\"\n", [], ["bad.yaml:2:12", "run.out_dir", "not allowed"]),
    ("slurm-signal-after-limit", "slurm:\n  time: \"05:00\"\n  signal_s: 300\n", [],
     ["slurm.signal_s = 300 (bad.yaml:3:3)", "slurm.time = \"05:00\" (bad.yaml:2:3) = 300 s"]),
    ("slurm-signed-time", "slurm:\n  time: \"-5\"\n", [], ["bad.yaml:2:9", "slurm.time", "Slurm time"]),
    ("slurm-time-61-minutes", "slurm:\n  time: \"00:61:00\"\n", [], ["bad.yaml:2:9", "slurm.time", "0..59"]),
    ("slurm-time-24-hours-after-days", "slurm:\n  time: \"1-24:00\"\n", [], ["bad.yaml:2:9", "hours 0..23"]),
    ("slurm-launcher", "slurm:\n  launcher: mpiexec\n", [], ["bad.yaml:2:13", "slurm.launcher", "srun | mpirun"]),
    ("slurm-site-env-shell", "slurm:\n  site_env: \"site.env; id\"\n", [], ["bad.yaml:2:13", "slurm.site_env", "not allowed"]),
    # --- --set overrides name the override
    ("set-unknown", "", ["--set", "model.hiden_size=3"], ["--set \"model.hiden_size=3\"", "did you mean 'model.hidden_size'"]),
    ("set-bad-int", "", ["--set", "model.hidden_size=abc"], ["--set \"model.hidden_size=abc\"", "expected an integer"]),
    ("set-no-equals", "", ["--set", "model.hidden_size"], ["expected key.path=value"]),
    ("set-a-section", "", ["--set", "run=1"], ["--set \"run=1\": 'run' is a section, not a key: give a key under it, "
                                              "like run.name\n"]),
    ("set-bad-yaml", "", ["--set", "model.layer_types=[linear_attention,"], ["not a YAML value"]),
    ("set-injection", "", ["--set", "slurm.account=a`id`"], ["slurm.account", "not allowed"]),
    ("set-cross", "", ["--set", "parallel.cp=3"], ["parallel.cp = 3 (--set #1)", "data.seq_len = 4096 (default)"]),
    # --- several errors are all reported
    ("two-errors", "model:\n  hidden_size: x\n  vocab_size: y\n", [], ["bad.yaml:2:16", "bad.yaml:3:15", "2 errors"]),
]


@pytest.mark.parametrize("case_id,text,extra,expect", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("sub", ["config-check", "plan"])
def test_bad_config(ringscan, tmp_path, case_id, text, extra, expect, sub):
    # run.out_dir defaults to runs/ringscan, relative to the working directory
    out_dir = tmp_path / "runs"
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    cmd = ["config", "check"] if sub == "config-check" else ["plan"]
    r = run([ringscan, *cmd, "bad.yaml", *extra], cwd=tmp_path)
    assert r.returncode == 2, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    for s in expect:
        assert s in r.stderr, f"missing {s!r} in stderr:\n{r.stderr}"
    assert "nothing was run or written" in r.stderr or "expected key.path=value" in r.stderr
    assert not out_dir.exists()
    assert r.stdout == "", "a bad config must print nothing that looks like output"


def test_case_count():
    assert len(CASES) >= 25


def test_missing_file(ringscan, tmp_path):
    r = run([ringscan, "plan", "no-such.yaml"], cwd=tmp_path)
    assert r.returncode == 2
    assert "no-such.yaml: cannot open the config file" in r.stderr


def test_huge_file(ringscan, tmp_path):
    (tmp_path / "big.yaml").write_text("# " + "x" * (1 << 20) + "\n")
    r = run([ringscan, "config", "check", "big.yaml"], cwd=tmp_path)
    assert r.returncode == 2
    assert "larger than 1 MiB" in r.stderr


def test_empty_sections_are_fine(ringscan, tmp_path):
    (tmp_path / "ok.yaml").write_text("run:\nmodel:\n# nothing else\n")
    r = run([ringscan, "config", "check", "ok.yaml"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "ok.yaml: valid" in r.stdout


def test_anchor_cycle_is_an_error_not_a_hang(ringscan, tmp_path):
    (tmp_path / "cyc.yaml").write_text("model: &a\n  x: *a\n")
    r = run([ringscan, "config", "check", "cyc.yaml"], cwd=tmp_path, timeout=20)
    assert r.returncode == 2
    assert "unknown key" in r.stderr


def test_fifo_config_is_refused_not_waited_on(ringscan, tmp_path):
    """open() of a FIFO waits for a writer forever: the loader stats first and refuses it."""
    import os
    os.mkfifo(tmp_path / "pipe.yaml")
    r = run([ringscan, "config", "check", "pipe.yaml"], cwd=tmp_path, timeout=20)
    assert r.returncode == 2
    assert "pipe.yaml: the config file is not a regular file (it is a FIFO)" in r.stderr


def test_deep_nesting_is_refused_in_milliseconds(ringscan, tmp_path):
    """libyaml is quadratic in flow nesting: 100k nested '[' (200 KB) took 23 s to be refused. The
    loader caps the depth before libyaml sees the text."""
    import time
    (tmp_path / "deep.yaml").write_text("model: " + "[" * 100000 + "]" * 100000 + "\n")
    t0 = time.time()
    r = run([ringscan, "config", "check", "deep.yaml"], cwd=tmp_path, timeout=60)
    took = time.time() - t0
    assert r.returncode == 2
    assert "deep.yaml:1:72: more than 64 nested '[' or '{'" in r.stderr, r.stderr
    assert took < 2.0, f"{took:.1f} s"
