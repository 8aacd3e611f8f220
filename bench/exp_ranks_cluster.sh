#!/bin/sh
# exp_ranks_cluster.sh - TTFT and its KV transfer through a local cluster
# whose prefill and decode workers are rank groups of different shapes
# (issue 21), against the one-process pair in the same run, ROUNDS times
# alternating so that background load falls on every shape.
#   sh bench/exp_ranks_cluster.sh        results in bench/results/ranks-cluster/
# Knobs: ROUNDS, REPS, LENS, SHAPES ("PTPxPPP:DTPxDPP" each: prefill tp x pp
# to decode tp x pp).
set -u
cd "$(dirname "$0")/.." || exit 1
. bench/cluster.sh
ROUNDS=${ROUNDS:-2}
REPS=${REPS:-3}
LENS=${LENS:-512,2048}
SHAPES=${SHAPES:-1x1:1x1 1x1:3x1 3x1:3x1 1x2:1x1 3x2:1x2}
OUT=${OUT:-bench/results/ranks-cluster}
mkdir -p "$OUT"
for round in $(seq 1 "$ROUNDS"); do
    for shape in $SHAPES; do
        p=${shape%%:*} d=${shape##*:}
        name="p$p-d$d"
        cluster_start "ranks-$name" --set prefill.count=1 --set decode.count=1 \
            --set prefill.tp="${p%%x*}" --set prefill.pp="${p##*x}" \
            --set decode.tp="${d%%x*}" --set decode.pp="${d##*x}" || exit 1
        "$FERRY" bench-ttft -r "$ROUTER" --secret "$SECRET" --prompt-tokens "$LENS" --reps "$REPS" \
            >"$OUT/$name-r$round.txt" 2>&1
        echo "exit $? ($name, round $round, $(uptime))" >>"$OUT/$name-r$round.txt"
        cluster_stop
    done
done
tail -n 12 "$OUT"/*.txt
