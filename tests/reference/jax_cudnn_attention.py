"""The form of cuDNN's fused attention as XLA's CUDA backend expects it: JAX lowers
jax.nn.dot_product_attention(..., implementation="cudnn") for the `cuda` platform (no GPU needed to lower),
and this records the two custom calls it emits (`__cudnn$fmhaSoftmax`, `__cudnn$fmhaSoftmaxBackward`):
operand and result types, layouts and the parsed backend_config. tests/unit/xla/xla_cudnn_attention_test.cpp
checks that src/xla/ops_attention_cudnn.cpp emits the same calls for the same shapes. Run from the JAX
reference environment (scripts/install-deps.sh --reference: deps/venv-jax, deps/pypi/reference-jax.txt):

  deps/venv-jax/bin/python tests/reference/jax_cudnn_attention.py

Cases: B 2, T 256, 4 query heads, 2 key/value heads (GQA), head dim 64, scale 0.125, causal; window 0 (full)
and 128 (a query sees itself and the 127 keys before it, the window of kernels/attention.h).
"""
import json
import os
import re

import jax
import jax.numpy as jnp
from jax import export

B, T, H, HKV, D, SCALE = 2, 256, 4, 2, 64, 0.125
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


if __name__ == "__main__":
    main()
