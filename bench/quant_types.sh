#!/bin/sh
# quant_types.sh [ROUNDS] - decode speed at batch 1 and one thread for each
# GGUF weight type on one model shape, against the memory-bandwidth bound
# (`make bench-quant`; BENCHMARKS.md, "Weight types").
#
# The models are written once into build/bench-models/ by tests/mkbench
# (random weights through ferry's reference quantizers: valid blocks at
# realistic scales, no model's knowledge).  Each round runs
# `ferry bench --threads 1 --reps 3` on every type in turn, so that a shared
# machine's drift hits all types alike; the table gives per type the
# medians over rounds of decode tok/s, the fraction of the copy and read
# bounds, and of the per-round ratio of the copy fraction to Q4_1's.
set -e
rounds=${1:-3}
bin=${FERRY_BIN:-bin}
mk=${MKBENCH:-build/release/tests/mkbench}
dir=${BENCH_MODELS:-build/bench-models}
types=${BENCH_TYPES:-"q4_1 q4_0 q8_0 q5_0 q5_1 iq4_nl q2_k q3_k q4_k q5_k q6_k"}
mkdir -p "$dir"
for t in $types; do
    [ -s "$dir/$t.gguf" ] || "$mk" "$dir/$t.gguf" "$t"
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
r=1
while [ "$r" -le "$rounds" ]; do
    for t in $types; do
        line=$("$bin/ferry" bench -m "$dir/$t.gguf" --threads 1 --reps 3 | grep '^| 1 |')
        echo "round $r $t $line"
        echo "$r $t $line" >>"$out"
    done
    r=$((r + 1))
done
# fields of a bench line after "R TYPE": | 1 | copy | read | cb / rb | prefill | decode | dc% | dr% |
awk -v types="$types" '
function median(a, n,    i, j, t) {
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{
    split($0, f, "|");
    r = $1; t = $2;
    dec[t, r] = f[7] + 0; pre[t, r] = f[6] + 0; fc[t, r] = f[8] + 0; fr[t, r] = f[9] + 0;
    if (r > nr) nr = r;
}
END {
    printf "| type | decode tok/s | prefill tok/s | decode / copy bound | decode / read bound | copy fraction / Q4_1 |\n";
    printf "|---|---:|---:|---:|---:|---:|\n";
    n = split(types, ts, " ");
    for (i = 1; i <= n; i++) {
        t = ts[i];
        for (r = 1; r <= nr; r++) { a[r] = dec[t, r]; b[r] = pre[t, r]; c[r] = fc[t, r]; d[r] = fr[t, r];
                                    e[r] = fc["q4_1", r] ? fc[t, r] / fc["q4_1", r] : 0 }
        printf "| %s | %.1f | %.1f | %.0f%% | %.0f%% | %.2f |\n", t, median(a, nr), median(b, nr), median(c, nr),
               median(d, nr), median(e, nr);
    }
}' "$out"
