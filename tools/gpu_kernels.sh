#!/bin/sh
# gpu_kernels.sh MODEL - device time, DRAM bytes and occupancy of ferry's own
# CUDA kernels, read by Nsight Compute (ncu, clocks as found:
# --clock-control none) on a GPU host, one row per kernel launch (--csv
# --page raw):
#   1. the vector matmuls (mmv_q8_kernel, the lane kernel; then
#      FY_CUDA_MMV=staged) of decode steps at batch 1: ferry bench-gpu --only
#      decode --batches 1 (its prefill uses the GEMM, so every mmv launch is a
#      decode step's)
#   2. the paged decode attention (attn_part_kernel, attn_reduce_kernel) of
#      bench-gpu's attention section alone at 8,192 tokens, batch 64
# Bytes over time against the copy bandwidth bench-gpu prints says which
# kernels are far from the memory bound and why (occupancy, DRAM throughput
# against SM throughput).  Each ncu run is under its own timeout; nothing
# here is a pass or a failure.
set -u
[ $# = 1 ] || { echo "usage: sh tools/gpu_kernels.sh MODEL" >&2 && exit 2; }
m=$1
bin=${FERRY_BIN:-bin}
ncu=$(command -v ncu 2>/dev/null || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
[ -n "$ncu" ] || { echo "gpu_kernels.sh: ncu not found" && exit 1; }
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size
metrics=$metrics,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
metrics=$metrics,sm__throughput.avg.pct_of_peak_sustained_elapsed
# the raw page has a column per metric and device attribute: keep the kernel's
# name, grid and the metrics asked for, and DRAM bytes read over its time
table() {
    python3 -c '
import csv, sys
want = ["Kernel Name", "Grid Size", "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
        "sm__warps_active.avg.pct_of_peak_sustained_active", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed"]
hdr = None
for r in csv.reader(sys.stdin):
    if hdr is None:
        if r and r[0] == "ID":
            hdr = r
            print("| kernel | grid | ns | DRAM read B | DRAM write B | warps active % | DRAM % of peak | SM % of peak | read GB/s |")
            print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        elif r:
            print(",".join(r)[:300])
        continue
    if len(r) != len(hdr) or not r[0].isdigit():
        continue
    v = [r[hdr.index(w)] if w in hdr else "?" for w in want]
    name = v[0].split("(")[0].replace("void ", "")
    try:
        gbs = "%.0f" % (float(v[3].replace(",", "")) / float(v[2].replace(",", "")))
    except ValueError:
        gbs = "?"
    print("| " + " | ".join([name] + v[1:] + [gbs]) + " |")
' 2>&1 || echo "(python3 failed: the raw csv is not shown)"
}
prof() {
    timeout -k 5 120 "$ncu" --clock-control none --metrics "$metrics" --csv --page raw --print-units base "$@" 2>&1 |
        grep -v '^==PROF==' | table
}
echo "==== ncu: vector matmuls of decode steps at batch 1 (lanes)"
prof -k regex:mmv_q8 --launch-count 24 "$bin/ferry" bench-gpu -m "$m" --device cuda --only decode --batches 1 --steps 2
echo "==== ncu: vector matmuls of decode steps at batch 1 (FY_CUDA_MMV=staged)"
FY_CUDA_MMV=staged prof -k regex:mmv_q8 --launch-count 24 "$bin/ferry" bench-gpu -m "$m" --device cuda --only decode \
    --batches 1 --steps 2
echo "==== ncu: paged decode attention, 8192 tokens, batch 64"
prof -k regex:attn_ --launch-count 6 "$bin/ferry" bench-gpu -m "$m" --device cuda --only attn --attn-ctx 8192 --reps 2
exit 0
