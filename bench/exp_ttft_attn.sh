#!/bin/sh
# exp_ttft_attn.sh - TTFT through the cluster with the tiled prefill
# attention against the row walk (FY_CPU_ATTN=rows), back to back, ROUNDS
# times alternating, so background load falls on both (issue 19).
#   sh bench/exp_ttft_attn.sh          results in bench/results/ttft-attn/
# Knobs: ROUNDS, REPS, LENS, ATTNS (FY_CPU_ATTN values: tiles rows bf16).
set -u
cd "$(dirname "$0")/.." || exit 1
. bench/cluster.sh
ROUNDS=${ROUNDS:-2}
REPS=${REPS:-3}
LENS=${LENS:-128,512,2048}
ATTNS=${ATTNS:-tiles rows}
OUT=${OUT:-bench/results/ttft-attn}
mkdir -p "$OUT"
for round in $(seq 1 "$ROUNDS"); do
    for attn in $ATTNS; do
        export FY_CPU_ATTN=$attn
        cluster_start "ttft-$attn" --set prefill.count=1 --set decode.count=1 || exit 1
        "$FERRY" bench-ttft -r "$ROUTER" --secret "$SECRET" --prompt-tokens "$LENS" --reps "$REPS" \
            >"$OUT/$attn-r$round.txt" 2>&1
        echo "exit $? ($attn, round $round, $(uptime))" >>"$OUT/$attn-r$round.txt"
        cluster_stop
    done
done
unset FY_CPU_ATTN
tail -n 12 "$OUT"/*.txt
