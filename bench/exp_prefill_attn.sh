#!/bin/sh
# exp_prefill_attn.sh - batch-1 prefill tok/s at 128 and 2,048 tokens with
# each FY_CPU_ATTN kernel (issue 19), one `ferry bench` per (round, kernel,
# threads), kernels in turn and their order flipped every round, so that
# the shared machine's background load falls on all of them; prints each
# round's 2048/128 ratio and bf16/tiles ratio, then their medians.
#   sh bench/exp_prefill_attn.sh       results in bench/results/prefill-attn/
# Knobs: ROUNDS, ATTNS (default "tiles bf16"), THREADS (default "1 2"), LENS.
set -u
cd "$(dirname "$0")/.." || exit 1
ROUNDS=${ROUNDS:-5}
ATTNS=${ATTNS:-tiles bf16}
THREADS=${THREADS:-1 2}
LENS=${LENS:-128,2048}
OUT=${OUT:-bench/results/prefill-attn}
mkdir -p "$OUT"
for round in $(seq 1 "$ROUNDS"); do
    order=$ATTNS
    [ $((round % 2)) -eq 0 ] && order=$(echo "$ATTNS" | awk '{for (i = NF; i > 0; i--) printf "%s ", $i}')
    for attn in $order; do
        for t in $THREADS; do
            bin/ferry bench --prompt-tokens "$LENS" --attn "$attn" --threads "$t" --gen-tokens 1 --reps 1 \
                >"$OUT/$attn-t$t-r$round.md" 2>&1 || exit 1
        done
    done
done
# table rows: | prompt | attention | threads | ... | prefill tok/s (7th) |
for f in "$OUT"/*-r*.md; do
    awk -v f="$(basename "$f" .md)" -F'|' '$2 ~ /^ *[0-9]+ *$/ && $3 ~ /[a-z]/ {gsub(/ /, "", $2); printf "%s %s %s\n", f, $2, $8}' "$f"
done | awk '
    { split($1, a, "-"); key = a[1] "-" a[2]; r = a[3]; tps[key, r, $2] = $3 + 0; keys[key] = 1; rounds[r] = 1; lens[$2] = 1 }
    END {
        for (k in keys) for (r in rounds) {
            lo = 1e9; hi = 0
            for (l in lens) { if (l + 0 < lo) lo = l + 0; if (l + 0 > hi) hi = l + 0 }
            if (tps[k, r, lo] > 0) printf "%s %s %d/%d %.3f prefill %d: %.1f tok/s, %d: %.1f tok/s\n", k, r, hi, lo, tps[k, r, hi] / tps[k, r, lo], lo, tps[k, r, lo], hi, tps[k, r, hi]
        }
    }' | sort | tee "$OUT/summary.txt"
