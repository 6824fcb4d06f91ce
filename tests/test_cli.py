"""test_cli.py — the command line: help, version (`submit` is tested against real Slurm in test_slurm.py,
`export` in test_hf.py), and the schema-generated outputs (dump, docs, --help) staying in
step with the schema and loading back."""
import re

import pytest

from conftest import ROOT, run

def schema_keys(ringscan):
    r = run([ringscan, "config", "dump"])
    assert r.returncode == 0
    keys, section = [], None
    for line in r.stdout.splitlines():
        if re.match(r"^[a-z_]+:$", line):
            section = line[:-1]
        m = re.match(r"^  ([a-z_A-Z0-9]+): ", line)
        if m:
            keys.append(f"{section}.{m.group(1)}")
    return keys


def test_help(ringscan):
    r = run([ringscan, "--help"])
    assert r.returncode == 0
    for sub in ["train", "resume", "plan", "submit", "bench", "data", "export", "eval", "plot", "config", "version"]:
        assert re.search(rf"^  {sub} ", r.stdout, re.M), sub
    assert run([ringscan]).returncode == 2
    r = run([ringscan, "frobnicate"])
    assert r.returncode == 2 and "unknown subcommand 'frobnicate'" in r.stderr


def test_version(ringscan):
    r = run([ringscan, "version"])
    assert r.returncode == 0
    for s in ("ringscan 0.", "libyaml", "jansson", "MPI", "backends   cpu"):
        assert s in r.stdout


def test_dump_has_every_section_and_loads_back(ringscan, tmp_path):
    keys = schema_keys(ringscan)
    assert len(keys) >= 60
    for k in ("run.out_dir", "run.stop_after_step", "train.steps", "data.seq_len", "parallel.dp", "parallel.cp",
              "checkpoint.activations", "device.kind", "device.memory_gib", "slurm.partition", "slurm.account",
              "slurm.nodes", "slurm.gpus_per_node", "slurm.time", "slurm.signal_s", "slurm.max_restarts",
              "slurm.launcher", "slurm.srun_mpi", "slurm.site_env"):
        assert k in keys, k
    for sec in ("run", "model", "data", "parallel", "train", "checkpoint", "slurm", "device"):
        assert any(k.startswith(sec + ".") for k in keys), sec
    dump = run([ringscan, "config", "dump"]).stdout
    (tmp_path / "dump.yaml").write_text(dump)
    r = run([ringscan, "config", "check", "dump.yaml"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_show_round_trips(ringscan, tmp_path):
    r = run([ringscan, "config", "show", "configs/hybrid-1b-1m-h200x4.yaml", "--set", "train.lr=1e-4"])
    assert r.returncode == 0, r.stderr
    (tmp_path / "resolved.yaml").write_text(r.stdout)
    r2 = run([ringscan, "config", "show", "resolved.yaml"], cwd=tmp_path)
    assert r2.returncode == 0 and r2.stdout == r.stdout
    assert "  lr: 0.0001\n" in r.stdout


def test_help_lists_every_key(ringscan):
    r = run([ringscan, "plan", "--help"])
    assert r.returncode == 0
    for k in schema_keys(ringscan):
        assert f"  {k} " in r.stdout, k


def test_docs_are_generated_from_the_schema(ringscan):
    r = run([ringscan, "config", "docs"])
    assert r.returncode == 0
    on_disk = (ROOT / "docs" / "config.md").read_text()
    assert on_disk == r.stdout, "docs/config.md is stale: run `build/ringscan config docs > docs/config.md`"
    for k in schema_keys(ringscan):
        assert f"`{k}`" in r.stdout


def test_resolved_table_names_the_source(ringscan):
    r = run([ringscan, "config", "check", "configs/tiny-cpu.yaml", "--set", "train.steps=70"])
    assert r.returncode == 0
    assert re.search(r"\| train\.steps +\| 70 +\| --set #1 +\|", r.stdout)
    assert re.search(r"\| model\.hidden_size +\| 256 +\| configs/tiny-cpu\.yaml:\d+:3 +\|", r.stdout)
    assert re.search(r"\| train\.beta1 +\| 0\.9 +\| default +\|", r.stdout)


def test_unknown_option(ringscan):
    r = run([ringscan, "plan", "configs/tiny-cpu.yaml", "--frob"])
    assert r.returncode == 2 and "unknown option: --frob" in r.stderr
