#!/bin/sh
# exp_vs_llamacpp.sh MODEL.gguf - ferry against llama.cpp on one GGUF file,
# same threads, the two programs alternating in every round (ferry first in
# odd rounds, llama.cpp first in even ones), so the shared machine's load
# falls on both (issue 33):
#   prefill  tok/s of a PREFILL-token prompt (default 512) at 2 threads
#   decode   tok/s of 16 tokens at 1 and 2 threads (ferry after a 16-token
#            prompt, llama-bench's tg16 after none), with ferry's bandwidth
#            bounds measured in the same run
#   batched  decode tok/s of BATCHES sequences (default 8,32) of 16-token
#            prompts, 8 tokens each (ferry bench-batch; llama-batched-bench)
#   load     wall seconds and peak resident memory of loading the file and
#            making 1 token (ferry generate; llama-bench -p 0 -n 1 -r 1)
# Knobs: ROUNDS (2), PREFILL (512), BATCHES (8,32), PARTS (prefill decode
# batched load), LLAMA_BIN (the folder holding llama-bench and
# llama-batched-bench: llama.cpp built from the llama-cpp-python sdist, as
# BENCHMARKS.md says), OUT (bench/results/vs-llamacpp/NAME).  Raw output per
# run under OUT; the lines the tables are made of on stdout.
set -u
[ $# = 1 ] || { echo "usage: LLAMA_BIN=DIR sh bench/exp_vs_llamacpp.sh MODEL.gguf" >&2 && exit 2; }
cd "$(dirname "$0")/.." || exit 1
m=$1
L=${LLAMA_BIN:?set LLAMA_BIN to the folder with llama-bench and llama-batched-bench}
ROUNDS=${ROUNDS:-2}
PREFILL=${PREFILL:-512}
BATCHES=${BATCHES:-8,32}
PARTS=${PARTS:-prefill decode batched load}
OUT=${OUT:-bench/results/vs-llamacpp/$(basename "$m" .gguf)}
mkdir -p "$OUT"
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
ferry_run() {
    r=$1
    if has prefill; then
        bin/ferry bench -m "$m" --threads 2 --prompt-tokens "$PREFILL" --gen-tokens 1 --reps 1 --no-profile \
            >"$OUT/ferry-prefill-r$r.md" 2>&1
        # | prompt | attention | threads | copy | read | bound | prefill tok/s | vs | decode tok/s | ...
        awk -F'|' -v r="$r" '$2 ~ /^ *[0-9]+ *$/ && $3 ~ /[a-z]/ {gsub(/ /, "", $2); gsub(/ /, "", $8);
            printf "ferry round %s prefill pp%s %s\n", r, $2, $8}' "$OUT/ferry-prefill-r$r.md"
    fi
    if has decode; then
        bin/ferry bench -m "$m" --threads 1,2 --prompt-tokens 16 --gen-tokens 16 --reps 1 \
            >"$OUT/ferry-decode-r$r.md" 2>&1
        awk -F'|' -v r="$r" '$2 ~ /^ *[0-9]+ *$/ && $3 ~ /[a-z]/ {gsub(/ /, "", $4); gsub(/ /, "", $10);
            gsub(/ /, "", $11); gsub(/ /, "", $12);
            printf "ferry round %s decode threads %s %s tok/s (copy bound %s, read bound %s)\n", r, $4, $10, $11, $12}' \
            "$OUT/ferry-decode-r$r.md"
    fi
    if has batched; then
        bin/ferry bench-batch -m "$m" --batches "$BATCHES" --prompt-tokens 16 --gen-tokens 8 --threads 2 \
            >"$OUT/ferry-batch-r$r.md" 2>&1
        grep -E '^\| *[0-9]+ \|' "$OUT/ferry-batch-r$r.md" | sed "s/^/ferry round $r batched /"
    fi
    if has load; then
        /usr/bin/time -f "ferry round $r load %e s maxrss %M KiB" bin/ferry generate -m "$m" -p x -n 1 --ctx 256 \
            >"$OUT/ferry-load-r$r.txt" 2>&1
        tail -n 1 "$OUT/ferry-load-r$r.txt"
    fi
}
llama_run() {
    r=$1
    if has prefill; then
        "$L/llama-bench" -m "$m" -t 2 -p "$PREFILL" -n 0 -r 1 -o md >"$OUT/llama-prefill-r$r.md" 2>&1
        grep -E '\| *pp[0-9]+ *\|' "$OUT/llama-prefill-r$r.md" | sed "s/^/llama round $r prefill /"
    fi
    if has decode; then
        "$L/llama-bench" -m "$m" -t 1,2 -p 0 -n 16 -r 1 -o md >"$OUT/llama-decode-r$r.md" 2>&1
        grep -E '\| *tg[0-9]+' "$OUT/llama-decode-r$r.md" | sed "s/^/llama round $r decode /"
    fi
    if has batched; then
        "$L/llama-batched-bench" -m "$m" -t 2 -c 2048 -b 512 -ub 512 -npp 16 -ntg 8 -npl "$BATCHES" \
            >"$OUT/llama-batch-r$r.md" 2>&1
        grep -E '^\| *16 \|' "$OUT/llama-batch-r$r.md" | sed "s/^/llama round $r batched /"
    fi
    if has load; then
        /usr/bin/time -f "llama round $r load %e s maxrss %M KiB" "$L/llama-bench" -m "$m" -t 2 -p 0 -n 1 -r 1 \
            >"$OUT/llama-load-r$r.txt" 2>&1
        tail -n 1 "$OUT/llama-load-r$r.txt"
    fi
}
. bench/rounds.sh
alternate "$ROUNDS" ferry_run llama_run
