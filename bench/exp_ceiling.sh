#!/bin/sh
# exp_ceiling.sh - the harness's own ceiling: open-loop sweeps against the
# echo server (no inference; every token at once) with both clients.  The
# highest rate it sustains (throughput within 5% of the offered rate,
# nothing failed) against what the cluster serves is the margin by which
# the harness stays out of its own measurements.
#   sh bench/exp_ceiling.sh            results in bench/results/ceiling/
set -u
cd "$(dirname "$0")/.." || exit 1
BENCH=${BENCH:-bin/ferry-bench}
RATES=${RATES:-250 500 1000 2000}
OUT=${OUT:-bench/results/ceiling}
mkdir -p "$OUT"
# the nng side authenticates like a router: a secret of its own for this run
SECRET=$OUT/kv.secret
rm -f "$SECRET"
(umask 077 && head -c 32 /dev/urandom >"$SECRET") || exit 1
$BENCH echo --nng tcp://127.0.0.1:17500 --secret "$SECRET" --http 18500 --threads 1 >"$OUT/echo.log" 2>&1 &
ECHO=$!
trap 'kill -TERM $ECHO 2>/dev/null; wait $ECHO 2>/dev/null' EXIT INT TERM
sleep 0.5
for backend in nng http; do
    url=tcp://127.0.0.1:17500
    [ $backend = http ] && url=http://127.0.0.1:18500
    for r in $RATES; do
        n=$((r * 4))
        $BENCH -b $backend -u $url --secret "$SECRET" -n $n --input-len 64 --output-len 16 --rate "$r" --seed 3 --no-progress \
            --label "$backend" >"$OUT/$backend-$r.txt" 2>>"$OUT/$backend.log"
    done
done
# the summary: offered, achieved, failures, send lag p99
for backend in nng http; do
    for r in $RATES; do
        f=$OUT/$backend-$r.txt
        ok=$(sed -n 's/^requests: *\([0-9]*\) total, [0-9]* sent, \([0-9]*\) ok, \([0-9]*\) failed/\2 \3/p' "$f")
        tput=$(sed -n 's/^request throughput (req\/s): *//p' "$f")
        lag=$(awk '/^send lag/ {print $6}' "$f")
        ttft=$(awk '/^TTFT/ {print $3}' "$f")
        echo "$backend offered $r req/s: achieved $tput req/s, ok/failed $ok, send lag p99 ${lag} ms, TTFT p50 ${ttft} ms"
    done
done | tee "$OUT/summary.txt"
