"""Upstream oracle for Olmo 3 dense: Hugging Face transformers' own Olmo3ForCausalLM (pinned in
deps/pypi/reference.txt), run from the reference environment deps/venv-reference.

  deps/venv-reference/bin/python tests/reference/hf_olmo3.py --olmosft BUILD/olmosft

1. Self-checks of the oracle (fail loudly):
   - the transformers and torch versions are the pinned ones;
   - Olmo 3 applies YaRN only to full-attention layers: a tiny config with YaRN and mixed layer_types gives
     the sliding and the full layers' rotary embeddings DIFFERENT inv_freq (sliding = default RoPE, full =
     YaRN), from both the per-layer-type `rope_parameters` form and the legacy `rope_scaling` form of
     config.json; an all-sliding model gives identical logits with YaRN on and off, a mixed one does not.
2. tests/golden/model/hf_olmo3_tiny/: a tiny random Olmo3ForCausalLM (seeded; vocab 256, hidden 32, 4 layers
   sliding/full/sliding/full, window 12 < T = 40, YaRN x4 on the full layers) written by `save_pretrained`
   (config.json, generation_config.json, model.safetensors), plus oracle.safetensors (input_ids, transformers'
   logits and per-token cross-entropy in float32 and float64) and oracle.json (versions, measured gaps).
   Checked by tests/unit/model/model_hf_oracle_test.cpp.
3. tests/golden/model/hf_olmo3_export/: `olmosft export hf --dtype fp32|bf16` of tests/golden/model/olmo3_tiny
   (our own fixture) is loaded with `Olmo3ForCausalLM.from_pretrained`; expected.json records the sha256 of
   every exported file and transformers' next-token log-probs on tests/golden/model/olmo3_tiny_forward's
   tokens (each document run alone). The script also runs `olmosft forward` on both exports and asserts
   agreement. Checked without Python by tests/e2e/hf_export_oracle.sh (re-export -> same sha256 ->
   `olmosft forward` reproduces the recorded log-probs).

Deterministic: fixed seeds, one thread, eager attention; a rerun rewrites the same bytes (JSON floats are
printed with repr, so they round-trip exactly). See docs/model_reference.md ("Upstream oracle").
"""
import argparse
import copy
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import Olmo3Config, Olmo3ForCausalLM

PINNED_TRANSFORMERS = "5.23.0"
PINNED_TORCH = "2.15.0"

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
GOLDEN = os.path.join(REPO, "tests", "golden", "model")
TINY_OUT = os.path.join(GOLDEN, "hf_olmo3_tiny")
EXPORT_OUT = os.path.join(GOLDEN, "hf_olmo3_export")
OLMO3_TINY = os.path.join(GOLDEN, "olmo3_tiny")
FORWARD_INPUTS = os.path.join(GOLDEN, "olmo3_tiny_forward")

SEED_WEIGHTS = 20261203
SEED_TOKENS = 11
B, T = 2, 40


def die(msg):
    print("hf_olmo3.py: FAILED: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        die(msg)


def sig3(x):
    return float(f"{x:.3g}")


def rope_full_yarn():
    return {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
            "beta_fast": 32.0, "beta_slow": 1.0}


def tiny_config(layer_types=None, full_rope=None, **over):
    layer_types = layer_types or ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    kw = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=len(layer_types),
              num_attention_heads=2, num_key_value_heads=1, hidden_act="silu", max_position_embeddings=128,
              rms_norm_eps=1e-6, attention_bias=False, sliding_window=12, layer_types=layer_types,
              tie_word_embeddings=False, pad_token_id=0, bos_token_id=None, eos_token_id=1,
              rope_parameters={"full_attention": full_rope or rope_full_yarn(),
                               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    kw.update(over)
    cfg = Olmo3Config(**kw)
    cfg._attn_implementation = "eager"
    return cfg


def init_weights(model, seed):
    """Linear ~ N(0, 1/fan_in), embedding ~ N(0, 1), RMSNorm gains 1 + 0.2 N(0, 1) (so that the gains matter);
    drawn in float64 from one seeded generator in state-dict order, rounded once to float32."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=g, dtype=torch.float64)
            elif "embed_tokens" in name:
                v = torch.randn(p.shape, generator=g, dtype=torch.float64)
            else:
                v = torch.randn(p.shape, generator=g, dtype=torch.float64) / math.sqrt(p.shape[1])
            p.copy_(v.to(p.dtype))


def default_inv_freq(theta, dim):
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))


# --------------------------------------------------------------------------------------------------- 1
def self_checks():
    check(transformers.__version__ == PINNED_TRANSFORMERS,
          f"transformers {transformers.__version__}, pinned {PINNED_TRANSFORMERS} (deps/pypi/reference.txt)")
    check(torch.__version__.split("+")[0] == PINNED_TORCH, f"torch {torch.__version__}, pinned {PINNED_TORCH}")
    findings = {}

    def rotary_of(cfg):
        torch.manual_seed(0)
        return Olmo3ForCausalLM(cfg).model.rotary_emb

    dim = 16
    # (a) per-layer-type rope_parameters (what transformers 5.x itself writes) and (b) the legacy form of the
    # released Olmo 3 config.json: rope_theta + rope_scaling at the top level.
    legacy = dict(rope_parameters=None, rope_theta=500000.0,
                  rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                "beta_fast": 32.0, "beta_slow": 1.0})
    for form, cfg, theta in (("rope_parameters", tiny_config(), 10000.0),
                             ("legacy rope_scaling", tiny_config(**legacy), 500000.0)):
        re = rotary_of(cfg)
        s, f = re.sliding_attention_inv_freq, re.full_attention_inv_freq
        print(f"[{form}] rope_parameters = {cfg.rope_parameters}")
        print(f"[{form}] sliding inv_freq {s.tolist()}\n[{form}] full    inv_freq {f.tolist()}")
        check(not torch.equal(s, f), f"[{form}] sliding and full layers got the SAME inv_freq: YaRN is applied to "
              "every layer (the transformers 5.0-5.12 regression) or to none")
        check(torch.equal(s, default_inv_freq(theta, dim)), f"[{form}] sliding inv_freq is not default RoPE")
        check(re.sliding_attention_attention_scaling == 1.0, f"[{form}] sliding attention scaling != 1")
        want = 0.1 * math.log(4.0) + 1.0
        check(abs(re.full_attention_attention_scaling - want) < 1e-12,
              f"[{form}] full attention scaling {re.full_attention_attention_scaling} != {want}")
        check(torch.equal(f[:1], s[:1]) and f[-1] == s[-1] / 4.0,
              f"[{form}] full inv_freq is not YaRN (first kept, last divided by the factor)")

    # The transformers quirk of the legacy form: the top-level rope_theta reaches only full_attention; the
    # sliding layers fall back to Olmo3Config.default_theta (500000). Recorded, not asserted.
    q = tiny_config(rope_parameters=None, rope_theta=10000.0, rope_scaling=legacy["rope_scaling"])
    findings["legacy_rope_scaling_with_rope_theta_10000"] = {
        "full_attention_rope_theta": q.rope_parameters["full_attention"]["rope_theta"],
        "sliding_attention_rope_theta": q.rope_parameters["sliding_attention"]["rope_theta"]}
    # A flat (not per-layer-type) rope_parameters, as transformers 5.0-5.12 wrote it: recorded.
    flat = tiny_config(rope_parameters=dict(rope_full_yarn()))
    findings["flat_rope_parameters_yarn"] = {k: flat.rope_parameters.get(k) for k in
                                             ("full_attention", "sliding_attention")}
    print("findings:", json.dumps(findings))

    # Functional: YaRN on vs off changes nothing when every layer is sliding, and changes the logits when a
    # full layer exists.
    ids = torch.randint(2, 256, (1, T), generator=torch.Generator().manual_seed(3))

    def logits_of(layer_types, full_rope):
        m = Olmo3ForCausalLM(tiny_config(layer_types, full_rope))
        init_weights(m, 5)
        with torch.no_grad():
            return m(ids).logits

    off = {"rope_type": "default", "rope_theta": 10000.0}
    all_s = ["sliding_attention"] * 4
    d_s = (logits_of(all_s, rope_full_yarn()) - logits_of(all_s, off)).abs().max().item()
    mixed = ["sliding_attention", "full_attention"] * 2
    d_m = (logits_of(mixed, rope_full_yarn()) - logits_of(mixed, off)).abs().max().item()
    print(f"YaRN on vs off: all-sliding max|diff| {d_s}, mixed {d_m:.3g}")
    check(d_s == 0.0, f"all-sliding model: YaRN on vs off differ by {d_s}: YaRN reaches sliding layers")
    check(d_m > 1e-2, f"mixed model: YaRN on vs off differ by only {d_m}: YaRN does not reach full layers")
    findings["yarn_on_vs_off_logits_max_abs"] = {"all_sliding": d_s, "mixed": sig3(d_m)}
    return findings


# --------------------------------------------------------------------------------------------------- 2
def per_token_ce(logits, ids):
    """CE of token t+1 given tokens <= t, per position t < T-1, in the logits' dtype."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                           reduction="none").reshape(ids.shape[0], -1)


def make_tiny(findings):
    torch.manual_seed(0)
    model = Olmo3ForCausalLM(tiny_config()).eval()
    init_weights(model, SEED_WEIGHTS)
    ids = torch.randint(2, 256, (B, T), generator=torch.Generator().manual_seed(SEED_TOKENS))
    with torch.no_grad():
        lg32 = model(ids).logits
        m64 = copy.deepcopy(model).double()
        lg64 = m64(ids).logits
        ce32, ce64 = per_token_ce(lg32, ids), per_token_ce(lg64, ids)
        sd = copy.deepcopy(model)
        sd.config._attn_implementation = "sdpa"
        for layer in sd.model.layers:
            layer.self_attn.config = sd.config
        lg_sdpa = sd(ids).logits
    check(lg32.dtype == torch.float32 and lg64.dtype == torch.float64, "unexpected logits dtypes")

    if os.path.isdir(TINY_OUT):
        shutil.rmtree(TINY_OUT)
    model.save_pretrained(TINY_OUT)
    # The saved directory is what we compare against: reload it and require identical logits.
    re = Olmo3ForCausalLM.from_pretrained(TINY_OUT, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        check(torch.equal(re(ids).logits, lg32), "from_pretrained of the saved directory changes the logits")
    saved = json.load(open(os.path.join(TINY_OUT, "config.json")))
    check("full_attention" in saved.get("rope_parameters", {}), "save_pretrained did not write per-layer-type "
          "rope_parameters: " + json.dumps(saved.get("rope_parameters")))

    save_file({"input_ids": ids.to(torch.int32).contiguous(),
               "logits_f32": lg32.contiguous(), "logits_f64": lg64.contiguous(),
               "ce_f32": ce32.contiguous(), "ce_f64": ce64.contiguous()},
              os.path.join(TINY_OUT, "oracle.safetensors"), metadata={"format": "pt"})
    gap = {"logits_f32_vs_f64_max_abs": sig3((lg32.double() - lg64).abs().max().item()),
           "logits_max_abs": sig3(lg64.abs().max().item()),
           "ce_f32_vs_f64_max_abs": sig3((ce32.double() - ce64).abs().max().item()),
           "mean_ce_f32_vs_f64_abs": sig3(abs(ce32.double().mean().item() - ce64.mean().item())),
           "logits_eager_vs_sdpa_f32_max_abs": sig3((lg32 - lg_sdpa).abs().max().item())}
    print("hf_olmo3_tiny:", json.dumps(gap))
    meta = {"source": "tests/reference/hf_olmo3.py (transformers Olmo3ForCausalLM, save_pretrained)",
            "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
            "attn_implementation": "eager", "weights_seed": SEED_WEIGHTS, "tokens_seed": SEED_TOKENS,
            "batch": [B, T], "mean_ce_f64": ce64.mean().item(),
            "note": "logits_f64/ce_f64: the same float32 weights run by transformers in float64 (model.double()); "
                    "transformers computes the RoPE angles in float32 even then (Olmo3RotaryEmbedding.forward). "
                    "ce[b, t] = -log p(input_ids[b, t+1] | input_ids[b, :t+1]); no padding, one document per row.",
            "gaps": gap, "transformers_findings": findings}
    with open(os.path.join(TINY_OUT, "oracle.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    return gap


# --------------------------------------------------------------------------------------------------- 3
def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def documents(tokens, segments):
    """[(row, start, length)] of the contiguous document runs."""
    out = []
    for b, (tr, sr) in enumerate(zip(tokens, segments)):
        s = 0
        for t in range(1, len(tr) + 1):
            if t == len(tr) or sr[t] != sr[s]:
                out.append((b, s, t - s))
                s = t
    return out


def hf_logprobs(model, tokens, segments, dtype):
    """Next-token log-probs per position, each document run alone; None where no target in the document."""
    rows = [[None] * len(r) for r in tokens]
    for b, s, n in documents(tokens, segments):
        ids = torch.tensor([tokens[b][s:s + n]])
        with torch.no_grad():
            lp = torch.log_softmax(model(ids).logits.to(dtype), dim=-1)[0]
        for t in range(n - 1):
            rows[b][s + t] = lp[t, ids[0, t + 1]].item()
    return rows


def max_abs_rows(a, b):
    m = 0.0
    for ra, rb in zip(a, b):
        for x, y in zip(ra, rb):
            check((x is None) == (y is None), "log-prob rows have nulls at different positions")
            if x is not None:
                m = max(m, abs(x - y))
    return m


def mean_rows(a):
    v = [x for r in a for x in r if x is not None]
    return -sum(v) / len(v), len(v)


def export_crosscheck(olmosft):
    tokens = json.load(open(os.path.join(FORWARD_INPUTS, "tokens.json")))
    segments = json.load(open(os.path.join(FORWARD_INPUTS, "segments.json")))
    ours_ref = json.load(open(os.path.join(FORWARD_INPUTS, "expected.json")))  # model_olmo3.py float64 truth
    result = {"source": "tests/reference/hf_olmo3.py: `olmosft export hf --from tests/golden/model/olmo3_tiny "
                        "--dtype D` loaded by transformers Olmo3ForCausalLM.from_pretrained(dtype=float32, eager)",
              "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
              "inputs": "tests/golden/model/olmo3_tiny_forward/{tokens,segments}.json, each document run alone",
              "note": "logprobs[b][t] = log p(token[b][t+1] | its document up to t), null where t is the last "
                      "token of its document (the `olmosft forward` default targets); float32 run, values as "
                      "python floats", "exports": {}}
    tmp = tempfile.mkdtemp(prefix="hf_olmo3_export.")
    try:
        for d in ("fp32", "bf16"):
            out = os.path.join(tmp, d)
            subprocess.run([olmosft, "export", "hf", "--from", OLMO3_TINY, "--out", out, "--dtype", d], check=True,
                           stdout=subprocess.DEVNULL)
            files = {f: sha256(os.path.join(out, f)) for f in sorted(os.listdir(out))}
            model = Olmo3ForCausalLM.from_pretrained(out, attn_implementation="eager", dtype=torch.float32).eval()
            cfgd = model.config.rope_parameters
            check(cfgd["sliding_attention"]["rope_type"] == "default" and cfgd["full_attention"]["rope_type"] == "yarn",
                  f"{d} export: transformers reads rope as {cfgd}")
            lp32 = hf_logprobs(model, tokens, segments, torch.float32)
            lp64 = hf_logprobs(copy.deepcopy(model).double(), tokens, segments, torch.float64)
            fwd = os.path.join(tmp, d + ".forward.json")
            subprocess.run([olmosft, "forward", "--model", out, "--tokens", os.path.join(FORWARD_INPUTS, "tokens.json"),
                            "--segments", os.path.join(FORWARD_INPUTS, "segments.json"), "--out", fwd], check=True,
                           stdout=subprocess.DEVNULL)
            ours = json.load(open(fwd))["logprobs"]
            ce32, n = mean_rows(lp32)
            ce_ours, n_ours = mean_rows(ours)
            gaps = {"hf_f32_vs_f64_max_abs": sig3(max_abs_rows(lp32, lp64)),
                    "olmosft_vs_hf_f32_max_abs": sig3(max_abs_rows(ours, lp32)),
                    "olmosft_vs_hf_mean_ce_abs": sig3(abs(ce_ours - ce32))}
            if d == "fp32":  # transformers vs our own reference (model_olmo3.py, float64) on its trained targets
                trained = [[x if y is not None else None for x, y in zip(ra, rb)]
                           for ra, rb in zip(lp32, ours_ref["logprobs"])]
                gaps["hf_f32_vs_model_olmo3_py_f64_trained_max_abs"] = sig3(max_abs_rows(trained, ours_ref["logprobs"]))
            print(f"export {d}: {n} targets, transformers mean CE {ce32:.9g}, olmosft {ce_ours:.9g}; {json.dumps(gaps)}")
            check(n == n_ours, f"{d}: {n_ours} targets from olmosft forward, {n} from transformers")
            check(gaps["olmosft_vs_hf_f32_max_abs"] < 5e-5, f"{d}: olmosft forward and transformers disagree")
            result["exports"][d] = {"files": files, "trained_targets": n, "mean_ce": ce32, "logprobs": lp32,
                                    "gaps": gaps}
    finally:
        shutil.rmtree(tmp)
    os.makedirs(EXPORT_OUT, exist_ok=True)
    with open(os.path.join(EXPORT_OUT, "expected.json"), "w") as f:
        json.dump(result, f)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--olmosft", help="built olmosft binary (for part 3); without it part 3 is skipped")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    findings = self_checks()
    make_tiny(findings)
    if a.olmosft:
        export_crosscheck(os.path.abspath(a.olmosft))
    else:
        print("hf_olmo3.py: no --olmosft: tests/golden/model/hf_olmo3_export not regenerated", file=sys.stderr)


if __name__ == "__main__":
    main()
