#!/usr/bin/python3
"""Golden fixture for the attention kernel, computed independently with PyTorch.

Attention is written out with an explicit materialised mask (same segment id, causal, optional sliding
window, negative id = padding), GQA by repeating kv heads, fp32; gradients come from autograd of
L = sum(o * dout). Writes tests/golden/attn/attn_reference.json.

Run: /usr/bin/python3 tests/reference/attn_reference.py
"""
import json
import math
import os

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden", "attn", "attn_reference.json")


def segments(lens):
    s, doc = [], 0
    for n in lens:
        if n < 0:
            s += [-1] * (-n)
        else:
            s += [doc] * n
            doc += 1
    return s


def attention(q, k, v, seg, window, scale):
    # q [B,T,H,D], k [B,T,Hkv,D], v [B,T,Hkv,Dv], seg [B,T] int
    B, T, H, D = q.shape
    G = H // k.shape[2]
    kk = k.repeat_interleave(G, dim=2)  # kv head j serves q heads j*G .. j*G+G-1
    vv = v.repeat_interleave(G, dim=2)
    i = torch.arange(T).view(T, 1)
    j = torch.arange(T).view(1, T)
    mask = (seg.unsqueeze(2) >= 0) & (seg.unsqueeze(2) == seg.unsqueeze(1)) & (j <= i)
    if window > 0:
        mask = mask & (i - j < window)
    mask = mask.unsqueeze(1)  # [B,1,T,T]
    valid = (seg >= 0)  # [B,T]
    s = torch.einsum("bihd,bjhd->bhij", q, kk) * scale
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # [B,H,T]; -inf on padding rows
    # Padding rows are fully masked: give them a dummy diagonal so softmax is defined, then zero them.
    eye = torch.eye(T, dtype=torch.bool).view(1, 1, T, T)
    pad_rows = (~valid).view(B, 1, T, 1)
    s = torch.where(pad_rows & eye, torch.zeros_like(s), s)
    p = torch.softmax(s, dim=-1)
    o = torch.einsum("bhij,bjhd->bihd", p, vv)
    o = o * valid.view(B, T, 1, 1).to(o.dtype)
    return o, lse


def flat(x):
    out = []
    for f in x.detach().reshape(-1).tolist():
        out.append(None if math.isinf(f) else float("%.9g" % f))
    return out


def make_case(name, rows, H, Hkv, D, Dv, window, scale, seed):
    g = torch.Generator().manual_seed(seed)
    B, T = len(rows), sum(abs(n) for n in rows[0])
    seg = torch.tensor([segments(r) for r in rows], dtype=torch.int64)
    assert seg.shape == (B, T)
    q = torch.randn(B, T, H, D, generator=g, dtype=torch.float32).requires_grad_()
    k = torch.randn(B, T, Hkv, D, generator=g, dtype=torch.float32).requires_grad_()
    v = torch.randn(B, T, Hkv, Dv, generator=g, dtype=torch.float32).requires_grad_()
    dout = torch.randn(B, T, H, Dv, generator=g, dtype=torch.float32)
    o, lse = attention(q, k, v, seg, window, scale)
    (o * dout).sum().backward()
    return {
        "name": name, "B": B, "T": T, "H": H, "Hkv": Hkv, "D": D, "Dv": Dv, "window": window, "scale": scale,
        "seg": seg.reshape(-1).tolist(), "q": flat(q), "k": flat(k), "v": flat(v), "dout": flat(dout),
        "o": flat(o), "lse": flat(lse), "dq": flat(q.grad), "dk": flat(k.grad), "dv": flat(v.grad),
    }


def main():
    torch.set_num_threads(1)
    cases = [
        make_case("gqa_window24_packed_padding", [[30, 1, 40, -9], [-5, 75]], 4, 2, 8, 8, 24, 8 ** -0.5, 1),
        make_case("mha_full_two_docs_scale03", [[20, 50]], 2, 2, 16, 8, 0, 0.3, 2),
        make_case("mqa_one_doc_T65", [[65]], 3, 1, 4, 4, 0, 0.5, 3),
    ]
    doc = {"generator": "tests/reference/attn_reference.py", "torch": torch.__version__,
           "layout": "q[B,T,H,D] k[B,T,Hkv,D] v[B,T,Hkv,Dv] o/dout[B,T,H,Dv] lse[B,H,T] (null = -inf) seg[B,T]",
           "cases": cases}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    tmp = OUT + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, OUT)
    print("wrote", os.path.normpath(OUT), os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    main()
