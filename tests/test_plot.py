"""test_plot.py — `ringscan plot`: a PNG of a run's steps (and of eval.json when present) that decodes to
an image of the right size with real content, and clear errors on a directory that is not a run."""
import json
import struct
import zlib

from conftest import run
from test_hf import ROOT, TINY, train


def png_pixels(path):
    """(width, height, channels, decompressed scanlines) of a PNG, read with the standard library."""
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, ihdr = 8, b"", None
    while pos < len(raw):
        (n,) = struct.unpack(">I", raw[pos:pos + 4])
        kind, body = raw[pos + 4:pos + 8], raw[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, color = ihdr[:4]
    channels = {2: 3, 6: 4, 0: 1, 4: 2}[color]
    assert depth == 8
    return w, h, channels, zlib.decompress(idat)


def test_plot_png(ringscan, recall_tok, tmp_path):
    run_dir = train(ringscan, recall_tok, tmp_path / "run", steps=4)
    r = run([ringscan, "plot", run_dir])
    assert r.returncode == 0 and "plot.png" in r.stdout, r.stderr
    w, h, c, data = png_pixels(run_dir / "plot.png")
    assert (w, h) == (1200, 800) and len(data) == h * (1 + w * c)
    rows = {data[i * (1 + w * c) + 1:(i + 1) * (1 + w * c)] for i in range(h)}
    assert len(rows) > 200 and len(set(data)) > 50  # lines, labels and grids, not a blank canvas
    # with eval.json a fifth panel: a taller image
    (run_dir / "eval.json").write_text(json.dumps({"step": 4, "loss": 3.0, "buckets": [
        {"from": 0, "to": 1, "tokens": 5, "loss": 4.0}, {"from": 1, "to": 2, "tokens": 5, "loss": 3.5},
        {"from": 64, "to": 128, "tokens": 50, "loss": 2.5}]}))
    r = run([ringscan, "plot", run_dir, "--out", tmp_path / "p.png"])
    assert r.returncode == 0, r.stderr
    assert png_pixels(tmp_path / "p.png")[:2] == (1200, 1150)
    assert not list(tmp_path.glob("*.tmp.*")) and not list(run_dir.glob("*.tmp.*"))


def test_plot_errors(ringscan, tmp_path):
    r = run([ringscan, "plot", tmp_path])
    assert r.returncode == 2 and "not a run directory" in r.stderr and "metrics.jsonl" in r.stderr
    (tmp_path / "metrics.jsonl").write_text("")
    r = run([ringscan, "plot", tmp_path])
    assert r.returncode == 2 and "no step yet" in r.stderr
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\nnot json\n')
    r = run([ringscan, "plot", tmp_path])
    assert r.returncode == 2 and "metrics.jsonl:2" in r.stderr
    assert not (tmp_path / "plot.png").exists()


def test_plot_and_eval_leave_the_run_resumable(ringscan, recall_tok, tmp_path):
    """eval.json and plot.png are ringscan's own names in a run directory: a run plotted and evaluated
    mid-way (after a checkpoint) resumes; `train` into it points to `resume` (not to files "ringscan did not
    write"); a file ringscan does not write is still named."""
    run_dir = train(ringscan, recall_tok, tmp_path / "run", steps=4, extra=("--set", "checkpoint.every=2"))
    assert run([ringscan, "plot", run_dir]).returncode == 0
    r = run([ringscan, "eval", run_dir, "--data", recall_tok, "--tokens", "512"])
    assert r.returncode == 0 and (run_dir / "eval.json").exists(), r.stdout + r.stderr
    r = run([ringscan, "resume", run_dir, "--set", "train.steps=6"])
    assert r.returncode == 0 and "done: 6 steps" in r.stdout, r.stdout[-2000:] + r.stderr
    r = run([ringscan, "train", ROOT / "configs/tiny-cpu.yaml", *TINY, "--set", f"data.path={recall_tok}",
             "--set", "train.steps=8", "--set", f"run.out_dir={run_dir}"])
    assert r.returncode == 2 and "ringscan resume" in r.stderr and "did not write" not in r.stderr, r.stderr
    (run_dir / "notes.txt").write_text("mine")
    r = run([ringscan, "train", ROOT / "configs/tiny-cpu.yaml", *TINY, "--set", f"data.path={recall_tok}",
             "--set", "train.steps=8", "--set", f"run.out_dir={run_dir}"])
    assert r.returncode == 2 and "did not write (notes.txt)" in r.stderr, r.stderr

