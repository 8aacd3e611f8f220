#!/usr/bin/env python3
"""exp_split.py OUT CONFIG... - the summary of bench/exp_split.sh.

Reads OUT/CONFIG-rN.json (ferry-bench --json, one file per configuration
and round, each a sweep over rates), recomputes goodput from the
per-request records under several SLOs (TTFT 2 s with TPOT 25, 50 and
100 ms), and prints markdown tables: goodput per rate (median of the
rounds, with the range), the first rate at which fewer than 90% of
requests meet the SLO, per-phase latencies, and the goodput ratio of the
first configuration to each other. Writes OUT/ratio.dat and OUT/ratio.png
(gnuplot, when installed)."""
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys

SLOS = [(2.0, 0.025), (2.0, 0.050), (2.0, 0.100)]


def load(out, cfg):
    runs = {}
    for path in sorted(glob.glob(os.path.join(out, f"{cfg}-r*.json"))):
        with open(path) as f:
            d = json.load(f)
        for r in d["runs"]:
            runs.setdefault(r["rate"], []).append(r)
    return runs


def goodput(run, ttft, tpot):
    good = sum(1 for q in run["requests"] if q["ok"] and q["ttft_s"] <= ttft and (q["tpot_s"] or 0) <= tpot)
    return good / run["duration_s"], good / max(1, run["n_total"])


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def main():
    out, cfgs = sys.argv[1], sys.argv[2:]
    data = {c: load(out, c) for c in cfgs}
    rates = sorted(set().union(*[set(d) for d in data.values()]))
    for ttft, tpot in SLOS:
        print(f"\n### goodput (req/s), SLO TTFT {ttft:g} s, TPOT {tpot * 1000:g} ms: median of rounds [min-max]\n")
        print("| rate | " + " | ".join(cfgs) + " | " + " | ".join(f"{cfgs[0]} / {c}" for c in cfgs[1:]) + " |")
        print("|---:|" + "---:|" * (2 * len(cfgs) - 1))
        first_miss = {c: None for c in cfgs}
        ratio_rows = []
        for rate in rates:
            meds, cells = {}, []
            for c in cfgs:
                rs = data[c].get(rate, [])
                g = [goodput(r, ttft, tpot) for r in rs]
                if not g:
                    cells.append("-")
                    continue
                gp = [x[0] for x in g]
                frac = statistics.median(x[1] for x in g)
                meds[c] = statistics.median(gp)
                if frac < 0.9 and first_miss[c] is None:
                    first_miss[c] = rate
                cells.append(f"{meds[c]:.2f} [{min(gp):.2f}-{max(gp):.2f}] ({frac:.0%})")
            ratios = []
            for c in cfgs[1:]:
                if cfgs[0] in meds and meds.get(c, 0) > 0:
                    ratios.append(f"{meds[cfgs[0]] / meds[c]:.2f}")
                else:
                    ratios.append("-")
            ratio_rows.append((rate, [meds.get(c, 0) for c in cfgs]))
            print(f"| {rate:g} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
        peak = {c: max((row[1][i] for row in ratio_rows), default=0) for i, c in enumerate(cfgs)}
        print("\nfirst rate where under 90% of requests meet the SLO: " +
              ", ".join(f"{c} {first_miss[c] if first_miss[c] is not None else f'none up to {rates[-1]:g}'}"
                        for c in cfgs))
        print("peak goodput: " + ", ".join(f"{c} {peak[c]:.2f}" for c in cfgs) +
              "; " + ", ".join(f"{cfgs[0]} / {c} {peak[cfgs[0]] / peak[c]:.2f}" for c in cfgs[1:] if peak[c] > 0))
        if tpot == 0.050:
            with open(os.path.join(out, "ratio.dat"), "w") as f:
                f.write("# rate " + " ".join(f"{cfgs[0]}/{c}" for c in cfgs[1:]) + "\n")
                for rate, g in ratio_rows:
                    f.write(f"{rate:g} " + " ".join(f"{g[0] / x:.4f}" if x > 0 else "nan" for x in g[1:]) + "\n")
    print("\n### latency by phase (ms, all rounds pooled): TTFT p50 / p99, TPOT p50 / p99\n")
    print("| rate | " + " | ".join(f"{c} TTFT | {c} TPOT" for c in cfgs) + " |")
    print("|---:|" + "---:|" * (2 * len(cfgs)))
    for rate in rates:
        cells = []
        for c in cfgs:
            qs = [q for r in data[c].get(rate, []) for q in r["requests"] if q["ok"]]
            t = [q["ttft_s"] * 1000 for q in qs]
            p = [q["tpot_s"] * 1000 for q in qs if q["tpot_s"]]
            cells.append(f"{pct(t, .5):.0f} / {pct(t, .99):.0f} | {pct(p, .5):.1f} / {pct(p, .99):.1f}")
        print(f"| {rate:g} | " + " | ".join(cells) + " |")
    if shutil.which("gnuplot") and len(cfgs) > 1:
        plots = ", ".join(f"'{out}/ratio.dat' using 1:{i + 2} with linespoints lw 2 title '{cfgs[0]} / {c}'"
                          for i, c in enumerate(cfgs[1:]))
        subprocess.run(["gnuplot"], input=f"""set terminal pngcairo size 800,500 noenhanced
set output '{out}/ratio.png'
set grid
set xlabel 'offered rate (req/s)'
set ylabel 'goodput ratio (TTFT 2 s, TPOT 50 ms)'
set yrange [0:*]
set title 'goodput of {cfgs[0]} over each colocated configuration, 2 vCPUs'
plot {plots}, 1 with lines dt 2 title 'parity'
""", text=True, check=False)


if __name__ == "__main__":
    main()
