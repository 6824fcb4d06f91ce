"""safetensors_io.py — a small reader and writer of the safetensors format.

Used by the parity tools (make_case.py writes weights, batch and reference
gradients; compare.py reads the C trainer's gradients) and by the tests. No
third-party safetensors package is needed: only json, struct and numpy.

The format (as documented by its authors):
  bytes 0..7    N, the header length, unsigned 64-bit little-endian
  bytes 8..8+N  a UTF-8 JSON object: for every tensor
                  "name": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}
                and optionally "__metadata__": {str: str}. Writers pad it with spaces so
                that the data starts 8-byte aligned.
  the rest      the data buffer; a tensor's bytes are [begin, end) of it, row-major,
                little-endian. Tensors do not overlap and leave no holes.

Tensors are numpy arrays here. A 0-d array (shape []) is a valid tensor.
"""
import json
import struct

import numpy as np

# safetensors dtype name <-> numpy dtype (little-endian). BF16 has no numpy
# type; it is read into float32 (the top 16 bits), and written from float32
# (rounded to nearest even) for the tensors save()'s `bf16` names.
_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_NAMES = {v: k for k, v in _DTYPES.items()}

MAX_HEADER = 100 * 1024 * 1024  # refuse absurd headers (corrupt files)


class SafetensorsError(ValueError):
    pass


def _dtype_name(a):
    dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
    for np_dt, name in _NAMES.items():
        if dt == np_dt:
            return name
    raise SafetensorsError(f"unsupported dtype {a.dtype} (supported: {', '.join(_DTYPES)})")


def bf16_bits(a):
    """float32 array -> its bf16 bits (uint16, round to nearest even; NaN stays NaN)."""
    b = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((b >> 16) | 0x40).astype(np.uint16), r)


def save(path, tensors, metadata=None, bf16=()):
    """Writes a dict name -> numpy array (in the dict's order) to `path`.
    `metadata` is an optional dict of str -> str; the tensors named in `bf16` (or all of them when
    bf16 is True) are stored as BF16."""
    header = {}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise SafetensorsError("metadata keys and values must be strings")
        header["__metadata__"] = dict(metadata)
    blobs = []
    offset = 0
    for name, a in tensors.items():
        if not isinstance(name, str) or name == "__metadata__" or not name:
            raise SafetensorsError(f"bad tensor name {name!r}")
        a = np.asarray(a)
        if bf16 is True or (bf16 and name in bf16):
            dname, data = "BF16", bf16_bits(a).astype("<u2").tobytes()
        else:
            dname = _dtype_name(a)
            data = np.ascontiguousarray(a, dtype=_DTYPES[dname]).tobytes()
        header[name] = {"dtype": dname, "shape": [int(d) for d in a.shape],
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise SafetensorsError(f"duplicate key {k!r} in header")
        d[k] = v
    return d


def load(path, with_metadata=False):
    """Reads `path`; returns dict name -> numpy array (file order), and the
    metadata dict too when with_metadata. BF16 tensors come back as float32.
    Raises SafetensorsError on anything malformed."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise SafetensorsError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > MAX_HEADER or 8 + n > len(raw):
        raise SafetensorsError(f"{path}: header length {n} does not fit the file ({len(raw)} bytes)")
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    buf = raw[8 + n:]
    metadata = header.pop("__metadata__", None) or {}
    out = {}
    spans = []
    for name, info in header.items():
        try:
            dname, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"{path}: tensor {name!r}: needs dtype, shape and data_offsets") from None
        if dname != "BF16" and dname not in _DTYPES:
            raise SafetensorsError(f"{path}: tensor {name!r}: unsupported dtype {dname!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise SafetensorsError(f"{path}: tensor {name!r}: bad shape {shape!r}")
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= len(buf)):
            raise SafetensorsError(f"{path}: tensor {name!r}: data_offsets {[begin, end]} outside the data "
                                   f"({len(buf)} bytes)")
        numel = int(np.prod(shape, dtype=np.int64))
        itemsize = 2 if dname == "BF16" else _DTYPES[dname].itemsize
        if end - begin != numel * itemsize:
            raise SafetensorsError(f"{path}: tensor {name!r}: {end - begin} bytes for shape {shape} of {dname}")
        if dname == "BF16":
            bits = np.frombuffer(buf, dtype="<u2", count=numel, offset=begin).astype(np.uint32) << 16
            a = bits.view(np.float32).reshape(shape)
        else:
            a = np.frombuffer(buf, dtype=_DTYPES[dname], count=numel, offset=begin).reshape(shape).copy()
        out[name] = a
        spans.append((begin, end, name))
    spans.sort()
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            raise SafetensorsError(f"{path}: tensor {name!r} starts at {begin}, expected {pos} "
                                   "(overlap or hole in the data)")
        pos = end
    if pos != len(buf):
        raise SafetensorsError(f"{path}: {len(buf) - pos} bytes after the last tensor")
    return (out, metadata) if with_metadata else out
