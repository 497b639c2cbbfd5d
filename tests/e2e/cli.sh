#!/usr/bin/env bash
# The binary's front door: help lists the verbs, unknown verbs and flags fail clearly with exit code 2.
set -u
bin=$1
. "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"  # pass, fails, check, finish
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
# OpenMP waits passively by default (core/threads.h default_passive_omp_wait); a user's setting wins.
out=$(env -u OMP_WAIT_POLICY "$bin" selfcheck --threads 1)
check "OMP_WAIT_POLICY defaults to passive" "grep -q 'omp_wait_policy=passive' <<<\"\$out\""
out=$(OMP_WAIT_POLICY=active "$bin" selfcheck --threads 1)
check "a user's OMP_WAIT_POLICY is kept" "grep -q 'omp_wait_policy=active' <<<\"\$out\""
# check model: the runbook's traps a config shows (model/traps.h), and special ids against a tokenizer
out=$("$bin" check model olmo-hybrid-7b); rc=$?
check "check model passes the released Olmo Hybrid 7B shape (NoPE, dolma2 ids)" \
  "[ $rc -eq 0 ] && grep -q '^ok   rope: 8 attention layers without RoPE (NoPE)' <<<\"\$out\""
out=$("$bin" check model "$(dirname "$0")/../golden/model/hf_olmo_hybrid/rope_negeig" --tokenizer builtin:bytes); rc=$?
check "check model fails a tokenizer whose eos the config does not have (exit 1, named)" \
  "[ $rc -eq 1 ] && grep -q '^FAIL eos matches the tokenizer: tokenizer eos 258' <<<\"\$out\""
out=$("$bin" check model no-such-preset 2>&1); rc=$?
check "check model on an unknown preset exits 2 naming it" "[ $rc -eq 2 ] && grep -q 'no-such-preset' <<<\"\$out\""
finish
