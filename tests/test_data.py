"""test_data.py — `ringscan data synth|bytes|check|inspect` on real files.

Files are written here from Python following docs/data-format.md (flat) and
the Megatron-LM layout verified in lib/data/data_megatron.c, then read back by the
binary; what it prints is compared with what numpy computes independently:
packed samples against a naive concatenation of the documents (in the order a
Python copy of the documented SplitMix64 shuffle gives), the synthetic task's
layout, loss floor and recall distances against a re-parse of the file, byte
tokens against the input text. Every malformed file must exit 2 with a
message that names the file and says what was expected.
"""
import math
import os
import re
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest

from conftest import run

M64 = (1 << 64) - 1


# ---- writers and readers of the two formats ----------------------------------

def write_flat(path, docs, vocab, token_bytes=None):
    tb = token_bytes or (2 if vocab <= 65536 else 4)
    lens = [len(d) for d in docs]
    starts = np.concatenate([[0], np.cumsum(lens, dtype=np.int64)]).astype("<u8")
    toks = np.concatenate([np.asarray(d, dtype=np.int64) for d in docs]) if docs else np.zeros(0, np.int64)
    with open(path, "wb") as f:
        f.write(b"RSTOKENS" + struct.pack("<IIQQQ", 1, tb, vocab, len(toks), len(docs)) + bytes(24))
        f.write(starts.tobytes())
        f.write(toks.astype("<u2" if tb == 2 else "<u4").tobytes())


def read_flat(path):
    b = open(path, "rb").read()
    assert b[:8] == b"RSTOKENS"
    version, tb, vocab, n_tokens, n_docs = struct.unpack_from("<IIQQQ", b, 8)
    assert version == 1 and b[40:64] == bytes(24)
    starts = np.frombuffer(b, "<u8", n_docs + 1, 64).astype(np.int64)
    off = 64 + 8 * (n_docs + 1)
    toks = np.frombuffer(b, "<u2" if tb == 2 else "<u4", n_tokens, off).astype(np.int64)
    assert len(b) == off + tb * n_tokens
    return vocab, starts, toks


MEG_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.float64: 6, np.float32: 7,
             np.uint16: 8}


def write_megatron(prefix, docs, dtype=np.uint16, code=None):
    """docs: list of documents, each a list of sequences (lists of ids)."""
    lengths, doc_idx, chunks = [], [0], []
    for d in docs:
        for s in d:
            lengths.append(len(s))
            chunks.append(np.asarray(s, dtype=dtype))
        doc_idx.append(len(lengths))
    item = np.dtype(dtype).itemsize
    pointers = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)[:-1] * item]) if lengths else []
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code or MEG_CODES[dtype]))
        f.write(struct.pack("<QQ", len(lengths), len(doc_idx)))
        f.write(np.asarray(lengths, "<i4").tobytes())
        f.write(np.asarray(pointers, "<i8").tobytes())
        f.write(np.asarray(doc_idx, "<i8").tobytes())
    with open(f"{prefix}.bin", "wb") as f:
        for c in chunks:
            f.write(c.astype(np.dtype(dtype).newbyteorder("<")).tobytes())


# ---- the documented generator (lib/core/rng.h), in Python ---------------------

def mix(z):
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & M64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


class Rng:
    def __init__(self, seed, stream):
        self.s = mix(seed ^ mix((stream + 0x632BE59BD9B4E019) & M64))

    def next(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & M64
        return mix(self.s)

    def below(self, b):
        limit = ((1 << 64) - b) % b
        while True:
            x = self.next()
            if x >= limit:
                return x % b


def epoch_order(n_docs, seed, epoch):
    order, r = list(range(n_docs)), Rng(seed, epoch)
    for i in range(n_docs - 1, 0, -1):
        j = r.below(i + 1)
        order[i], order[j] = order[j], order[i]
    return order


# ---- inspect output -----------------------------------------------------------

def inspect(ringscan, path, sample, seq_len, count=1, seed=None, extra=()):
    args = [ringscan, "data", "inspect", path, "--sample", sample, "--seq-len", seq_len, "--count", count, *extra]
    if seed is not None:
        args += ["--seed", seed]
    r = run(args)
    assert r.returncode == 0, r.stderr
    samples = []
    for line in r.stdout.splitlines():
        if line.startswith("sample "):
            samples.append([])
        elif re.match(r"^\s+-?\d+\s+-?\d+\s+-?\d+\s+-?\d+$", line):
            samples[-1].append([int(x) for x in line.split()])
    out = [np.array(s, dtype=np.int64) for s in samples]
    assert len(out) == count and all(s.shape == (seq_len, 4) for s in out)
    return out


def expected_samples(docs, order, T, S):
    """Naive packing: concatenate documents in `order`, slice [i*T, i*T+T]."""
    stream = np.concatenate([np.asarray(docs[d], dtype=np.int64) for d in order])
    doc_of = np.concatenate([np.full(len(docs[d]), k) for k, d in enumerate(order)])
    out = []
    for i in range(S):
        a = i * T
        tok = stream[a:a + T]
        same = doc_of[a + 1:a + T + 1] == doc_of[a:a + T]
        tgt = np.where(same, stream[a + 1:a + T + 1], -1)
        dpos = np.zeros(T, np.int64)
        for t in range(1, T):
            dpos[t] = dpos[t - 1] + 1 if doc_of[a + t] == doc_of[a + t - 1] else 0
        out.append((tok, tgt, dpos))
    return out


def check_epoch(ringscan, path, docs, T, epoch, seed):
    n_tokens = sum(len(d) for d in docs)
    S = (n_tokens - 1) // T
    got = inspect(ringscan, path, epoch * S, T, count=S, seed=seed)
    order = epoch_order(len(docs), seed, epoch) if seed is not None else list(range(len(docs)))
    want = expected_samples(docs, order, T, S)
    for i, (g, (tok, tgt, dpos)) in enumerate(zip(got, want)):
        assert (g[:, 0] == np.arange(T)).all()
        assert (g[:, 1] == tok).all(), f"sample {i}: tokens"
        assert (g[:, 2] == tgt).all(), f"sample {i}: targets"
        assert (g[:, 3] == dpos).all(), f"sample {i}: doc_pos"
    return got, order


# ---- packing and order, through `ringscan data inspect` ------------------------

@pytest.fixture
def unique_docs():
    """Documents whose tokens are their own stream-independent ids (all distinct)."""
    rng = np.random.default_rng(5)
    lens = [int(x) for x in rng.integers(1, 60, size=40)] + [1, 1, 130]
    docs, k = [], 0
    for n in lens:
        docs.append(list(range(k, k + n)))
        k += n
    return docs


@pytest.mark.parametrize("seed", [None, 7])
def test_inspect_packs_like_naive_concatenation(ringscan, tmp_path, unique_docs, seed):
    path = tmp_path / "u.tok"
    write_flat(path, unique_docs, 100000)
    n_tokens = sum(map(len, unique_docs))
    T = 32
    S = (n_tokens - 1) // T
    orders = []
    for epoch in range(3):
        got, order = check_epoch(ringscan, path, unique_docs, T, epoch, seed)
        orders.append(order)
        seen = np.concatenate([g[:, 1] for g in got])
        assert len(np.unique(seen)) == len(seen) == S * T, "a token appears twice in one epoch"
        # a document continuing from the previous sample starts this one at doc_pos 0
        assert all(g[0, 3] == 0 for g in got)
        # no prediction across a document end, and one -1 per document end inside a sample
        ends = [g for g in got if (g[:, 2] == -1).any()]
        assert ends
    if seed is None:
        assert orders[0] == orders[1] == list(range(len(unique_docs)))
    else:
        assert orders[0] != orders[1] != orders[2], "every epoch must have its own order"
        assert sorted(orders[0]) == list(range(len(unique_docs)))


def test_shuffle_reproducible_and_seeded(ringscan, tmp_path, unique_docs):
    path = tmp_path / "u.tok"
    write_flat(path, unique_docs, 100000)
    a = inspect(ringscan, path, 3, 64, count=2, seed=11)
    b = inspect(ringscan, path, 3, 64, count=2, seed=11)
    c = inspect(ringscan, path, 3, 64, count=2, seed=12)
    assert all((x == y).all() for x, y in zip(a, b))
    assert any((x != y).any() for x, y in zip(a, c))


def test_inspect_sample_index_wraps_epochs(ringscan, tmp_path, unique_docs):
    path = tmp_path / "u.tok"
    write_flat(path, unique_docs, 100000)
    n_tokens = sum(map(len, unique_docs))
    S = (n_tokens - 1) // 50
    r = run([ringscan, "data", "inspect", path, "--sample", 2 * S + 1, "--seq-len", 50])
    assert r.returncode == 0
    assert f"epoch 2, sample 1 of {S} in the epoch, stream tokens [50, 100]" in r.stdout


# ---- Megatron ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_megatron_read_back(ringscan, tmp_path, dtype):
    rng = np.random.default_rng(1)
    docs = []  # each document: 1..3 sequences; one empty document; one empty sequence
    for d in range(25):
        seqs = [list(rng.integers(0, 1000, size=int(rng.integers(0, 40)))) for _ in range(int(rng.integers(1, 4)))]
        docs.append(seqs)
    docs[4] = [[]]
    docs[7] = [[5, 6], [], [7]]
    prefix = tmp_path / "corpus_text_document"
    write_megatron(prefix, docs, dtype)
    flat_docs = [sum(seqs, []) for seqs in docs]
    lens = [len(d) for d in flat_docs]
    n_tokens = sum(lens)
    r = run([ringscan, "data", "check", prefix, "--vocab", 1000])
    assert r.returncode == 0, r.stderr
    assert "valid Megatron indexed dataset" in r.stdout
    dname = "uint16" if dtype == np.uint16 else "int32"
    assert f"tokens      {n_tokens} ({dname}" in r.stdout
    assert re.search(rf"documents   25 \({lens.count(0)} empty\); length min 0, median {sorted(lens)[12]}, ", r.stdout)
    assert f"max {max(lens)}\n" in r.stdout
    assert f"token ids   min {min(min(d) for d in flat_docs if d)}, max {max(max(d) for d in flat_docs if d)}" in r.stdout
    # the .bin or .idx path names the same dataset
    for p in (f"{prefix}.bin", f"{prefix}.idx"):
        assert run([ringscan, "data", "check", p]).returncode == 0
    # packed samples: exactly the documents' tokens, concatenated
    T = 16
    S = (n_tokens - 1) // T
    got = inspect(ringscan, prefix, 0, T, count=S, extra=("--format", "megatron"))
    want = expected_samples(flat_docs, list(range(25)), T, S)
    for g, (tok, tgt, dpos) in zip(got, want):
        assert (g[:, 1] == tok).all() and (g[:, 2] == tgt).all() and (g[:, 3] == dpos).all()


# ---- bad files ----------------------------------------------------------------------

def flat_variants(tmp_path):
    """(name, path, bytes) of damaged flat files; the good one is 3 documents."""
    good = tmp_path / "good.tok"
    write_flat(good, [[1, 2, 3], [4, 5], [6, 7, 8, 9]], 100)
    b = bytearray(good.read_bytes())
    out = {}
    out["wrong magic"] = b"RSTOKENZ" + b[8:]
    out["wrong version"] = b[:8] + struct.pack("<I", 2) + b[12:]
    out["token width"] = b[:12] + struct.pack("<I", 3) + b[16:]
    out["truncated tokens"] = b[:-3]
    out["truncated header"] = b[:40]
    out["trailing bytes"] = b + b"\0\0"
    out["reserved byte"] = b[:50] + b"\x01" + b[51:]
    bad = bytearray(b)
    struct.pack_into("<Q", bad, 64 + 8 * 2, 99)  # doc_start[2] beyond n_tokens
    out["offset out of range"] = bytes(bad)
    bad = bytearray(b)
    struct.pack_into("<Q", bad, 64 + 8 * 2, 1)  # doc_start[2] < doc_start[1]
    out["offset decreasing"] = bytes(bad)
    bad = bytearray(b)
    struct.pack_into("<Q", bad, 64 + 8 * 3, 8)  # last offset != n_tokens
    out["last offset"] = bytes(bad)
    bad = bytearray(b)
    struct.pack_into("<Q", bad, 24, 10)  # n_tokens larger than the file holds
    out["n_tokens too large"] = bytes(bad)
    return out


FLAT_EXPECT = {
    "wrong magic": 'expected magic "RSTOKENS" at offset 0, found "RSTOKENZ"',
    "wrong version": "unsupported flat format version 2 at offset 8 (expected 1)",
    "token width": "token_bytes 3 at offset 12, expected 2 (uint16) or 4 (uint32)",
    "truncated tokens": "is truncated: its header (n_tokens 9, n_docs 3, token_bytes 2) implies 114 bytes, found 111",
    "truncated header": "is truncated: a flat token file starts with a 64-byte header, found 40 bytes",
    "trailing bytes": "has 2 bytes after the last token",
    "reserved byte": "reserved header byte 50 is 0x01, expected 0",
    "offset out of range": "doc_start[2] = 99, expected a value in [3, n_tokens = 9]",
    "offset decreasing": "doc_start[2] = 1, expected a value in [3, n_tokens = 9]",
    "last offset": "doc_start[n_docs = 3] = 8, expected n_tokens = 9",
    "n_tokens too large": "is truncated: its header (n_tokens 10, n_docs 3, token_bytes 2) implies 116 bytes",
}


@pytest.mark.parametrize("case", sorted(FLAT_EXPECT))
def test_bad_flat_file(ringscan, tmp_path, case):
    path = tmp_path / "bad.tok"
    path.write_bytes(flat_variants(tmp_path)[case])
    for args in (["check", path], ["inspect", path, "--sample", 0, "--seq-len", 4]):
        r = run([ringscan, "data", *args])
        assert r.returncode == 2, (case, r.stdout, r.stderr)
        assert f"data file {path}" in r.stderr and FLAT_EXPECT[case] in r.stderr, r.stderr
        assert "hint:" in r.stderr and r.stdout == ""
        assert r.stderr.count("error:") == 1


def test_token_id_beyond_vocab(ringscan, tmp_path):
    path = tmp_path / "v.tok"
    write_flat(path, [[1, 2, 3], [4, 250, 5], [6, 7, 8]], 256)
    r = run([ringscan, "data", "check", path, "--vocab", 200])
    assert r.returncode == 2
    assert "was made for vocab_size 256 (its header), larger than model.vocab_size 200" in r.stderr
    # the header claims a vocab the tokens exceed: the full scan finds it ...
    b = bytearray(path.read_bytes())
    struct.pack_into("<Q", b, 16, 200)
    path.write_bytes(bytes(b))
    r = run([ringscan, "data", "check", path])
    assert r.returncode == 2
    assert f"data file {path}: token id 250 at token index 4 (document 1) is outside [0, 200)" in r.stderr
    # ... and so does reading a sample that holds it (here as the last target)
    assert run([ringscan, "data", "inspect", path, "--sample", 0, "--seq-len", 3]).returncode == 0
    r = run([ringscan, "data", "inspect", path, "--sample", 1, "--seq-len", 3])
    assert r.returncode == 2 and "token id 250 at token index 4" in r.stderr
    # Megatron has no vocab in the file: --vocab is the limit
    write_megatron(tmp_path / "m", [[[1, 2]], [[3, 999, 4]]], np.uint16)
    r = run([ringscan, "data", "check", tmp_path / "m", "--vocab", 500])
    assert r.returncode == 2
    assert f"data file {tmp_path}/m.bin: token id 999 at token index 3 (document 1) is outside [0, 500)" in r.stderr
    assert "model.vocab_size is 500" in r.stderr
    # the boundary: id 999 fits vocab 1000, not 999
    assert run([ringscan, "data", "check", tmp_path / "m", "--vocab", 1000]).returncode == 0
    r = run([ringscan, "data", "check", tmp_path / "m", "--vocab", 999])
    assert r.returncode == 2 and "token id 999 at token index 3 (document 1) is outside [0, 999)" in r.stderr
    r = run([ringscan, "data", "inspect", tmp_path / "m", "--sample", 0, "--seq-len", 4, "--vocab", 999])
    assert r.returncode == 2 and "token id 999 at token index 3 (document 1) is outside [0, 999)" in r.stderr
    assert run([ringscan, "data", "inspect", tmp_path / "m", "--sample", 0, "--seq-len", 4, "--vocab", 1000]).returncode == 0


def megatron_variants(tmp_path):
    prefix = tmp_path / "good"
    write_megatron(prefix, [[[1, 2, 3]], [[4, 5], [6]], [[7, 8, 9, 10]]], np.uint16)
    idx = bytearray(open(f"{prefix}.idx", "rb").read())
    binb = open(f"{prefix}.bin", "rb").read()
    S, D = 4, 4
    o_ptr, o_doc = 34 + 4 * S, 34 + 12 * S
    out = {}

    def put(name, i=None, b=None):
        out[name] = (bytes(i if i is not None else idx), bytes(b if b is not None else binb))

    put("wrong magic", b"MMIDIDY\x00\x00" + idx[9:])
    put("wrong version", idx[:9] + struct.pack("<Q", 2) + idx[17:])
    put("float dtype", idx[:17] + b"\x06" + idx[18:])
    put("unknown dtype", idx[:17] + b"\x09" + idx[18:])
    put("truncated idx", idx[:-5])
    put("truncated idx header", idx[:20])
    put("trailing idx", idx + b"\0" * 8)
    put("truncated bin", b=binb[:-2])
    put("long bin", b=binb + b"\0\0")
    bad = bytearray(idx)
    struct.pack_into("<q", bad, o_doc + 8 * 2, 7)
    put("doc index out of range", bad)
    bad = bytearray(idx)
    struct.pack_into("<q", bad, o_doc, 1)
    put("first doc index", bad)
    bad = bytearray(idx)
    struct.pack_into("<q", bad, o_doc + 8 * 3, 3)
    put("last doc index", bad)
    bad = bytearray(idx)
    struct.pack_into("<q", bad, o_ptr + 8 * 2, 12)
    put("pointer gap", bad)
    bad = bytearray(idx)
    struct.pack_into("<i", bad, 34 + 4 * 1, -2)
    put("negative length", bad)
    bad = idx + b"\0" * S
    put("multimodal", bad)
    return out


MEG_EXPECT = {
    "wrong magic": ("idx", 'expected magic "MMIDIDX\\x00\\x00" at offset 0, found "MMIDIDY\\x00\\x00"'),
    "wrong version": ("idx", "version 2 at offset 9, expected 1"),
    "float dtype": ("idx", "dtype code 6 (float64) at offset 17, expected an integer dtype"),
    "unknown dtype": ("idx", "dtype code 9 at offset 17, expected one of 1 uint8"),
    "truncated idx": ("idx", "is truncated: its header (4 sequences, 4 document indices) implies 114 bytes, found 109"),
    "truncated idx header": ("idx", "is truncated: the header is 34 bytes, found 20 bytes"),
    "trailing idx": ("idx", "is longer than its header says: its header (4 sequences, 4 document indices) implies 114"),
    "truncated bin": ("bin", "is 18 bytes; its index"),
    "long bin": ("bin", "is 22 bytes; its index"),
    "doc index out of range": ("idx", "document_indices[2] = 7, expected a value in [1, sequence count 4]"),
    "first doc index": ("idx", "document_indices[0] = 1, expected 0"),
    "last doc index": ("idx", "the last document index is 3, expected the sequence count 4"),
    "pointer gap": ("idx", "sequence_pointers[2] = 12, expected 10"),
    "negative length": ("idx", "sequence_lengths[1] = -2, expected >= 0"),
    "multimodal": ("idx", "has sequence_modes (a multimodal dataset)"),
}


@pytest.mark.parametrize("case", sorted(MEG_EXPECT))
def test_bad_megatron_files(ringscan, tmp_path, case):
    idx, binb = megatron_variants(tmp_path)[case]
    prefix = tmp_path / "bad"
    open(f"{prefix}.idx", "wb").write(idx)
    open(f"{prefix}.bin", "wb").write(binb)
    which, text = MEG_EXPECT[case]
    for args in (["check", prefix], ["inspect", prefix, "--sample", 0, "--seq-len", 4, "--format", "megatron"]):
        r = run([ringscan, "data", *args])
        assert r.returncode == 2, (case, r.stdout, r.stderr)
        assert f"{prefix}.{which}" in r.stderr and text in r.stderr, r.stderr
        assert "hint:" in r.stderr and r.stdout == ""


def test_missing_files(ringscan, tmp_path):
    r = run([ringscan, "data", "check", tmp_path / "nothing"])
    assert r.returncode == 2 and f"{tmp_path}/nothing does not exist" in r.stderr
    write_megatron(tmp_path / "m", [[[1, 2]]], np.uint16)
    (tmp_path / "m.bin").unlink()
    r = run([ringscan, "data", "check", tmp_path / "m"])
    assert r.returncode == 2 and f"Megatron data file {tmp_path}/m.bin does not exist" in r.stderr
    r = run([ringscan, "data", "check", tmp_path / "m.idx", "--format", "megatron"])
    assert r.returncode == 2 and "data.path of a Megatron dataset is the prefix" in r.stderr
    # a Megatron index given as a flat file
    r = run([ringscan, "data", "check", tmp_path / "m.idx", "--format", "flat"])
    assert r.returncode == 2 and "this is a Megatron index (.idx)" in r.stderr
    # too few tokens for one sample
    write_flat(tmp_path / "s.tok", [[1, 2, 3]], 10)
    r = run([ringscan, "data", "inspect", tmp_path / "s.tok", "--sample", 0, "--seq-len", 3])
    assert r.returncode == 2 and "has 3 tokens; one sample of data.seq_len 3 needs 4" in r.stderr


# ---- synth ----------------------------------------------------------------------------

SYNTH_ARGS = dict(tokens=60000, vocab=256, seed=3, min_doc=96, max_doc=1024, pairs=8, queries=4, gap=8, branch=4)


def synth(ringscan, path, **kw):
    args = {**SYNTH_ARGS, **kw}
    r = run([ringscan, "data", "synth", path] + sum([[f"--{k.replace('_', '-')}", v] for k, v in args.items()], []))
    return r, args


def parse_stats(out):
    num = r"(-?[0-9.]+)"
    pats = {
        "tokens": rf"wrote .*: {num} tokens", "docs": rf"tokens \(uint16\), {num} documents",
        "doc_min": rf"length min {num}", "doc_mean": rf"length min \d+, mean {num}", "doc_max": rf"mean [0-9.]+, max {num};",
        "over512": rf"{num} longer than 512", "pairs": rf"recall +{num} pairs", "queries": rf"{num} queries",
        "rmin": rf"distance pair->answer min {num}", "rmean": rf"answer min \d+, mean {num}",
        "rmax": rf"answer min \d+, mean [0-9.]+, max {num}", "r512": rf"{num} over 512",
        "floor": rf"loss floor +{num}", "unigram": rf"unigram +{num}", "uniform": rf"uniform +{num}",
    }
    return {k: float(re.search(p, out).group(1)) for k, p in pats.items()}


def synth_reference(path, a):
    """Re-parses a synth file and recomputes every printed statistic."""
    vocab, starts, toks = read_flat(path)
    V, P, Q, G, B = a["vocab"], a["pairs"], a["queries"], a["gap"], a["branch"]
    K = V // 4
    F = V - 4 - 2 * K
    key0, val0, fill0 = 4, 4 + K, 4 + 2 * K
    Rq = Q * (3 + G)
    s_min, s_max = a["min_doc"] - Rq, a["max_doc"] - Rq
    lp_sum, n_targets, pairs, queries, dists = 0.0, 0, 0, 0, []
    succ = {}
    lens = np.diff(starts)
    for d in range(len(lens)):
        doc = toks[starts[d]:starts[d + 1]]
        L = len(doc)
        assert doc[0] == 0
        n_targets += L - 1
        lp = np.zeros(L)
        keys, vals, pos_of_key = [], {}, {}
        t = 1
        for j in range(P):
            if t + 2 >= L:
                break
            assert doc[t] == 1 and key0 <= doc[t + 1] < val0 and val0 <= doc[t + 2] < fill0
            k = int(doc[t + 1])
            assert k not in vals, "keys of a document must be distinct"
            keys.append(k)
            vals[k] = int(doc[t + 2])
            pos_of_key[k] = t + 2
            lp[t + 1] = math.log(K - j)
            lp[t + 2] = math.log(K)
            t += 3
            pairs += 1
        prev = None
        while t < L and doc[t] != 2:  # filler until the first <q>
            x = int(doc[t])
            assert fill0 <= x < V
            h = 1.0 / (s_max - t + 1) if t >= s_min else 0.0
            lp[t] = (math.log(F) if prev is None else math.log(B)) - math.log1p(-h)
            if prev is not None:
                succ.setdefault(prev, set()).add(x)
            prev = x
            t += 1
        if t < L:
            s = t
            assert s_min <= s <= s_max
            assert L == s + Rq or d == len(lens) - 1, "queries fill the document's end"
            asked = set()
            for q in range(Q):
                if t >= L:
                    break
                assert doc[t] == 2
                lp[t] = math.log(s_max - s + 1) if q == 0 else 0.0
                if t + 1 < L:
                    k = int(doc[t + 1])
                    assert k in vals and k not in asked
                    asked.add(k)
                    lp[t + 1] = math.log(P - q)
                if t + 2 < L:
                    assert doc[t + 2] == vals[k], "the answer is the pair's value"
                    queries += 1
                    dists.append(t + 2 - pos_of_key[k])
                t += 3
                prev = None
                for _ in range(G):
                    if t >= L:
                        break
                    x = int(doc[t])
                    assert fill0 <= x < V
                    lp[t] = math.log(F) if prev is None else math.log(B)
                    if prev is not None:
                        succ.setdefault(prev, set()).add(x)
                    prev = x
                    t += 1
        lp_sum += lp[1:].sum()
    targets = np.concatenate([toks[starts[d] + 1:starts[d + 1]] for d in range(len(lens))])
    p = np.bincount(targets, minlength=V) / len(targets)
    p = p[p > 0]
    return dict(tokens=len(toks), docs=len(lens), doc_min=lens.min(), doc_max=lens.max(), doc_mean=lens.mean(),
                over512=int((lens > 512).sum()), pairs=pairs, queries=queries, rmin=min(dists), rmax=max(dists),
                rmean=float(np.mean(dists)), r512=sum(x > 512 for x in dists), floor=lp_sum / n_targets,
                unigram=float(-(p * np.log(p)).sum()), uniform=math.log(V), succ=succ, F=F)


def test_synth_layout_and_statistics(ringscan, tmp_path):
    path = tmp_path / "synth.tok"
    r, a = synth(ringscan, path)
    assert r.returncode == 0, r.stderr
    got, want = parse_stats(r.stdout), synth_reference(path, a)
    for k in ("tokens", "docs", "doc_min", "doc_max", "over512", "pairs", "queries", "rmin", "rmax", "r512"):
        assert got[k] == want[k], (k, got[k], want[k])
    for k, tol in (("doc_mean", 0.06), ("rmean", 0.06), ("floor", 6e-5), ("unigram", 6e-5), ("uniform", 6e-5)):
        assert abs(got[k] - want[k]) < tol, (k, got[k], want[k])
    # the filler chain: every filler token has at most B successors, most exactly B
    sizes = [len(v) for v in want["succ"].values()]
    assert max(sizes) == a["branch"] and np.mean([s == a["branch"] for s in sizes]) > 0.9
    # what "learning" means: floor well below unigram, unigram below uniform
    assert got["floor"] < got["unigram"] - 2 and got["unigram"] < got["uniform"]
    # long context: many documents and recall distances beyond a 512-token sample
    assert got["over512"] > 0.3 * got["docs"] and got["r512"] > 0.2 * got["queries"]
    r = run([ringscan, "data", "check", path])
    assert r.returncode == 0 and "max 255; all < 256 (vocab_size in the header)" in r.stdout


def test_synth_deterministic(ringscan, tmp_path):
    synth(ringscan, tmp_path / "a.tok")
    synth(ringscan, tmp_path / "b.tok")
    synth(ringscan, tmp_path / "c.tok", seed=4)
    a, b, c = ((tmp_path / f"{x}.tok").read_bytes() for x in "abc")
    assert a == b and a != c
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tok", "b.tok", "c.tok"], "temporary files left"
    # a larger vocabulary is written as uint32
    r, _ = synth(ringscan, tmp_path / "w.tok", vocab=70000, tokens=5000)
    assert r.returncode == 0 and "(uint32)" in r.stdout
    assert read_flat(tmp_path / "w.tok")[0] == 70000


@pytest.mark.parametrize("args,message", [
    (["--pairs", "0"], "--pairs 0: expected an integer in [1, 1048576]"),
    (["--queries", "9"], "--queries 9, expected 1..8 (--pairs)"),
    (["--min-doc", "50"], "--min-doc 50 is too short"),
    (["--max-doc", "90"], "--max-doc 90, expected --min-doc (96) .. 2^30"),
    (["--vocab", "8"], "--vocab 8: expected an integer in [16, 1048576]"),
    (["--keys", "200"], "--keys 200 with --vocab 256 leaves -148 filler tokens"),
    (["--branch", "200"], "--branch 200, expected 1..124"),
    (["--tokens", "12x"], "--tokens 12x: expected an integer"),
    (["--tokens"], "--tokens needs a value"),
    (["--frob", "1"], "unknown option --frob"),
    (["--seed", "1", "--seed", "2"], "--seed given twice"),
])
def test_synth_bad_arguments(ringscan, tmp_path, args, message):
    r = run([ringscan, "data", "synth", tmp_path / "out.tok", *args])
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == [], "nothing may be written on bad arguments"




def test_bigram_model_learns_synth_in_150_steps(ringscan, tmp_path):
    """The filler's local structure is learnable fast: a bigram table trained
    with Adam on packed 512-token samples drops well below the unigram loss."""
    torch = pytest.importorskip("torch")
    path = tmp_path / "s.tok"
    r, _ = synth(ringscan, path, tokens=400000)
    stats = parse_stats(r.stdout)
    _, starts, toks = read_flat(path)
    doc_of = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
    torch.manual_seed(0)
    logits = torch.zeros(256, 256, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.1)
    T, B = 512, 8
    losses = []
    for step in range(150):
        g = (step * B + np.arange(B)) % ((len(toks) - 1) // T)
        x = np.stack([toks[i * T:i * T + T] for i in g])
        y = np.stack([toks[i * T + 1:i * T + T + 1] for i in g])
        same = np.stack([doc_of[i * T + 1:i * T + T + 1] == doc_of[i * T:i * T + T] for i in g])
        y = np.where(same, y, -1)
        loss = torch.nn.functional.cross_entropy(logits[torch.from_numpy(x)].reshape(-1, 256),
                                                 torch.from_numpy(y).reshape(-1), ignore_index=-1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    first, last = losses[0], np.mean(losses[-10:])
    print(f"bigram: loss {first:.3f} -> {last:.3f}; unigram {stats['unigram']:.3f}, floor {stats['floor']:.3f}")
    assert abs(first - stats["uniform"]) < 1e-3  # zero logits: ln 256
    assert last < stats["unigram"] - 1.5
    assert last > stats["floor"]


# ---- bytes ----------------------------------------------------------------------------

def paragraphs(data):
    """Python's reading of --doc-split blank: runs of non-blank lines, bytes as-is."""
    docs, cur = [], b""
    for line in data.splitlines(keepends=True):
        if line.strip(b" \t\r\n") == b"" and line.rstrip(b"\n").strip(b" \t\r") == b"":
            if cur:
                docs.append(cur)
            cur = b""
        else:
            cur += line
    if cur:
        docs.append(cur)
    return docs


def test_bytes_round_trip(ringscan, tmp_path):
    texts = [
        b"first paragraph\nstill first\n\n\nsecond\r\n \t\r\nthird, no final newline",
        b"",
        "\u00e9t\u00e9 \U0001F600\n\n\n".encode(),
        b"\n\n   \n",
        bytes(range(256)).replace(b"\n", b""),  # every byte value except '\n'
    ]
    files = []
    for i, t in enumerate(texts):
        f = tmp_path / f"in{i}.txt"
        f.write_bytes(t)
        files.append(f)
    out = tmp_path / "b.tok"
    r = run([ringscan, "data", "bytes", out, *files])
    assert r.returncode == 0, r.stderr
    want = sum((paragraphs(t) for t in texts), [])
    assert len(want) == 5
    vocab, starts, toks = read_flat(out)
    assert vocab == 256 and len(starts) - 1 == len(want)
    got = [bytes(toks[starts[d]:starts[d + 1]].astype(np.uint8)) for d in range(len(want))]
    assert got == want
    assert f"{sum(map(len, want))} tokens (bytes, vocab 256, uint16), 5 documents from 5 files" in r.stdout
    # one document per file, exactly the file's bytes; the empty file adds none
    r = run([ringscan, "data", "bytes", out, *files, "--doc-split", "file"])
    assert r.returncode == 0, r.stderr
    vocab, starts, toks = read_flat(out)
    got = [bytes(toks[starts[d]:starts[d + 1]].astype(np.uint8)) for d in range(len(starts) - 1)]
    assert got == [t for t in texts if t]


def test_bytes_failures_leave_output_untouched(ringscan, tmp_path):
    out = tmp_path / "b.tok"
    out.write_bytes(b"previous contents")
    good = tmp_path / "a.txt"
    good.write_text("hello\n")
    r = run([ringscan, "data", "bytes", out, good, tmp_path / "missing.txt"])
    assert r.returncode == 2 and f"input file {tmp_path}/missing.txt does not exist" in r.stderr
    r = run([ringscan, "data", "bytes", out, tmp_path])
    assert r.returncode == 2 and "is not a regular file" in r.stderr
    empty = tmp_path / "e.txt"
    empty.write_text("\n \n")
    r = run([ringscan, "data", "bytes", out, empty])
    assert r.returncode == 2 and "hold no document" in r.stderr
    r = run([ringscan, "data", "bytes", out, good, "--doc-split", "para"])
    assert r.returncode == 2 and "--doc-split para: expected blank or file" in r.stderr
    r = run([ringscan, "data", "bytes", out])
    assert r.returncode == 2 and "expected OUT and at least one input file" in r.stderr
    assert out.read_bytes() == b"previous contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.tok", "e.txt"]


# ---- where the writers write: missing directories, a file in the way, no permission ---------------------------

def writer_args(kind, out, text):
    """The command line of one data writer; `text` is the input file of `data bytes`."""
    if kind == "synth":
        return ["data", "synth", out, "--tokens", 30011, "--seed", 7]  # 60 KB of uint16 tokens
    return ["data", "bytes", out, text]


def listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def text_file(tmp_path_factory):
    """30 KB of text with blank-line documents, outside the directories the tests list."""
    rng = np.random.default_rng(11)
    path = tmp_path_factory.mktemp("input") / "in.txt"
    lines = ["".join(chr(c) for c in rng.integers(97, 123, size=int(rng.integers(1, 80)))) for _ in range(800)]
    path.write_text("\n".join(l if i % 9 else "" for i, l in enumerate(lines)) + "\n")
    path.chmod(0o644)
    path.parent.chmod(0o755)
    return path


@pytest.mark.parametrize("kind", ["synth", "bytes"])
def test_writers_create_missing_directories(ringscan, tmp_path, text_file, kind):
    """`data synth out/x.tok` on a fresh checkout: the directories are made, the file equals one written into an
    existing directory, and nothing but it is left there."""
    (tmp_path / "here").mkdir()
    r = run([ringscan, *writer_args(kind, tmp_path / "here" / "x.tok", text_file)])
    assert r.returncode == 0, r.stderr
    r = run([ringscan, *writer_args(kind, "out/a/b/x.tok", text_file)], cwd=tmp_path)  # relative, as the README
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("wrote out/a/b/x.tok: "), r.stdout
    assert listing(tmp_path / "out") == ["a", "a/b", "a/b/x.tok"]
    made = (tmp_path / "out" / "a" / "b" / "x.tok").read_bytes()
    assert len(made) > 30000 and made == (tmp_path / "here" / "x.tok").read_bytes()
    assert run([ringscan, "data", "check", tmp_path / "out" / "a" / "b" / "x.tok"]).returncode == 0


@pytest.mark.parametrize("kind", ["synth", "bytes"])
def test_writers_refuse_a_file_in_the_way(ringscan, tmp_path, text_file, kind):
    (tmp_path / "f").write_text("not a directory\n")
    (tmp_path / "old.tok").write_bytes(b"previous contents")
    before = listing(tmp_path)
    for out, blocker in ((tmp_path / "f" / "x.tok", "f"), (tmp_path / "f" / "sub" / "x.tok", "f"),
                         (tmp_path / "old.tok" / "x.tok", "old.tok")):
        r = run([ringscan, *writer_args(kind, out, text_file)])
        assert r.returncode == 2, r.stderr
        assert f"ringscan data {kind}: error: {tmp_path}/{blocker} is not a directory, so {out} cannot be created " \
               "under it" in r.stderr, r.stderr
        assert "hint: each directory above the output must be a directory" in r.stderr and r.stdout == ""
        assert listing(tmp_path) == before, "nothing may be written"
    assert (tmp_path / "f").read_text() == "not a directory\n"
    assert (tmp_path / "old.tok").read_bytes() == b"previous contents"


def as_unprivileged(args):
    """Runs as nobody when we are root (root writes through any mode bits); as ourselves otherwise."""
    if os.geteuid() != 0:
        return args
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to drop root for the permission tests"
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *args]


@pytest.mark.parametrize("kind", ["synth", "bytes"])
def test_writers_refuse_an_unwritable_directory(ringscan, text_file, kind):
    root = Path(tempfile.mkdtemp(prefix="ringscan-ro-"))  # not under tmp_path: nobody must reach it
    ro = root / "ro"
    try:
        root.chmod(0o755)
        text = Path(shutil.copy(text_file, root / "in.txt"))  # where nobody can read it
        ro.mkdir()
        ro.chmod(0o555)
        cases = ((ro / "sub" / "x.tok", f"cannot create the directory {ro}/sub (for {ro}/sub/x.tok): Permission denied",
                  "each directory above the output"),
                 (ro / "x.tok", f"cannot create {ro}/x.tok.tmp.", "the directory of the output must be writable"))
        for out, message, hint in cases:
            r = run(as_unprivileged([ringscan, *writer_args(kind, out, text)]))
            assert r.returncode == 2, r.stderr
            assert f"ringscan data {kind}: error: {message}" in r.stderr and f"hint: {hint}" in r.stderr, r.stderr
            assert f"{out}" in r.stderr and r.stdout == ""
            assert listing(root) == ["in.txt", "ro"]
    finally:
        if ro.exists():
            ro.chmod(0o755)
        shutil.rmtree(root)


@pytest.mark.parametrize("kind", ["synth", "bytes"])
def test_writers_take_back_the_directories_they_made(ringscan, tmp_path, text_file, kind):
    """A write that fails after the directories were made (here the file-size limit: 16 KiB of a 60 or 30 KB file)
    removes its temporary file and the directories it created, not the one that was there."""
    (tmp_path / "kept").mkdir()
    out = tmp_path / "kept" / "new" / "deeper" / "x.tok"
    limited = ["bash", "-c", 'trap "" XFSZ; ulimit -f 16; exec "$@"', "limited"]
    r = run([*limited, ringscan, *writer_args(kind, out, text_file)])
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert f"ringscan data {kind}: error: writing {out}: write of the tokens failed: File too large" in r.stderr, \
        r.stderr
    assert listing(tmp_path) == ["kept"]
    assert run([ringscan, *writer_args(kind, out, text_file)]).returncode == 0  # the same command, no limit


# ---- help and usage ------------------------------------------------------------------

def test_data_help_and_usage(ringscan):
    r = run([ringscan, "data", "--help"])
    assert r.returncode == 0 and all(s in r.stdout for s in ("synth", "bytes", "check", "inspect"))
    assert run([ringscan, "data"]).returncode == 2
    r = run([ringscan, "data", "frob"])
    assert r.returncode == 2 and "unknown subcommand 'frob'" in r.stderr
    for sub in ("synth", "bytes", "check", "inspect"):
        r = run([ringscan, "data", sub, "--help"])
        assert r.returncode == 0 and r.stdout.startswith(f"usage: ringscan data {sub}"), sub
    r = run([ringscan, "data", "synth", "--help"])
    for s in ("<doc>", "<kv>", "<q>", "4    ..67    keys", "68   ..131   values", "132  ..255   filler (124 tokens)"):
        assert s in r.stdout, s
    r = run([ringscan, "data", "inspect", "x.tok", "--seq-len", "4"])
    assert r.returncode == 2 and "missing --sample I" in r.stderr
