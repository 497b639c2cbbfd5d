#!/usr/bin/env python3
"""Upstream oracle for the olmosft KDA delta-rule kernels: transformers' Kimi Linear chunk_kimi_delta_attention
and recurrent_kimi_delta_attention, the torch paths of its KDA layer (transformers==5.23.0, torch==2.15.0, pinned in
deps/pypi/reference.txt; run with deps/venv-reference/bin/python). (Later transformers revisions call them
torch_chunk_kda / torch_recurrent_kda; 5.23.0 has these names.)

Upstream conventions (src/transformers/models/kimi_linear/modeling_kimi_linear.py): q, k [B,T,H,K], v [B,T,H,V],
g = log decay per key channel [B,T,H,K] (<= 0), beta [B,T,H]; the functions compute in float32 whatever the input
dtype, optionally L2-normalise q and k (use_qk_l2norm_in_kernel: x / sqrt(sum x^2 + 1e-6), as our l2norm) and
always scale q by 1/sqrt(K). They take no cu_seqlens (swallowed by **kwargs), so every document is run as its
own call here; tests/unit/kernels/kda_upstream_test.cpp runs our kernels on the same documents PACKED in one row (segment
ids, boundaries mid-chunk) and compares with these per-document results.

Per case, for the inputs q k v g beta and a seeded output cotangent do (loss = sum(o * do)), the fixture holds
  up32_chunk  chunk_kimi_delta_attention (chunk 64), float32 as upstream runs it: o and autograd dq dk dv dg dbeta
  up32_rec    recurrent_kimi_delta_attention, float32
  up64_chunk  the same chunk function's source with torch.float32 -> torch.float64 and .float() -> .double() (its
              float64 twin),
and the measured gaps between them (the basis of the C++ tolerances). Inputs are float32-representable, so the
float32 and float64 runs see the same values. Cases:
  l2norm   use_qk_l2norm_in_kernel=True on raw q, k (the layer's call; ours: l2norm kernel + delta rule)
  prenorm  use_qk_l2norm_in_kernel=False on q, k that are already unit vectors (the delta-rule kernel alone)

Writes tests/golden/kda/kda_upstream.bin (little-endian tensors, concatenated: float32 for the inputs and the up32
results, which are exactly float32 values, float64 for up64) and kda_upstream.json (config, segment ids, measured
gaps, name -> {shape, dtype f4|f8, byte_offset}). Seeded: a rerun reproduces both files.
"""
import importlib.util
import inspect
import json
import os
import tempfile

import torch
import torch.nn.functional as F
import transformers
from transformers.models.kimi_linear import modeling_kimi_linear as kimi

TORCH_VERSION, TRANSFORMERS_VERSION = "2.15.0", "5.23.0"
H, K, V = 2, 16, 32
DOCS = [23, 1, 5, 40, 8]  # one row; boundaries at 23, 24, 29, 69 fall inside chunks of 16 and of 64
PAD = 3                   # padding tokens (segment id -1) at the end of the row
L = sum(DOCS) + PAD
A = [0.03, 1.5]           # exp(A_log) per head: head 0 remembers across ~40 tokens, head 1 forgets in a few
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden", "kda")


def float64_twin(fn):
    """fn's own source with every float32 cast made float64 (torch.float32 -> torch.float64, .float() -> .double()),
    compiled in its module's namespace."""
    fn = inspect.unwrap(fn)
    src = inspect.getsource(fn)
    lines = src.splitlines()
    while lines[0].lstrip().startswith("@"):  # drop the hub-kernel decorator
        lines.pop(0)
    src = "\n".join(lines) + "\n"
    assert "torch.float32" in src, "expected the upstream function to cast to torch.float32"
    src64 = src.replace("torch.float32", "torch.float64").replace(".float()", ".double()")
    assert "float32" not in src64 and ".float(" not in src64 and "torch.float)" not in src64
    ns = dict(vars(inspect.getmodule(fn)))
    exec(compile(src64, "<float64 %s>" % fn.__name__, "exec"), ns)
    return ns[fn.__name__]


def rel(a, b):
    """max |a - b| / max |b| (as kdatest::rel_err)."""
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def run(fn, inputs, do, dtype, l2norm, **kw):
    """One document: o and the gradients of sum(o * do) w.r.t. q k v g beta, as float64 tensors [T, ...]."""
    leaves = [x.to(dtype).unsqueeze(0).requires_grad_(True) for x in inputs]
    o, _ = fn(*leaves, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=l2norm, **kw)
    assert o.dtype == dtype
    (o * do.to(dtype).unsqueeze(0)).sum().backward()
    return [o.detach()[0].double()] + [x.grad[0].double() for x in leaves]


def main():
    assert torch.__version__.split("+")[0] == TORCH_VERSION, "want torch==%s, have %s" % (TORCH_VERSION, torch.__version__)
    assert transformers.__version__ == TRANSFORMERS_VERSION, \
        "want transformers==%s, have %s" % (TRANSFORMERS_VERSION, transformers.__version__)
    # The torch path, not a hub kernel: neither `kernels` (the hub loader) nor flash-linear-attention is importable,
    # and the decorated functions give bit-identical results to their undecorated bodies (checked below).
    assert importlib.util.find_spec("kernels") is None and importlib.util.find_spec("fla") is None
    chunk32, rec32 = kimi.chunk_kimi_delta_attention, kimi.recurrent_kimi_delta_attention
    chunk64, rec64 = float64_twin(chunk32), float64_twin(rec32)

    torch.manual_seed(0)
    dt = torch.float64
    seg = []
    for i, n in enumerate(DOCS):
        seg += [i] * n
    seg += [-1] * PAD
    r32 = lambda x: x.float().double()  # noqa: E731  float32-representable float64
    f = torch.randn(L, H, K, dtype=dt)
    dt_bias = 0.5 * torch.randn(H, K, dtype=dt)
    g = r32(-torch.tensor(A, dtype=dt)[:, None] * F.softplus(f + dt_bias))
    beta = r32(2 * torch.sigmoid(torch.randn(L, H, dtype=dt)))  # (0, 2): our allow_neg_eigval range
    v = r32(torch.randn(L, H, V, dtype=dt))
    do = r32(torch.randn(L, H, V, dtype=dt))
    q_raw, k_raw = r32(torch.randn(L, H, K, dtype=dt)), r32(torch.randn(L, H, K, dtype=dt))
    unit = lambda x: r32(x / x.norm(dim=-1, keepdim=True))  # noqa: E731
    cases = {"l2norm": (True, q_raw, k_raw), "prenorm": (False, unit(torch.randn(L, H, K, dtype=dt)),
                                                        unit(torch.randn(L, H, K, dtype=dt)))}
    pad = torch.tensor([s < 0 for s in seg])
    for x in (g, beta, v, do, q_raw, k_raw):
        x[pad] = 0  # padding carries zeros (our kernels ignore those tokens; upstream never sees them)

    tensors, gaps = {}, {}
    names = ["o", "dq", "dk", "dv", "dg", "dbeta"]
    for case, (l2, q, k) in cases.items():
        inputs = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "do": do}
        for n, x in inputs.items():
            tensors["%s/%s" % (case, n)] = x
        packed = {var: [torch.zeros(L, H, V, dtype=dt)] + [torch.zeros_like(x) for x in (q, k, v, g, beta)]
                  for var in ("up32_chunk", "up32_rec", "up64_chunk", "up64_rec")}
        t0 = 0
        for n in DOCS:
            sl = slice(t0, t0 + n)
            doc = [x[sl] for x in (q, k, v, g, beta)]
            outs = {"up32_chunk": run(chunk32, doc, do[sl], torch.float32, l2),
                    "up32_rec": run(rec32, doc, do[sl], torch.float32, l2),
                    "up64_chunk": run(chunk64, doc, do[sl], torch.float64, l2),
                    "up64_rec": run(rec64, doc, do[sl], torch.float64, l2)}
            # The decorated (dispatching) functions ran the torch bodies: bit-identical to the undecorated ones.
            for fn in (chunk32, rec32):
                same = run(inspect.unwrap(fn), doc, do[sl], torch.float32, l2)
                key = "up32_chunk" if fn is chunk32 else "up32_rec"
                assert all(torch.equal(a, b) for a, b in zip(same, outs[key])), "hub kernel dispatch?"
            for var, res in outs.items():
                for dst, src in zip(packed[var], res):
                    dst[sl] = src
            t0 += n
        ref = packed["up64_chunk"]
        for var in ("up32_chunk", "up32_rec", "up64_rec"):
            gaps["%s/%s_vs_up64_chunk" % (case, var)] = {nm: rel(a, b) for nm, a, b in zip(names, packed[var], ref)}
        for var in ("up32_chunk", "up32_rec", "up64_chunk"):
            for nm, x in zip(names, packed[var]):
                tensors["%s/%s_%s" % (case, nm, var)] = x
        assert max(gaps["%s/up64_rec_vs_up64_chunk" % case].values()) < 1e-12, "float64 twins disagree"

    manifest = {
        "generator": "tests/reference/kda_upstream.py (transformers %s chunk_kimi_delta_attention / "
                     "recurrent_kimi_delta_attention, torch %s)"
                     % (transformers.__version__, torch.__version__),
        "B": 1, "L": L, "H": H, "K": K, "V": V, "scale": K ** -0.5, "docs": DOCS, "segments": seg,
        "cases": {c: {"use_qk_l2norm_in_kernel": cases[c][0]} for c in cases}, "upstream_chunk_size": 64,
        "measured_rel_gaps": gaps, "tensors": {},
    }
    blobs, off = [], 0  # off in bytes; float32-exact tensors (inputs, up32_*) are stored as <f4, the rest as <f8
    for name in sorted(tensors):
        x = tensors[name].contiguous().to(torch.float64)
        f4 = "up64" not in name
        if f4:
            assert torch.equal(x.float().double(), x), name + " is not float32-representable"
        data = x.numpy().astype("<f4" if f4 else "<f8").tobytes()
        manifest["tensors"][name] = {"shape": list(x.shape), "dtype": "f4" if f4 else "f8", "byte_offset": off}
        blobs.append(data)
        off += len(data)
    os.makedirs(OUT, exist_ok=True)
    for fname, data in (("kda_upstream.bin", b"".join(blobs)),
                        ("kda_upstream.json", (json.dumps(manifest, indent=1) + "\n").encode())):
        fd, tmp = tempfile.mkstemp(dir=OUT)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(OUT, fname))
    for k_, v_ in gaps.items():
        print("  %-36s %s" % (k_, " ".join("%s %.1e" % kv for kv in v_.items())))
    print("kda_upstream: wrote %d tensors (%d bytes) to %s" % (len(tensors), off, os.path.normpath(OUT)))


if __name__ == "__main__":
    main()
