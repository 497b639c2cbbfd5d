"""The form of cuDNN's fused attention as XLA's CUDA backend expects it: JAX lowers
jax.nn.dot_product_attention(..., implementation="cudnn") for the `cuda` platform (no GPU needed to lower),
and this records the two custom calls it emits (`__cudnn$fmhaSoftmax`, `__cudnn$fmhaSoftmaxBackward`):
operand and result types, layouts and the parsed backend_config. tests/unit/xla/xla_cudnn_attention_test.cpp
checks that src/xla/ops_attention_cudnn.cpp emits the same calls for the same shapes. Run from the JAX
reference environment (scripts/install-deps.sh --reference: deps/venv-jax, deps/pypi/reference-jax.txt):

  deps/venv-jax/bin/python tests/reference/jax_cudnn_attention.py

Cases: B 2, T 256, 4 query heads, 2 key/value heads (GQA), head dim 64, scale 0.125, causal; window 0 (full)
and 128 (a query sees itself and the 127 keys before it, the window of kernels/attention.h).

Packed rows (several documents per row): JAX's packed ("ragged") form, which jax.nn does not expose: the cuDNN
dot_product_attention of jax._src.cudnn.fused_attention_stablehlo with per-row segment lengths [B, M] and
offsets [B, M + 1] and mask PADDING_CAUSAL (what MaxText's cudnn_flash_jax packing calls), M 4, the same two
windows (packed_w*.json). JAX refuses to trace that form unless a Hopper GPU is present; the capability check is
replaced here (lowering does not depend on it). And the values JAX's own _fix_seqlen_offsets makes of a packed
batch (packed_offsets.json): the lengths and offsets compacted over the batch and multiplied by the stride of
a token. JAX 0.10.2 multiplies the key/value offsets by the *query* head count, wrong under GQA (fixed upstream
by jax-ml/jax PR #39521, commit be78ee0, measured on B300s: "kv_offsets pointed past the start of each packed
segment"); the fixed values are recorded by calling the same function with a query of the key/value head
count, which is exactly what the fix computes.
"""
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax import export
from jax._src.cudnn import fused_attention_stablehlo as fa

B, T, H, HKV, D, SCALE = 2, 256, 4, 2, 64, 0.125
M = 4  # packed form: the most segments a row may hold (max_seg_per_batch)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden", "xla", "cudnn_fmha")
TARGETS = ("__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward")


def lower(window):
    def f(q, k, v):
        kw = {"local_window_size": (window - 1, 0)} if window > 0 else {}
        return jax.nn.dot_product_attention(q, k, v, scale=SCALE, is_causal=True, implementation="cudnn", **kw)

    def loss(q, k, v, dout):
        return (f(q, k, v).astype(jnp.float32) * dout).sum()

    s = jax.ShapeDtypeStruct
    args = [s((B, T, H, D), jnp.bfloat16), s((B, T, HKV, D), jnp.bfloat16), s((B, T, HKV, D), jnp.bfloat16),
            s((B, T, H, D), jnp.float32)]
    checks = [export.DisabledSafetyCheck.custom_call(t) for t in TARGETS]
    exp = export.export(jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=["cuda"], disabled_checks=checks)
    return exp(*args).mlir_module()


def lower_packed(window):
    fa.check_compute_capability = lambda capability: True  # JAX's Hopper gate for the packed form (no GPU here)

    def f(q, k, v, seqlen, offsets):
        return fa.dot_product_attention(q, k, v, q_seqlen=seqlen, kv_seqlen=seqlen, q_offsets=offsets,
                                        kv_offsets=offsets, scale=SCALE, mask_type=fa.MaskType.PADDING_CAUSAL,
                                        sliding_window_length=window if window > 0 else None)

    def loss(q, k, v, dout, seqlen, offsets):
        return (f(q, k, v, seqlen, offsets).astype(jnp.float32) * dout).sum()

    s = jax.ShapeDtypeStruct
    args = [s((B, T, H, D), jnp.bfloat16), s((B, T, HKV, D), jnp.bfloat16), s((B, T, HKV, D), jnp.bfloat16),
            s((B, T, H, D), jnp.float32), s((B, M), jnp.int32), s((B, M + 1), jnp.int32)]
    checks = [export.DisabledSafetyCheck.custom_call(t) for t in TARGETS]
    exp = export.export(jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=["cuda"], disabled_checks=checks)
    return exp(*args).mlir_module()


# A packed batch (documents of row 0: 100, 60, 90 tokens then 6 padding; row 1: 200 then 56 padding) in the
# API's form and what _fix_seqlen_offsets gives cuDNN.
PACKED_ROWS = [[100, 60, 90], [200]]


def packed_offsets():
    seqlen = np.full((B, M), -1, np.int32)
    offsets = np.full((B, M + 1), -1, np.int32)
    for r, docs in enumerate(PACKED_ROWS):
        seqlen[r, :len(docs)] = docs
        offsets[r, :len(docs)] = np.cumsum([0] + docs[:-1])
    q = jnp.zeros((B, T, H, D), jnp.bfloat16)
    q_kv = jnp.zeros((B, T, HKV, D), jnp.bfloat16)  # a query with the key heads: the upstream fix's stride
    k = jnp.zeros((B, T, HKV, D), jnp.bfloat16)
    q_len, _, q_off, _ = fa._fix_seqlen_offsets(seqlen, seqlen, offsets, offsets, q, k)
    _, kv_len, _, kv_off = fa._fix_seqlen_offsets(seqlen, seqlen, offsets, offsets, q_kv, k)
    return {"case": {"B": B, "T": T, "heads": H, "kv_heads": HKV, "head_dim": D, "max_segments": M,
                     "rows": PACKED_ROWS, "jax": jax.__version__},
            "q_seqlen": np.asarray(q_len).tolist(), "kv_seqlen": np.asarray(kv_len).tolist(),
            "q_offsets": np.asarray(q_off).tolist(), "kv_offsets": np.asarray(kv_off).tolist()}


def layouts(text):
    return [[int(x) for x in m.split(",") if x.strip()] for m in re.findall(r"dense<\[?([-0-9, ]*)\]?>", text)]


def calls(module):
    out = {}
    for line in module.splitlines():
        m = re.search(r"stablehlo\.custom_call @(\S+)\(", line)
        if not m:
            continue
        target = m.group(1)
        cfg = re.search(r'backend_config = "(.*?)", operand_layouts', line).group(1)
        ops = re.search(r"operand_layouts = \[(.*?)\], result_layouts", line).group(1)
        res = re.search(r"result_layouts = \[(.*?)\]\}", line).group(1)
        sig = re.search(r"\} : \((.*?)\) -> \((.*?)\)", line)
        out[target] = {
            "target": target,
            "api_version": int(re.search(r"api_version = (\d+)", line).group(1)),
            "backend_config_text": cfg.replace("\\22", '"'),  # as XLA reads it: compared byte for byte
            "backend_config": json.loads(cfg.replace("\\22", '"')),
            "operand_layouts": layouts(ops),
            "result_layouts": layouts(res),
            "operand_types": [t.strip() for t in sig.group(1).split(", ")],
            "result_types": [t.strip() for t in sig.group(2).split(", ")],
        }
    assert set(out) == set(TARGETS), f"expected {TARGETS}, lowered {sorted(out)}"
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    for window in (0, 128):
        c = calls(lower(window))
        c["case"] = {"B": B, "T": T, "heads": H, "kv_heads": HKV, "head_dim": D, "scale": SCALE,
                     "window": window, "jax": jax.__version__}
        path = os.path.join(OUT, f"causal_w{window}.json")
        with open(path, "w") as f:
            json.dump(c, f, indent=1, sort_keys=True)
            f.write("\n")
        print("wrote", path)
        c = calls(lower_packed(window))
        c["case"] = {"B": B, "T": T, "heads": H, "kv_heads": HKV, "head_dim": D, "scale": SCALE,
                     "window": window, "max_segments": M, "jax": jax.__version__}
        path = os.path.join(OUT, f"packed_w{window}.json")
        with open(path, "w") as f:
            json.dump(c, f, indent=1, sort_keys=True)
            f.write("\n")
        print("wrote", path)
    path = os.path.join(OUT, "packed_offsets.json")
    with open(path, "w") as f:
        json.dump(packed_offsets(), f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
