#!/usr/bin/env bash
# Fresh machine -> installed project -> full offline test suite.
#
# Each test file runs in its own pytest process: the Pyserini JVM lives inside the Python process,
# and once (in one of several full runs) a long session that had mixed many JVM searches with
# Lightning/torch work died of an unhandled SIGSEGV in a JVM search thread. Short processes keep
# one file's JVM use apart from another's; a failure in any file still fails the run.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit $?
status=0
log=$(mktemp)
for f in tests/test_*.py; do
    echo "== $f"
    .venv/bin/python -m pytest -q -p no:cacheprovider "$f" "$@" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then status=$rc; echo "== $f FAILED (exit $rc)"; fi  # 5: none collected
done
# One closing line for the whole suite, summed over the files' pytest summaries.
count() { grep -Eo "[0-9]+ $1" "$log" | awk '{s += $1} END {print s + 0}'; }
passed=$(count passed)
echo "total: $passed passed, $(count failed) failed, $(count skipped) skipped, $(count xfailed) xfailed"
rm -f "$log"
[ "$passed" -gt 0 ] || status=1
exit $status
