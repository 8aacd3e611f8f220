#!/bin/sh
# exp_vs_commit.sh BASE_FERRY [MODEL] - this tree's bin/ferry against another
# build of ferry (a previous commit's, built in a worktree), the two
# alternating in every round (bench/rounds.sh) so a shared machine's load
# falls on both: `ferry bench --no-profile` prefill and decode tok/s of the
# same prompt at the same threads, and the ratio this / base per round.
# Knobs: ROUNDS (4), THREADS (2), PROMPT (128), GEN (64), REPS (3),
# OUT (bench/results/vs-commit).  For "within noise of the commit before"
# (issue 34): build the base with `git worktree add /tmp/base REV && make
# -C /tmp/base bin/ferry`.
set -u
[ $# -ge 1 ] || { echo "usage: sh bench/exp_vs_commit.sh BASE_FERRY [MODEL]" >&2 && exit 2; }
cd "$(dirname "$0")/.." || exit 1
base=$1
m=${2:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
ROUNDS=${ROUNDS:-4}
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-128}
GEN=${GEN:-64}
REPS=${REPS:-3}
OUT=${OUT:-bench/results/vs-commit}
mkdir -p "$OUT"
one() { # name binary round
    "$2" bench -m "$m" --threads "$THREADS" --prompt-tokens "$PROMPT" --gen-tokens "$GEN" --reps "$REPS" \
        --no-profile >"$OUT/$1-r$3.md" 2>&1
    # | prompt | attention | threads | copy | read | bound | prefill tok/s | vs | decode tok/s | ...
    awk -F'|' -v n="$1" -v r="$3" '$2 ~ /^ *[0-9]+ *$/ && $3 ~ /[a-z]/ {gsub(/ /, "", $8); gsub(/ /, "", $10);
        printf "%s round %s prefill %s decode %s\n", n, r, $8, $10}' "$OUT/$1-r$3.md"
}
head_run() { one head bin/ferry "$1"; }
base_run() { one base "$base" "$1"; }
. bench/rounds.sh
alternate "$ROUNDS" head_run base_run | tee "$OUT/summary.txt"
awk '$1 == "head" {hp[$3] = $5; hd[$3] = $7} $1 == "base" {bp[$3] = $5; bd[$3] = $7}
    END {for (r in hp) if (bp[r] > 0 && bd[r] > 0)
        printf "round %s: prefill %.3f, decode %.3f (this / base)\n", r, hp[r] / bp[r], hd[r] / bd[r]}' \
    "$OUT/summary.txt" | sort | tee -a "$OUT/summary.txt"
