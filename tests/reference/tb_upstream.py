#!/usr/bin/env python3
"""TensorBoard's own reader (tensorboard's EventAccumulator, pinned 2.21.0) on olmosft's event files.

Fixture mode (no arguments): reads tests/golden/io/tb_trainer/events.out.tfevents.1700000000.olmosft-fixture (written
by our TensorBoardWriter through the trainer's train::tensorboard_scalars for the rows of metrics.jsonl next to it,
with a fixed clock: OLMOSFT_WRITE_TB_FIXTURE=1 build/io_tb_upstream_test) with
EventAccumulator(path, size_guidance={SCALARS: 0}) and writes what it got to accumulator.json:
    {"tensorboard": version, "event_file": name, "scalars": {tag: [[wall_time, step, value], ...]}}
tests/unit/io/io_tb_upstream_test.cpp compares that with metrics.jsonl. It also checks the same thing here.

Run mode (--run RUN_DIR): reads RUN_DIR/tensorboard (a real `olmosft train` run with log.tensorboard: true) and
RUN_DIR/metrics.jsonl and requires every tag's steps and values to equal the rows (value == float32(row value));
prints a summary, exit 1 on any difference.

Run with deps/venv-reference/bin/python (scripts/install-deps.sh --reference).
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import tensorboard
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

TB_VERSION = "2.21.0"
HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.normpath(os.path.join(HERE, "..", "golden", "io", "tb_trainer"))
EVENT_FILE = "events.out.tfevents.1700000000.olmosft-fixture"

# tag -> metrics.jsonl key (the trainer's contract, src/train/metrics.h); the two MoE tags are derived.
DIRECT = {
    "train/loss": "loss", "train/ce": "ce", "train/lm_z": "lm_z", "train/moe_lb": "moe_lb",
    "train/router_z": "router_z", "train/grad_norm": "grad_norm", "train/lr": "lr", "train/tokens": "tokens",
    "perf/tokens_per_s": "tokens_per_s", "perf/step_time": "step_time", "perf/mfu": "mfu",
}


def read(path):
    acc = EventAccumulator(path, size_guidance={SCALARS: 0})
    acc.Reload()
    return {tag: [(e.wall_time, e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def f32(x):
    """float32 rounding of a metrics.jsonl value as the writer does it (NaN is written to JSON as null)."""
    return float(np.float32(float("nan") if x is None else x))


def expected(rows):
    want = {}
    for r in rows:
        for tag, key in DIRECT.items():
            want.setdefault(tag, []).append((r["step"], f32(r[key])))
        if r["moe_required_buffer_factor"]:
            want.setdefault("train/moe_required_buffer_factor_max", []).append(
                (r["step"], f32(max(r["moe_required_buffer_factor"]))))
            want.setdefault("train/moe_dropped_tokens", []).append(
                (r["step"], f32(sum(r["moe_dropped_tokens"]))))
    return want


def compare(got, rows):
    """Returns a list of differences (empty = equal)."""
    want = expected(rows)
    bad = []
    if sorted(got) != sorted(want):
        bad.append("tags: got %s, want %s" % (sorted(got), sorted(want)))
    for tag in sorted(set(got) & set(want)):
        g = [(s, v) for _, s, v in got[tag]]
        w = want[tag]
        if len(g) != len(w):
            bad.append("%s: %d events, want %d" % (tag, len(g), len(w)))
            continue
        for (gs, gv), (ws, wv) in zip(g, w):
            same = gv == wv or (math.isnan(gv) and math.isnan(wv))
            if gs != ws or not same:
                bad.append("%s: got (step %d, %r), want (step %d, %r)" % (tag, gs, gv, ws, wv))
    return bad


def load_rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", help="an olmosft run directory (tensorboard/ + metrics.jsonl) to check")
    args = ap.parse_args()
    assert tensorboard.__version__ == TB_VERSION, "want tensorboard==%s, have %s" % (TB_VERSION, tensorboard.__version__)

    if args.run:
        got = read(os.path.join(args.run, "tensorboard"))
        rows = load_rows(os.path.join(args.run, "metrics.jsonl"))
        bad = compare(got, rows)
        n = sum(len(v) for v in got.values())
        print("tb_upstream: tensorboard %s EventAccumulator on %s: %d tags, %d scalars, %d metrics.jsonl rows: %s"
              % (tensorboard.__version__, args.run, len(got), n, len(rows), "EQUAL" if not bad else "DIFFERENT"))
        for b in bad[:20]:
            print("  " + b)
        sys.exit(1 if bad else 0)

    got = read(os.path.join(FIXTURE, EVENT_FILE))
    bad = compare(got, load_rows(os.path.join(FIXTURE, "metrics.jsonl")))
    assert not bad, "\n".join(bad)
    # One line per tag; floats as repr (exact round trip of the float32 values and the float64 wall times).
    lines = ["%s: %s" % (json.dumps(tag), json.dumps([list(e) for e in got[tag]])) for tag in sorted(got)]
    text = '{"tensorboard": %s, "event_file": %s, "scalars": {\n%s\n}}\n' % (
        json.dumps(tensorboard.__version__), json.dumps(EVENT_FILE), ",\n".join(lines))
    assert json.loads(text)["scalars"] == {t: [list(e) for e in got[t]] for t in got}
    dst = os.path.join(FIXTURE, "accumulator.json")
    with open(dst, "w") as f:
        f.write(text)
    print("tb_upstream: wrote %s (%d tags, %d scalars)" % (dst, len(got), sum(len(v) for v in got.values())))


if __name__ == "__main__":
    main()
