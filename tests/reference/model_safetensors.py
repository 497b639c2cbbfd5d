#!/usr/bin/python3
"""Tiny, dependency-free safetensors reader/writer for the olmosft reference scripts.

Format (https://huggingface.co/docs/safetensors): 8-byte little-endian u64 header size N, then N bytes of
UTF-8 JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, optional "__metadata__": {str: str}},
then the raw little-endian tensor bytes (offsets are relative to the start of this data section).

Writer conventions (so that files are byte-reproducible and a C++ writer can match them):
  * tensors are laid out sorted by (dtype rank descending, name ascending), the rank being the order of
    _DTYPE_RANK below (same idea as the Rust `safetensors` crate: larger/later dtypes first);
  * the header is compact JSON (separators "," and ":"), "__metadata__" first (only if given), then the
    tensors in layout order; each entry's keys in the order dtype, shape, data_offsets;
  * the header is padded with ASCII spaces to a multiple of 8 bytes;
  * data is packed with no gaps.

Supported dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL.  BF16 is handled through int16 views
(torch.bfloat16 <-> raw 16-bit patterns), so no rounding ever happens in the reader/writer itself.

Usage as a script:  model_safetensors.py FILE   prints the header (names, dtypes, shapes).
                    model_safetensors.py --check  runs a round-trip self-test.
"""
import json
import struct
import sys

import numpy as np
import torch

# name -> (torch dtype, numpy dtype used for raw bytes, element size)
_DTYPES = {
    "F64": (torch.float64, "<f8", 8),
    "F32": (torch.float32, "<f4", 4),
    "F16": (torch.float16, "<f2", 2),
    "BF16": (torch.bfloat16, "<i2", 2),  # via int16 view
    "I64": (torch.int64, "<i8", 8),
    "I32": (torch.int32, "<i4", 4),
    "I16": (torch.int16, "<i2", 2),
    "I8": (torch.int8, "i1", 1),
    "U8": (torch.uint8, "u1", 1),
    "BOOL": (torch.bool, "u1", 1),
}
_DTYPE_RANK = ["BOOL", "U8", "I8", "I16", "F16", "BF16", "I32", "F32", "F64", "I64"]
_TORCH_TO_NAME = {v[0]: k for k, v in _DTYPES.items()}


class SafetensorsError(ValueError):
    pass


def _tensor_bytes(name, t):
    if not isinstance(t, torch.Tensor):
        raise SafetensorsError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _TORCH_TO_NAME:
        raise SafetensorsError(f"{name}: unsupported dtype {t.dtype}")
    dname = _TORCH_TO_NAME[t.dtype]
    t = t.detach().contiguous().cpu()
    if dname == "BF16":
        arr = t.view(torch.int16).numpy()
    elif dname == "BOOL":
        arr = t.to(torch.uint8).numpy()
    else:
        arr = t.numpy()
    arr = np.ascontiguousarray(arr.astype(_DTYPES[dname][1], copy=False))
    return dname, list(t.shape), arr.tobytes()


def serialize(tensors, metadata=None):
    """Return the bytes of a safetensors file holding `tensors` (dict name -> torch.Tensor)."""
    entries = []
    for name, t in tensors.items():
        if not isinstance(name, str) or name == "__metadata__" or not name:
            raise SafetensorsError(f"invalid tensor name {name!r}")
        dname, shape, raw = _tensor_bytes(name, t)
        entries.append((name, dname, shape, raw))
    entries.sort(key=lambda e: (-_DTYPE_RANK.index(e[1]), e[0]))
    header = {}
    if metadata is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise SafetensorsError("__metadata__ must map str -> str")
        header["__metadata__"] = dict(metadata)
    off = 0
    for name, dname, shape, raw in entries:
        header[name] = {"dtype": dname, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    hbytes = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("utf-8")
    hbytes += b" " * ((8 - len(hbytes) % 8) % 8)
    return struct.pack("<Q", len(hbytes)) + hbytes + b"".join(e[3] for e in entries)


def save(path, tensors, metadata=None):
    data = serialize(tensors, metadata)
    with open(path, "wb") as f:
        f.write(data)


def deserialize(data, what="<bytes>"):
    """Parse safetensors bytes -> (dict name -> torch.Tensor, metadata dict or None). Validates offsets."""
    if len(data) < 8:
        raise SafetensorsError(f"{what}: file shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise SafetensorsError(f"{what}: header size {n} exceeds file size {len(data)}")
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{what}: header is not valid UTF-8 JSON: {e}")
    if not isinstance(header, dict):
        raise SafetensorsError(f"{what}: header is not a JSON object")
    body = data[8 + n :]
    metadata = header.pop("__metadata__", None)
    out = {}
    spans = []
    for name, info in header.items():
        try:
            dname, shape, (b, e) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"{what}: tensor {name!r}: malformed entry {info!r}")
        if dname not in _DTYPES:
            raise SafetensorsError(f"{what}: tensor {name!r}: unsupported dtype {dname!r}")
        tdt, npdt, esz = _DTYPES[dname]
        numel = 1
        for s in shape:
            if not isinstance(s, int) or s < 0:
                raise SafetensorsError(f"{what}: tensor {name!r}: bad shape {shape!r}")
            numel *= s
        if not (0 <= b <= e <= len(body)) or e - b != numel * esz:
            raise SafetensorsError(
                f"{what}: tensor {name!r}: data_offsets {[b, e]} do not fit shape {shape} dtype {dname} "
                f"(data section {len(body)} bytes)"
            )
        spans.append((b, e, name))
        arr = np.frombuffer(body, dtype=npdt, count=numel, offset=b).copy().reshape(shape)
        t = torch.from_numpy(arr)
        if dname == "BF16":
            t = t.view(torch.bfloat16)
        elif dname == "BOOL":
            t = t.to(torch.bool)
        out[name] = t
    spans.sort()
    pos = 0
    for b, e, name in spans:
        if b != pos:
            raise SafetensorsError(f"{what}: tensor {name!r}: data not contiguous (gap or overlap at {b})")
        pos = e
    if pos != len(body):
        raise SafetensorsError(f"{what}: {len(body) - pos} trailing bytes after the last tensor")
    return out, metadata


def load(path):
    with open(path, "rb") as f:
        return deserialize(f.read(), str(path))


def _self_test():
    g = torch.Generator().manual_seed(0)
    ts = {
        "b.f32": torch.randn(3, 5, generator=g),
        "a.bf16": torch.randn(7, generator=g).to(torch.bfloat16),
        "c.f16": torch.randn(2, 2, generator=g).to(torch.float16),
        "d.i32": torch.arange(-3, 3, dtype=torch.int32).reshape(2, 3),
        "e.i64": torch.tensor([1 << 40, -5], dtype=torch.int64),
        "f.u8": torch.tensor([0, 255, 7], dtype=torch.uint8),
        "g.scalar": torch.tensor(1.5, dtype=torch.float32),
        "h.empty": torch.zeros(0, 4),
    }
    raw = serialize(ts, {"format": "pt"})
    assert (8 + struct.unpack("<Q", raw[:8])[0]) % 8 == 0
    back, meta = deserialize(raw)
    assert meta == {"format": "pt"}
    for k, v in ts.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
        assert torch.equal(back[k].view(torch.int16) if v.dtype == torch.bfloat16 else back[k],
                           v.view(torch.int16) if v.dtype == torch.bfloat16 else v), k
    assert serialize(back, meta) == raw, "re-serialisation is not byte-identical"
    # bf16 bit patterns survive (including a NaN payload and -0)
    bits = torch.tensor([0x7FC1, -32768, 0x3F80, 0x0001], dtype=torch.int16)
    b2, _ = deserialize(serialize({"x": bits.view(torch.bfloat16)}))
    assert torch.equal(b2["x"].view(torch.int16), bits)
    # corrupt inputs are rejected
    for bad in (raw[:4], raw[:-1], raw[:8] + b"[" + raw[9:]):
        try:
            deserialize(bad)
        except SafetensorsError:
            pass
        else:
            raise AssertionError("corrupt file accepted")
    print("model_safetensors: self-test passed")


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--check":
        _self_test()
    elif len(sys.argv) == 2:
        tensors, meta = load(sys.argv[1])
        if meta:
            print("__metadata__", json.dumps(meta))
        for k in sorted(tensors):
            print(f"{k}\t{_TORCH_TO_NAME[tensors[k].dtype]}\t{list(tensors[k].shape)}")
    else:
        print(__doc__)
        sys.exit(2)
