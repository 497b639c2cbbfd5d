# Shared by tests/e2e/*.sh (sourced after `set -u`; not a test itself: CMake globs tests/e2e/*.sh only).
#   check NAME CONDITION   CONDITION is eval'ed (quote what it expands); prints "ok: NAME" or "FAIL: NAME"
#   finish [LABEL]         the script's last line: prints the counts, returns 1 when a check failed
pass=0
fails=0
check() { if eval "$2"; then echo "ok: $1"; pass=$((pass + 1)); else echo "FAIL: $1"; fails=$((fails + 1)); fi; }
finish() {
  echo "${1:+$1: }$pass passed, $fails failed"
  [ "$fails" -eq 0 ]
}
