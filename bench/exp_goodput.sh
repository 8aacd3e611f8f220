#!/bin/sh
# exp_goodput.sh - goodput against request rate, colocated against
# disaggregated with the same number of worker processes (4), on a mixed
# workload: half long prompts with short answers, half short prompts
# with long answers, under a TTFT and a TPOT SLO (the DistServe
# experiment on this machine).  The two configurations run back to back,
# ROUNDS times, alternating, so background load falls on both.
#   sh bench/exp_goodput.sh            results in bench/results/goodput/
# Knobs: RATES, N (requests per rate), SLO, ROUNDS.
set -u
cd "$(dirname "$0")/.." || exit 1
. bench/cluster.sh
RATES=${RATES:-0.5,1,2,3,4}
N=${N:-40}
SLO=${SLO:-ttft=2s,tpot=100ms}
ROUNDS=${ROUNDS:-1}
OUT=${OUT:-bench/results/goodput}
mkdir -p "$OUT"
for round in $(seq 1 "$ROUNDS"); do
    for mode in disagg coloc; do
        if [ $mode = coloc ]; then
            cluster_start "goodput-$mode" --set prefill.count=0 --set decode.count=4 || exit 1
        else
            cluster_start "goodput-$mode" || exit 1
        fi
        $BENCH -u "$ROUTER" --secret "$SECRET" -n "$N" --class 480-544/16 --class 24-40/128 --rate "$RATES" --slo "$SLO" \
            --timeout 180s --seed 7 --label "$mode" --no-progress \
            --json "$OUT/$mode-r$round.json" --plot "$OUT/$mode-r$round" >"$OUT/$mode-r$round.txt" 2>"$OUT/$mode-r$round.log"
        echo "exit $? ($mode, round $round)" >>"$OUT/$mode-r$round.log"
        cluster_stop
    done
done
# one chart: goodput and throughput of both against the rate (the last round)
r=$ROUNDS
gnuplot <<GP
set terminal pngcairo size 800,500 noenhanced
set output '$OUT/goodput.png'
set grid
set key top left
set xlabel 'offered rate (req/s)'
set ylabel 'req/s'
set yrange [0:*]
set title 'goodput ($SLO) and throughput, 4 worker processes, 2 vCPUs'
plot '$OUT/disagg-r$r/sweep.dat' using 1:3 with linespoints lw 2 title 'disaggregated goodput', \
     '$OUT/coloc-r$r/sweep.dat' using 1:3 with linespoints lw 2 title 'colocated goodput', \
     '$OUT/disagg-r$r/sweep.dat' using 1:2 with linespoints dt 2 title 'disaggregated throughput', \
     '$OUT/coloc-r$r/sweep.dat' using 1:2 with linespoints dt 2 title 'colocated throughput'
GP
