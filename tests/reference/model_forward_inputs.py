#!/usr/bin/python3
"""Inputs and expected outputs for the `olmosft forward` e2e test (tests/e2e/model_forward.sh), derived from
the Olmo 3 fixture tests/golden/model/olmo3_tiny/ (batch.safetensors, outputs.safetensors, expected.json)
so the shell test needs no safetensors reader:

  tokens.json / segments.json / trained.json   [[...], [...]] per row (trained = label_mask: token t is a
                                               training target, scored given the tokens before it)
  tokens_i64.npy (int64), segments_i32.npy (int32), trained_u8.npy (uint8)   the same as numpy files
  expected.json    ce over the trained targets (the fixture's float64 value), their count, and the
                   reference log-prob of the next token per position (null where untrained), float64 truth
                   cast to float32 as stored in outputs.safetensors

  /usr/bin/python3 tests/reference/model_forward_inputs.py
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_safetensors as st  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SRC = os.path.join(REPO, "tests", "golden", "model", "olmo3_tiny")
OUT = os.path.join(REPO, "tests", "golden", "model", "olmo3_tiny_forward")


def main():
    batch, _ = st.load(os.path.join(SRC, "batch.safetensors"))
    outs, _ = st.load(os.path.join(SRC, "outputs.safetensors"))
    exp = json.load(open(os.path.join(SRC, "expected.json")))
    ids = batch["input_ids"].numpy().astype(np.int64)
    seg = batch["segment_ids"].numpy().astype(np.int32)
    lab = batch["label_mask"].numpy().astype(np.uint8)
    loss_mask = batch["loss_mask"].numpy()
    lp = outs["logprobs"].numpy().astype(np.float64)
    os.makedirs(OUT, exist_ok=True)
    for name, a in (("tokens", ids), ("segments", seg), ("trained", lab)):
        with open(os.path.join(OUT, name + ".json"), "w") as f:
            json.dump(a.tolist(), f, separators=(",", ":"))
            f.write("\n")
    np.save(os.path.join(OUT, "tokens_i64.npy"), ids)
    np.save(os.path.join(OUT, "segments_i32.npy"), seg)
    np.save(os.path.join(OUT, "trained_u8.npy"), lab)
    logprobs = [[float(lp[b, t]) if loss_mask[b, t] else None for t in range(ids.shape[1])]
                for b in range(ids.shape[0])]
    expected = {
        "source": "tests/golden/model/olmo3_tiny (model_olmo3.py)",
        "ce": exp["loss"]["ce"],
        "trained_targets": int(loss_mask.sum()),
        "all_next_token_targets": int(sum(d["length"] - 1 for d in exp["batch"]["documents"])),
        "logprobs": logprobs,
    }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, separators=(",", ":"))
        f.write("\n")
    print(f"olmo3_tiny_forward: {ids.shape} tokens, {expected['trained_targets']} trained targets")


if __name__ == "__main__":
    main()
