#!/bin/sh
# exp_prefix.sh - time to first token with the prefix cache on and off:
# every request starts with the same 200-token system prompt, then 16
# tokens of its own, and asks for 16 tokens; sent at a rate the cluster
# serves without queueing, so TTFT is the prompt's own cost.
#   sh bench/exp_prefix.sh             results in bench/results/prefix/
set -u
cd "$(dirname "$0")/.." || exit 1
. bench/cluster.sh
N=${N:-100}
RATE=${RATE:-2}
MODES=${MODES:-disagg coloc}
OUT=${OUT:-bench/results/prefix}
mkdir -p "$OUT"
for mode in $MODES; do
    for cache in true false; do
        name=$mode-cache-$cache
        if [ $mode = coloc ]; then
            cluster_start "prefix-$name" --set kv.prefix_cache=$cache --set prefill.count=0 --set decode.count=4 || exit 1
        else
            cluster_start "prefix-$name" --set kv.prefix_cache=$cache || exit 1
        fi
        $BENCH -u "$ROUTER" --secret "$SECRET" -n "$N" --prefix-groups 1 --prefix-len 200 --input-len 16 --output-len 16 \
            --rate "$RATE" --seed 11 --label "$name" --no-progress --json "$OUT/$name.json" \
            >"$OUT/$name.txt" 2>"$OUT/$name.log"
        echo "exit $?" >>"$OUT/$name.log"
        cluster_stop
    done
done
