#!/bin/sh
# exp_split.sh - disaggregation on split CPU pools against colocated workers
# with the same cores (issue 19, "disaggregation that pays").
#   split:  1 prefill worker pinned to CPU A, 1 decode worker pinned to CPU B
#           (prefill.cpus / decode.cpus), one thread each: each phase owns a
#           core, as each owns machines in a datacenter
#   coloc:  1 worker running whole requests with both cores (threads = 2)
#   coloc2: 2 workers running whole requests, one thread each, unpinned
# Mixed workload (half long prompts with short answers, half short prompts
# with long answers), Poisson arrivals, the configurations alternating
# round by round so background load falls on all of them.  The summary
# (bench/exp_split.py) computes goodput under several SLOs from the
# per-request records, the first rate each misses at, and the ratio chart.
#   sh bench/exp_split.sh            results in bench/results/split/
# Knobs: RATES, N (requests per rate), ROUNDS, CPUS ("A B"), CONFIGS.
set -u
cd "$(dirname "$0")/.." || exit 1
. bench/cluster.sh
RATES=${RATES:-1,2,3,4}
N=${N:-32}
ROUNDS=${ROUNDS:-2}
CONFIGS=${CONFIGS:-split coloc coloc2}
OUT=${OUT:-bench/results/split}
set -- ${CPUS:-0 1}
CPU_A=$1
CPU_B=$2
mkdir -p "$OUT"
for round in $(seq 1 "$ROUNDS"); do
    for mode in $CONFIGS; do
        case $mode in
        split) set -- --set prefill.count=1 --set prefill.threads=1 --set prefill.cpus="$CPU_A" \
            --set decode.count=1 --set decode.threads=1 --set decode.cpus="$CPU_B" ;;
        coloc) set -- --set prefill.count=0 --set decode.count=1 --set decode.threads=2 ;;
        coloc2) set -- --set prefill.count=0 --set decode.count=2 --set decode.threads=1 ;;
        *) echo "unknown configuration $mode" >&2; exit 2 ;;
        esac
        cluster_start "split-$mode" "$@" || exit 1
        $BENCH -u "$ROUTER" --secret "$SECRET" -n "$N" --class 480-544/16 --class 24-40/128 --rate "$RATES" \
            --slo ttft=2s,tpot=50ms --timeout 180s --seed 7 --label "$mode" --no-progress \
            --json "$OUT/$mode-r$round.json" >"$OUT/$mode-r$round.txt" 2>"$OUT/$mode-r$round.log"
        echo "exit $? ($mode, round $round)" >>"$OUT/$mode-r$round.log"
        cluster_stop
    done
done
python3 bench/exp_split.py "$OUT" $CONFIGS
