#!/bin/sh
# run.sh DIR - runs every tests/test_* binary in DIR, each under a time
# limit, and ends with one line CI can read: "N passed, N failed".
# The counts are cmocka test cases; a binary that crashes or times out
# counts one failure beyond what it reported.
dir=${1:?usage: run.sh BUILD/tests}
limit=${FERRY_TEST_TIMEOUT:-900}
passed=0
failed=0
skipped=0
bad=""
for t in "$dir"/test_*; do
    case "$t" in *.o|*.d) continue ;; esac
    [ -x "$t" ] || continue
    name=$(basename "$t")
    echo "=== $name"
    log=$(mktemp)
    timeout "$limit" "$t" >"$log" 2>&1
    rc=$?
    cat "$log"
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
    s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
    rm -f "$log"
    passed=$((passed + ${p:-0}))
    failed=$((failed + ${f:-0}))
    skipped=$((skipped + ${s:-0}))
    if [ "$rc" -ne 0 ] && [ "${f:-0}" -eq 0 ]; then
        failed=$((failed + 1))
        echo "=== $name exited with status $rc"
    fi
    [ "$rc" -ne 0 ] && bad="$bad $name"
done
[ -n "$bad" ] && echo "failing binaries:$bad"
[ "$skipped" -gt 0 ] && echo "($skipped skipped)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
