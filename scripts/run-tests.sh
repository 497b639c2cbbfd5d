#!/usr/bin/env bash
# `make test`'s runner (docs/testing.md): ctest over the whole suite with every test's temporary files under one
# fresh directory (TMPDIR and TEST_TMPDIR point there), then scripts/check-test-run.py: the skips listed by
# reason (only a missing device or launcher may skip), and nothing left behind (in that directory, or new in
# /tmp). The output ends with ctest's summary (repeated after the checks). Exits non-zero if ctest failed or a
# check failed.
# Usage: scripts/run-tests.sh BUILD_DIR [JOBS]
set -uo pipefail
build=$(cd "$1" && pwd)
jobs=${2:-$(nproc)}
root=$(cd "$(dirname "$0")/.." && pwd)
# A short path (OpenMPI keeps Unix sockets under TMPDIR; their paths are limited to 107 bytes).
tmp=$(mktemp -d /tmp/olmosft-test.XXXXXX)
before="$build/tmp-before.txt"
find /tmp -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort >"$before"
junit="$build/ctest-junit.xml"
rm -f "$junit"
log="$build/ctest-output.log"
# Passed tests' output is kept whole (ctest keeps 1 KB by default) so their "skipped:" lines reach the check.
(cd "$build" && TMPDIR="$tmp" TEST_TMPDIR="$tmp" ctest --output-on-failure -j "$jobs" --timeout 900 \
  --test-output-size-passed 4194304 --output-junit "$junit") | tee "$log"
rc=${PIPESTATUS[0]}
python3 "$root/scripts/check-test-run.py" --junit "$junit" --tmp-dir "$tmp" --tmp-before "$before"
rc2=$?
rm -rf "$tmp" "$before"
echo "== ctest summary (repeated) =="
sed -n '/tests passed, .* tests failed out of/,$p' "$log"
[ $rc -eq 0 ] && [ $rc2 -eq 0 ]
