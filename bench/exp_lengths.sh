#!/bin/sh
# exp_lengths.sh MODEL.gguf LENS - prefill and decode of one model at several
# prompt lengths (issue 33: Gemma 3 and SmolLM2 at 128 / 2,048 / 8,192),
# ferry against llama.cpp at 2 threads, alternating in every round (ferry
# first in odd rounds):
#   ferry   bin/ferry bench --prompt-tokens LENS --gen-tokens 16 --threads 2
#           (decode: the 16 tokens after each prompt), and its per-op
#           prefill profile (where head_dim 256 costs)
#   llama   llama-bench -p LENS -n 0, then -n 16 -d LENS (decode at that depth)
# Knobs: ROUNDS (2), LLAMA_BIN (llama-bench's folder), OUT
# (bench/results/lengths/NAME).  Raw output under OUT; one line per figure
# on stdout.
set -u
[ $# = 2 ] || { echo "usage: LLAMA_BIN=DIR sh bench/exp_lengths.sh MODEL.gguf 128,2048,8192" >&2 && exit 2; }
cd "$(dirname "$0")/.." || exit 1
m=$1 lens=$2
L=${LLAMA_BIN:?set LLAMA_BIN to the folder with llama-bench}
ROUNDS=${ROUNDS:-2}
OUT=${OUT:-bench/results/lengths/$(basename "$m" .gguf)}
mkdir -p "$OUT"
ferry_run() {
    bin/ferry bench -m "$m" --threads 2 --prompt-tokens "$lens" --gen-tokens 16 --reps 1 >"$OUT/ferry-r$1.md" 2>&1
    awk -F'|' -v r="$1" '$2 ~ /^ *[0-9]+ *$/ && $3 ~ /[a-z]/ {gsub(/ /, "", $2); gsub(/ /, "", $8); gsub(/ /, "", $10);
        printf "ferry round %s prompt %s prefill %s decode %s\n", r, $2, $8, $10}' "$OUT/ferry-r$1.md"
}
llama_run() {
    "$L/llama-bench" -m "$m" -t 2 -p "$lens" -n 0 -r 1 -o md >"$OUT/llama-prefill-r$1.md" 2>&1
    grep -E '\| *pp[0-9]+ *\|' "$OUT/llama-prefill-r$1.md" | sed "s/^/llama round $1 /"
    "$L/llama-bench" -m "$m" -t 2 -p 0 -n 16 -d "$lens" -r 1 -o md >"$OUT/llama-decode-r$1.md" 2>&1
    grep -E '\| *tg[0-9]+' "$OUT/llama-decode-r$1.md" | sed "s/^/llama round $1 /"
}
. bench/rounds.sh
alternate "$ROUNDS" ferry_run llama_run
