#!/usr/bin/env bash
# Fresh machine -> installed project -> full offline test suite.
#
# Each test file runs in its own pytest process. The project's commands search in a child process
# (ralm/search_process.py), but tests/test_retrieval.py also checks the in-process retriever, and a
# long session that mixed in-process JVM searches with torch work once died of a SIGSEGV in a JVM
# thread; short processes keep that apart. A failure in any file still fails the run.
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
