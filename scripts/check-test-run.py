#!/usr/bin/env python3
"""The checks `make test` runs after ctest (scripts/run-tests.sh; docs/testing.md).

1. Skips, listed by reason. A test may skip only for a missing device or launcher: every skip (a test ctest
   reports as skipped, and every "skipped:" line a passing test prints for a part it did not run) must carry
   one of the ALLOWED reasons below. Anything else, or a skipped test that names no reason, fails the run.
2. Hygiene. Every test writes its temporary files under TMPDIR (a fresh directory for the run) and removes
   them: anything left there fails the run, naming it, as does anything new directly in /tmp.

Standard library only (it runs before any virtual environment exists).
"""
import argparse
import collections
import os
import re
import sys
import time
import xml.etree.ElementTree as ET

# (reason, pattern a skip message must contain). Only missing hardware or launchers.
ALLOWED = [
    ("device: no CUDA GPU", re.compile(r"skipped: no CUDA device")),
    ("device: CPU without AVX512-BF16 (oneDNN bf16 matmul)", re.compile(r"skipped: this CPU has no oneDNN bf16 matmul")),
    ("launcher: mpirun not installed", re.compile(r"skipped: mpirun not found")),
    ("launcher: kubectl not installed", re.compile(r"skipped: kubectl not found")),
]
# A line that says something was skipped: "skipped: ...", "SKIP: ...", "*** SKIPPED ...", "skip: ...".
SKIP_LINE = re.compile(r"^\s*(\*+\s*)?skip(ped)?\b.*$", re.IGNORECASE | re.MULTILINE)


def reason_of(text):
    for reason, pattern in ALLOWED:
        if pattern.search(text):
            return reason
    return None


def check_skips(junit):
    """Returns (skips by reason, list of problems)."""
    by_reason = collections.defaultdict(list)
    problems = []
    root = ET.parse(junit).getroot()
    cases = root.iter("testcase")
    count = 0
    for case in cases:
        count += 1
        name = case.get("name")
        out = "".join(e.text or "" for e in case.iter("system-out"))
        skipped = case.get("status") == "skipped" or case.find("skipped") is not None
        if skipped:
            reason = reason_of(out)
            if reason is None:
                tail = " | ".join(out.strip().splitlines()[-4:])
                problems.append(f"{name}: skipped without an allowed reason (output ends: {tail[:300]})")
            else:
                by_reason[reason].append(name)
            continue
        for m in SKIP_LINE.finditer(out):
            line = m.group(0).strip()
            reason = reason_of(line)
            if reason is None:
                problems.append(f"{name}: a part was skipped without an allowed reason: {line[:200]}")
            else:
                by_reason[reason].append(f"{name} (part: {line[:120]})")
    if count == 0:
        problems.append(f"{junit}: no test cases")
    return by_reason, problems


def check_tmp(tmp_dir, tmp_before):
    problems = []
    left = sorted(os.listdir(tmp_dir)) if os.path.isdir(tmp_dir) else []
    for name in left:
        problems.append(f"left in the run's TMPDIR by a test: {os.path.join(tmp_dir, name)}")
    with open(tmp_before) as f:
        before = set(line.rstrip("\n") for line in f)
    own = os.path.basename(tmp_dir.rstrip("/"))
    new = set(os.listdir("/tmp")) - before - {own}
    if new:  # every test has ended; what another process is still writing (a compiler's temp file) goes soon
        time.sleep(2)
        new &= set(os.listdir("/tmp"))
    for name in sorted(new):
        problems.append(f"new in /tmp after the run (a test ignored TMPDIR?): /tmp/{name}")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--junit", required=True, help="ctest --output-junit file")
    ap.add_argument("--tmp-dir", required=True, help="the TMPDIR the tests ran with")
    ap.add_argument("--tmp-before", required=True, help="the names in /tmp before the run, one a line")
    a = ap.parse_args()
    if not os.path.isfile(a.junit):
        print(f"check-test-run: FAIL: {a.junit} missing (ctest did not run?)")
        return 1
    by_reason, problems = check_skips(a.junit)
    problems += check_tmp(a.tmp_dir, a.tmp_before)
    total = sum(len(v) for v in by_reason.values())
    print(f"check-test-run: {total} skips, by reason (allowed: a missing device or launcher):")
    for reason in sorted(by_reason):
        names = by_reason[reason]
        print(f"  {reason}: {len(names)}: {', '.join(names[:6])}{' ...' if len(names) > 6 else ''}")
    for p in problems:
        print(f"check-test-run: FAIL: {p}")
    print(f"check-test-run: {'FAILED' if problems else 'passed'} ({len(problems)} problems)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
