#!/usr/bin/python3
"""Reference safetensors image for the C++ reader/writer (src/io/safetensors.cpp).

Writes tests/golden/io/ref.safetensors and tests/golden/io/ref_values.json. The image follows the
reference writer's rules (huggingface/safetensors `prepare()`, docs/reference/formats.md §1): tensors sorted by dtype
size descending, then name; JSON keys "__metadata__" first, then tensors in offset order; compact JSON
padded with spaces to a multiple of 8. bf16/fp16 bytes come from PyTorch's own conversions
(torch 1.13, round to nearest even). The C++ test reads this file and also checks that its writer
produces the same bytes from the fp32 values in ref_values.json.

Usage: /usr/bin/python3 tests/reference/io_safetensors.py [CHECK_FILE...]
       (with arguments: validate existing .safetensors files with this independent reader instead)
"""
import json
import os
import struct
import sys

import torch

DT = {"F64": (torch.float64, 8), "I64": (torch.int64, 8), "F32": (torch.float32, 4), "I32": (torch.int32, 4),
      "BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2), "U8": (torch.uint8, 1)}


def tensor_bytes(t):
    t = t.contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def write(path, tensors, metadata):
    order = sorted(tensors.items(), key=lambda kv: (-DT[kv[1][0]][1], kv[0]))
    header = {"__metadata__": metadata} if metadata else {}
    off, blobs = 0, []
    for name, (dt, t) in order:
        b = tensor_bytes(t)
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def check(path):
    """Independent validation with the reference reader's rules."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    assert n <= 100_000_000 and 8 + n <= len(raw), "header length"
    hdr = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = hdr.pop("__metadata__", None)
    assert meta is None or all(isinstance(v, str) for v in meta.values())
    ents = sorted(hdr.items(), key=lambda kv: tuple(kv[1]["data_offsets"]))
    pos = 0
    for name, e in ents:
        b, end = e["data_offsets"]
        numel = 1
        for d in e["shape"]:
            numel *= d
        assert b == pos, f"{name}: hole/overlap at {pos}"
        assert end - b == numel * DT[e["dtype"]][1], f"{name}: size"
        assert b % DT[e["dtype"]][1] == 0, f"{name}: unaligned"
        pos = end
    assert 8 + n + pos == len(raw), "buffer not fully indexed"
    print(f"{path}: OK, {len(ents)} tensors, header {n} bytes, metadata {meta}")


def main():
    if len(sys.argv) > 1:
        for p in sys.argv[1:]:
            check(p)
        return
    g = torch.Generator().manual_seed(1234)
    w = torch.randn(4, 6, generator=g, dtype=torch.float32)
    special = torch.tensor([0.0, -0.0, 1.0, -2.5, 3.0e38, 1e-40, float("inf"), float("-inf"), 1.00390625, 1.01171875],
                           dtype=torch.float32)
    tensors = {
        "model.w": ("F32", w),
        "model.w_bf16": ("BF16", w.to(torch.bfloat16)),
        "model.special_bf16": ("BF16", special.to(torch.bfloat16)),
        "model.w_f16": ("F16", w[:2].to(torch.float16)),
        "ids": ("I64", torch.tensor([3, -1, 100277], dtype=torch.int64)),
        "scalar": ("F64", torch.tensor(0.125, dtype=torch.float64)),
        "empty": ("F32", torch.zeros(0, 3)),
    }
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, "..", "golden", "io")
    os.makedirs(out, exist_ok=True)
    write(os.path.join(out, "ref.safetensors"), tensors, {"format": "pt"})
    # fp32 values as their bit patterns (exact; JSON has no inf).
    bits = lambda t: [struct.unpack("<I", struct.pack("<f", v))[0] for v in t.flatten().tolist()]
    values = {"w_bits": bits(w), "special_bits": bits(special)}
    with open(os.path.join(out, "ref_values.json"), "w") as f:
        json.dump(values, f, indent=1)
        f.write("\n")
    check(os.path.join(out, "ref.safetensors"))


if __name__ == "__main__":
    main()
