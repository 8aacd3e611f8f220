#!/bin/sh
# exp_evict.sh - long-context requests served at once within a fixed
# kv_mem, every block kept against KV budgets (kv.evict): 12 requests of
# 2,048 prompt tokens and 32 output tokens, all sent at once to one
# colocated worker with kv_mem = 64 MiB (about 2,900 SmolLM2 tokens of f16
# KV) and 128-token steps; the budget is 20% of the prompt (410 tokens).
# The worker's /metrics is read every 0.2 s for the requests running.
#   sh bench/exp_evict.sh            results in bench/results/evict/
set -u
cd "$(dirname "$0")/.." || exit 1
. bench/cluster.sh
OUT=${OUT:-bench/results/evict}
POLICIES=${POLICIES:-none streaming h2o}
METRICS=http://127.0.0.1:17430
mkdir -p "$OUT"
for pol in $POLICIES; do
    cluster_start "evict-$pol" --set prefill.count=0 --set decode.count=1 --set decode.threads=2 \
        --set decode.kv_mem=64MiB --set decode.max_batch_tokens=128 --set decode.max_seqs=16 \
        --set decode.metrics=$METRICS --set kv.prefix_cache=false --set kv.evict=$pol \
        --set kv.sink_tokens=52 --set kv.recent_tokens=179 --set kv.heavy_tokens=179 || exit 1
    peak=0
    ( while :; do
          curl -s $METRICS/metrics | awk '/^ferry:engine_num_requests_running[{ ]/{print $NF}'
          sleep 0.2
      done ) >"$OUT/$pol.running" 2>/dev/null &
    sampler=$!
    $BENCH -u "$ROUTER" --secret "$SECRET" -n 12 --input-len 2048 --output-len 32 -C 12 --seed 5 \
        --label "$pol" --no-progress --json "$OUT/$pol.json" >"$OUT/$pol.txt" 2>"$OUT/$pol.log"
    echo "exit $?" >>"$OUT/$pol.log"
    kill $sampler 2>/dev/null
    wait $sampler 2>/dev/null
    peak=$(sort -n "$OUT/$pol.running" | tail -1)
    echo "$pol: at most $peak requests running at once" | tee -a "$OUT/$pol.txt"
    cluster_stop
done
