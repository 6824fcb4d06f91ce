"""test_fuzz.py — a bounded libFuzzer run of the config loader.

build/fuzz_config (clang, -fsanitize=fuzzer,address,undefined) is seeded with
the shipped configs and a dictionary of every key name and enum value, and runs
for a fixed time; any crash, leak, out-of-bounds access or undefined behaviour
fails the test (libFuzzer exits non-zero and writes a crash-* file)."""
import os
import re

from conftest import BUILD, ROOT, run

FUZZ_SECONDS = int(os.environ.get("RINGSCAN_FUZZ_SECONDS", "25"))


def test_fuzz_config_loader(ringscan, tmp_path):
    fuzzer = BUILD / "fuzz_config"
    assert fuzzer.exists(), "run `make fuzz` (make test builds it)"
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for p in (ROOT / "configs").glob("*.yaml"):
        (corpus / p.name).write_bytes(p.read_bytes())
    dump = run([ringscan, "config", "dump"]).stdout
    words = set()
    for line in dump.splitlines():
        m = re.match(r"^\s*([a-z_A-Z0-9]+):", line)
        if m:
            words.add(m.group(1))
        words.update(re.findall(r"\b[a-z_]+_attention\b|\bremat\b|\bcosine\b|\bmegatron\b|\bcuda\b", line))
    (tmp_path / "keys.dict").write_text("".join(f'"{w}"\n' for w in sorted(words)) + '"---"\n"&a"\n"*a"\n"[]"\n"{}"\n')
    r = run([fuzzer, f"-max_total_time={FUZZ_SECONDS}", "-seed=1", "-rss_limit_mb=2048", "-max_len=4096",
             f"-dict={tmp_path / 'keys.dict'}", f"-artifact_prefix={tmp_path}/", str(corpus)],
            cwd=tmp_path, timeout=FUZZ_SECONDS + 120)
    crashes = list(tmp_path.glob("crash-*")) + list(tmp_path.glob("leak-*")) + list(tmp_path.glob("timeout-*"))
    assert r.returncode == 0 and not crashes, r.stderr[-4000:]
    assert "Done" in r.stderr  # libFuzzer's final line: "Done N runs in S second(s)"
