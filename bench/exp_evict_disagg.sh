#!/bin/sh
# exp_evict_disagg.sh - KV budgets through the disaggregated path: one
# prefill and one decode worker (1 thread each), 6 requests of 2,048
# prompt and 32 output tokens sent one after another, every block kept
# against the budgets of exp_evict.sh (410 tokens, 20% of the prompt: 52
# sink, 179 recent, 179 heavy for H2O).  Reports ferry-bench's TTFT and
# E2E and the prefill worker's KV bytes shipped (ferry:kv_transfer_bytes_total).
#   sh bench/exp_evict_disagg.sh     results in bench/results/evict_disagg/
set -u
cd "$(dirname "$0")/.." || exit 1
. bench/cluster.sh
OUT=${OUT:-bench/results/evict_disagg}
POLICIES=${POLICIES:-none streaming h2o}
PMETRICS=http://127.0.0.1:17431
mkdir -p "$OUT"
for pol in $POLICIES; do
    cluster_start "evict-disagg-$pol" --set prefill.count=1 --set decode.count=1 --set prefill.threads=1 \
        --set decode.threads=1 --set prefill.metrics=$PMETRICS --set kv.prefix_cache=false --set decode.spec=none \
        --set kv.evict=$pol --set kv.sink_tokens=52 --set kv.recent_tokens=179 --set kv.heavy_tokens=179 || exit 1
    $BENCH -u "$ROUTER" --secret "$SECRET" -n 6 --input-len 2048 --output-len 32 -C 1 --seed 5 \
        --label "$pol" --no-progress --json "$OUT/$pol.json" >"$OUT/$pol.txt" 2>"$OUT/$pol.log"
    echo "exit $?" >>"$OUT/$pol.log"
    bytes=$(curl -s $PMETRICS/metrics | awk '/^ferry:kv_transfer_bytes_total/{print $2}')
    echo "$pol: prefill worker shipped $bytes bytes" | tee -a "$OUT/$pol.txt"
    cluster_stop
done
