#!/usr/bin/env bash
# The binary's front door: help lists the verbs, unknown verbs and flags fail clearly with exit code 2.
set -u
bin=$1
fails=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fails=$((fails+1)); fi; }
out=$("$bin" --help); rc=$?
check "--help exits 0" "[ $rc -eq 0 ]"
check "--help lists selfcheck" "grep -q '^  selfcheck' <<<\"\$out\""
check "--help lists demo" "grep -q '^  demo' <<<\"\$out\""
err=$("$bin" frobnicate 2>&1); rc=$?
check "unknown verb exits 2" "[ $rc -eq 2 ]"
check "unknown verb is named" "grep -q \"unknown verb 'frobnicate'\" <<<\"\$err\""
err=$("$bin" selfcheck --no-such-flag 2>&1); rc=$?
check "unknown flag exits 2" "[ $rc -eq 2 ]"
check "unknown flag is named" "grep -q 'no-such-flag' <<<\"\$err\""
err=$("$bin" selfcheck --threads -3 2>&1); rc=$?
check "bad --threads exits 2" "[ $rc -eq 2 ]"
out=$("$bin" selfcheck --threads 1); rc=$?
check "selfcheck passes" "[ $rc -eq 0 ] && grep -q 'SELFCHECK all passed' <<<\"\$out\""
echo "$((9 - fails)) passed, $fails failed"
[ $fails -eq 0 ]
