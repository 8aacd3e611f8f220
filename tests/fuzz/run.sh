#!/bin/sh
# run.sh SECONDS DIR [NAME...] - runs each libFuzzer target DIR/fuzz_NAME
# (every one in DIR when no NAME is given) for SECONDS seconds on its
# corpus, and prints one line per target.  The corpus a run grows is kept
# in build/fuzz/corpus/NAME (the seeds in tests/fuzz/corpus/NAME are only
# read).  A crash, a leak, a timeout (FUZZ_INPUT_TIMEOUT seconds for one
# input) or running out of memory fails the target: its reproducer is left
# in build/fuzz/crashes/ and the line says how to rerun it.
#
# Exit status: 0 when every target passed or was skipped (a target that
# needs the default model, without it), 1 otherwise.  FUZZ_JOBS=N runs N
# targets at once; FUZZ_ARGS adds libFuzzer options to every run (e.g.
# -runs=10000000); FUZZ_LOGS is where the logs go (build/fuzz).
secs=${1:?usage: run.sh SECONDS DIR [NAME...]}
dir=${2:?usage: run.sh SECONDS DIR [NAME...]}
shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
crashes=$root/build/fuzz/crashes
work=$root/build/fuzz/corpus
per_input=${FUZZ_INPUT_TIMEOUT:-30}
mkdir -p "$crashes" "$work"

if [ $# -eq 0 ]; then
    for b in "$dir"/fuzz_*; do
        case "$b" in *.o|*.d) continue ;; esac
        [ -x "$b" ] && set -- "$@" "$(basename "$b" | sed 's/^fuzz_//')"
    done
fi

# run_one NAME: 0 passed, 2 skipped, 1 failed
run_one() {
    name=$1
    bin=$dir/fuzz_$name
    seeds=$root/tests/fuzz/corpus/$name
    dict=$root/tests/fuzz/$name.dict
    log=${FUZZ_LOGS:-$root/build/fuzz}/$name.log
    mkdir -p "$work/$name"
    set -- -max_total_time="$secs" -timeout="$per_input" -rss_limit_mb=2048 -print_final_stats=1 \
        -error_exitcode=1 -timeout_exitcode=1 -artifact_prefix="$crashes/$name-"
    [ -f "$dict" ] && set -- "$@" -dict="$dict"
    t0=$(date +%s)
    # shellcheck disable=SC2086
    (cd "$root" && "$bin" "$@" $FUZZ_ARGS "$work/$name" $( [ -d "$seeds" ] && echo "$seeds" )) >"$log" 2>&1
    rc=$?
    took=$(( $(date +%s) - t0 ))
    if [ "$rc" -eq 121 ] || grep -q '^fuzz: skipped:' "$log"; then
        echo "fuzz_$name: skipped: $(sed -n 's/^fuzz: skipped: //p' "$log" | head -n 1)"
        return 2
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -n 1)
    n=$(find "$work/$name" -type f | wc -l)
    if [ "$rc" -eq 0 ]; then
        echo "fuzz_$name: ok: ${runs:-?} runs in ${took} s (${speed:-?}/s), ${cov:-cov ?}, corpus $n"
        return 0
    fi
    art=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
    echo "fuzz_$name: FAILED (status $rc) after ${runs:-?} runs; the end of $log:"
    grep -v '^#[0-9]' "$log" | tail -n 40 | sed 's/^/    /'
    if [ -n "$art" ] && [ -f "$art" ]; then
        echo "fuzz_$name: reproducer: $art ($(wc -c <"$art") bytes); rerun it with:"
        echo "    $bin $art"
        echo "    (FUZZ_LOG=1 shows ferry's log lines; docs/fuzzing.md)"
        if [ "$(wc -c <"$art")" -le 4096 ]; then
            echo "fuzz_$name: the reproducer in base64 (base64 -d > repro):"
            base64 "$art" | sed 's/^/    /'
        fi
    fi
    return 1
}

failed=0
passed=0
skipped=0
jobs=${FUZZ_JOBS:-1}
if [ "$jobs" -le 1 ]; then
    for name in "$@"; do
        run_one "$name"
        case $? in 0) passed=$((passed + 1)) ;; 2) skipped=$((skipped + 1)) ;; *) failed=$((failed + 1)) ;; esac
    done
else
    # a pool of N: each target runs alone through this script, its lines
    # printed as it ends
    res=$(mktemp -d)
    printf '%s\n' "$@" | FUZZ_JOBS=1 xargs -P "$jobs" -I{} sh -c 'sh "$0" "$1" "$2" "$3" >"$4/$3.out" 2>&1; grep -v "^fuzz: [0-9]* passed" "$4/$3.out"' \
        "$0" "$secs" "$dir" {} "$res"
    for name in "$@"; do
        if grep -q '^fuzz: 1 passed' "$res/$name.out"; then
            passed=$((passed + 1))
        elif grep -q '^fuzz: 0 passed, 0 failed, 1 skipped' "$res/$name.out"; then
            skipped=$((skipped + 1))
        else
            failed=$((failed + 1))
        fi
    done
    rm -rf "$res"
fi
echo "fuzz: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
