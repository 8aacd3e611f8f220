#!/bin/sh
# exp_routers.sh - several routers (cluster.etcd): the request throughput
# of one router against two over the same workers, closed loop at
# CONC requests in flight (short prompts and answers, so that the control
# plane weighs as much as it can against inference), ROUNDS interleaved
# rounds each.  `ferry serve` runs etcd, two routers, PREFILL prefill and
# DECODE decode workers on loopback ports from BASE.
#   sh bench/exp_routers.sh            results in bench/results/routers/
set -u
cd "$(dirname "$0")/.." || exit 1
BENCH=${BENCH:-bin/ferry-bench}
OUT=${OUT:-bench/results/routers}
BASE=${BASE:-27400}
CONC=${CONC:-32}
N=${N:-300}
ROUNDS=${ROUNDS:-3}
PREFILL=${PREFILL:-1}
DECODE=${DECODE:-1}
mkdir -p "$OUT"
rm -rf "$OUT/run"
R0=tcp://127.0.0.1:$BASE
R1=tcp://127.0.0.1:$((BASE + 2))
bin/ferry serve -c configs/local.ini \
    --set serve.run_dir="$OUT/run" --set serve.routers=2 \
    --set cluster.etcd=http://127.0.0.1:$((BASE + 100)) --set cluster.etcd_ttl=2s \
    --set router.listen=$R0 --set router.events=tcp://127.0.0.1:$((BASE + 1)) --set router.http= \
    --set prefill.count="$PREFILL" --set prefill.listen=tcp://127.0.0.1:$((BASE + 10)) --set prefill.metrics= \
    --set decode.count="$DECODE" --set decode.listen=tcp://127.0.0.1:$((BASE + 20)) --set decode.metrics= \
    --set decode.spec=none >"$OUT/serve.log" 2>&1 &
SERVE=$!
trap 'kill -TERM $SERVE 2>/dev/null; wait $SERVE 2>/dev/null' EXIT INT TERM
for _ in $(seq 600); do grep -q "cluster ready" "$OUT/serve.log" && break; sleep 0.2; done
grep -q "cluster ready" "$OUT/serve.log" || { cat "$OUT/serve.log"; exit 1; }
# the second router sees the workers within a watch round or two
sleep 2
for round in $(seq "$ROUNDS"); do
    for urls in "$R0" "$R0,$R1"; do
        label=1router
        [ "$urls" != "$R0" ] && label=2routers
        $BENCH -u "$urls" --secret "$OUT/run/kv.secret" -n "$N" -C "$CONC" --input-len 16 --output-len 4 --seed $round \
            --no-progress --label $label >"$OUT/$label-$round.txt" 2>>"$OUT/bench.log"
    done
done
for label in 1router 2routers; do
    for round in $(seq "$ROUNDS"); do
        f=$OUT/$label-$round.txt
        tput=$(sed -n 's/^request throughput (req\/s): *//p' "$f")
        ok=$(sed -n 's/^requests: *\([0-9]*\) total, [0-9]* sent, \([0-9]*\) ok, \([0-9]*\) failed/\2 ok, \3 failed/p' "$f")
        ttft=$(awk '/^TTFT/ {print $3}' "$f")
        echo "$label round $round: $tput req/s ($ok), TTFT p50 $ttft ms"
    done
done | tee "$OUT/summary.txt"
