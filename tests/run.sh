#!/bin/sh
# run.sh DIR - runs every tests/test_* binary in DIR, each under a time
# limit, and ends with one line CI can read: "N passed, N failed".
# The counts are cmocka test cases; a binary that crashes or times out
# counts one failure beyond what it reported.  With FERRY_FUZZ_DIR set,
# each fuzz target there runs briefly and counts as one test.
dir=${1:?usage: run.sh BUILD/tests}
suite_start=$(date +%s)
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
    t0=$(date +%s)
    timeout "$limit" "$t" >"$log" 2>&1
    rc=$?
    cat "$log"
    echo "=== $name: $(( $(date +%s) - t0 )) s"
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
# The fuzz targets (FERRY_FUZZ_DIR, set by make test): each runs for
# FERRY_FUZZ_TIME seconds on its corpus and counts as one test, failed when
# it finds a crash, a leak or a broken property (tests/fuzz/run.sh says
# where the reproducer is and how to rerun it).
if [ -n "$FERRY_FUZZ_DIR" ]; then
    fuzz_start=$(date +%s)
    for t in "$FERRY_FUZZ_DIR"/fuzz_*; do
        case "$t" in *.o|*.d) continue ;; esac
        [ -x "$t" ] || continue
        name=$(basename "$t")
        echo "=== $name"
        out=$(sh "$(dirname "$0")/fuzz/run.sh" "${FERRY_FUZZ_TIME:-4}" "$FERRY_FUZZ_DIR" "${name#fuzz_}")
        echo "$out"
        if echo "$out" | grep -q '^fuzz: 1 passed'; then
            passed=$((passed + 1))
        elif echo "$out" | grep -q '^fuzz: 0 passed, 0 failed, 1 skipped'; then
            skipped=$((skipped + 1))
        else
            failed=$((failed + 1))
            bad="$bad $name"
        fi
    done
    echo "=== fuzz targets: $(( $(date +%s) - fuzz_start )) s"
fi
echo "=== the suite: $(( $(date +%s) - suite_start )) s"
[ -n "$bad" ] && echo "failing binaries:$bad"
[ "$skipped" -gt 0 ] && echo "($skipped skipped)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
