#!/usr/bin/env bash
# Regenerate every golden fixture under tests/golden/ from the independent references in tests/reference/.
# The generators are deterministic: a rerun reproduces the committed files (check with `git status`).
# `make test` never runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3  # Debian's interpreter (has jinja2); a pyenv python3 on PATH does not

# --- tok: cl100k corpus ids (npm gpt-tokenizer + tokenizers.js), chat-template renders (jinja2), label masks
scripts/install-deps.sh >/dev/null
node tests/reference/tok_corpus.mjs
"$PY" tests/reference/tok_templates.py
node tests/reference/tok_labels.mjs
