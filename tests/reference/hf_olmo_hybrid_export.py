"""Our Olmo Hybrid export loads in transformers and means the same model there (the olmo_hybrid twin of
hf_olmo3.py's part 3). Run from the reference environment:

  deps/venv-reference/bin/python tests/reference/hf_olmo_hybrid_export.py --olmosft BUILD/olmosft

`olmosft export hf --dtype fp32|bf16` of tests/golden/model/hf_olmo_hybrid/rope_negeig (a transformers
save_pretrained directory, read through our loader's name mapping) is loaded with
OlmoHybridForCausalLM.from_pretrained (nothing missing or unexpected is allowed); tests/golden/model/
hf_olmo_hybrid_export/expected.json records the sha256 of every exported file and transformers' next-token
log-probs on that directory's tokens.json / segments.json (the fixture's batch; each document run alone). The
script also runs `olmosft forward` on both exports and asserts agreement. Checked without Python by
tests/e2e/hf_export_oracle.sh (re-export -> same sha256 -> `olmosft forward` reproduces the log-probs).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_olmo_hybrid as hyb  # noqa: E402  (hides fla / causal_conv1d before transformers is imported)
import hf_olmo3 as o3  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import OlmoHybridForCausalLM  # noqa: E402

SOURCE = os.path.join(hyb.OUT, "rope_negeig")
EXPORT_OUT = os.path.join(os.path.dirname(hyb.OUT), "hf_olmo_hybrid_export")


def write_inputs():
    fix = load_file(os.path.join(SOURCE, "oracle.safetensors"))
    tokens, segments = fix["input_ids"].tolist(), fix["segment_ids"].tolist()
    os.makedirs(EXPORT_OUT, exist_ok=True)
    for name, v in (("tokens.json", tokens), ("segments.json", segments)):
        with open(os.path.join(EXPORT_OUT, name), "w") as f:
            json.dump(v, f)
            f.write("\n")
    return tokens, segments


def load_export(out):
    model, info = OlmoHybridForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager",
                                                        output_loading_info=True)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    o3.check(not bad, f"{out}: transformers did not load every tensor: {bad}")
    return model.eval()


def crosscheck_one(olmosft, d, tmp, tokens, segments):
    out = os.path.join(tmp, d)
    subprocess.run([olmosft, "export", "hf", "--from", SOURCE, "--out", out, "--dtype", d], check=True,
                   stdout=subprocess.DEVNULL)
    files = {f: o3.sha256(os.path.join(out, f)) for f in sorted(os.listdir(out))}
    model = load_export(out)
    lp32 = o3.hf_logprobs(model, tokens, segments, torch.float32)
    with hyb.keep_float64():  # transformers in float64 (hf_olmo_hybrid.py's NOTE_F64): the truth for both
        lp64 = o3.hf_logprobs(hyb.as_float64(load_export(out)), tokens, segments, torch.float64)
    fwd = os.path.join(tmp, d + ".forward.json")
    subprocess.run([olmosft, "forward", "--model", out, "--tokens", os.path.join(EXPORT_OUT, "tokens.json"),
                    "--segments", os.path.join(EXPORT_OUT, "segments.json"), "--out", fwd], check=True,
                   stdout=subprocess.DEVNULL)
    ours = json.load(open(fwd))["logprobs"]
    ce32, n = o3.mean_rows(lp32)
    ce_ours, n_ours = o3.mean_rows(ours)
    gaps = {"hf_f32_vs_hf_f64_max_abs": o3.sig3(o3.max_abs_rows(lp32, lp64)),
            "olmosft_vs_hf_f64_max_abs": o3.sig3(o3.max_abs_rows(ours, lp64)),
            "olmosft_vs_hf_f32_max_abs": o3.sig3(o3.max_abs_rows(ours, lp32)),
            "olmosft_vs_hf_mean_ce_abs": o3.sig3(abs(ce_ours - ce32))}
    print(f"export {d}: {n} targets, transformers mean CE {ce32:.9g}, olmosft {ce_ours:.9g}; {json.dumps(gaps)}")
    o3.check(n == n_ours, f"{d}: {n_ours} targets from olmosft forward, {n} from transformers")
    # two float32 implementations, each a few 1e-5 from the float64 truth on the bf16-rounded weights: the
    # issue's 1e-4 per token between them; ours against the truth as transformers' own float32 is (2x)
    o3.check(gaps["olmosft_vs_hf_f32_max_abs"] < 1e-4, f"{d}: olmosft forward and transformers disagree")
    o3.check(gaps["olmosft_vs_hf_f64_max_abs"] < 2 * max(gaps["hf_f32_vs_hf_f64_max_abs"], 5e-6),
             f"{d}: olmosft forward is further from transformers' float64 run than its float32 run is")
    return {"files": files, "trained_targets": n, "mean_ce": ce32, "logprobs": lp32, "gaps": gaps}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--olmosft", required=True, help="built olmosft binary")
    a = ap.parse_args()
    o3.check(transformers.__version__ == hyb.PINNED_TRANSFORMERS, f"transformers {transformers.__version__}")
    torch.set_num_threads(1)
    tokens, segments = write_inputs()
    result = {"source": "tests/reference/hf_olmo_hybrid_export.py: `olmosft export hf --from "
                        "tests/golden/model/hf_olmo_hybrid/rope_negeig --dtype D` loaded by transformers "
                        "OlmoHybridForCausalLM.from_pretrained(dtype=float32, eager), its torch GDN path",
              "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
              "inputs": "tests/golden/model/hf_olmo_hybrid_export/{tokens,segments}.json, each document run alone",
              "note": "logprobs[b][t] = log p(token[b][t+1] | its document up to t), null where t is the last "
                      "token of its document (the `olmosft forward` default targets); float32 run",
              "exports": {}}
    tmp = tempfile.mkdtemp(prefix="hf_olmo_hybrid_export.")
    try:
        for d in ("fp32", "bf16"):
            result["exports"][d] = crosscheck_one(os.path.abspath(a.olmosft), d, tmp, tokens, segments)
    finally:
        shutil.rmtree(tmp)
    with open(os.path.join(EXPORT_OUT, "expected.json"), "w") as f:
        json.dump(result, f)
        f.write("\n")


if __name__ == "__main__":
    main()
