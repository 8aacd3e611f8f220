#!/bin/sh
# gpu_check.sh [--dry-run] - the one-shot device check (docs/architecture.md,
# "Backends"): on a GPU host, in one command and under 7 minutes on 16 cores,
#   1. build     make -j$(nproc) tests: bin/ferry (bench-gpu, cmp-devices),
#                tests/test_cuda and tests/mkbench, with CUDA (sm_80, sm_90, compute_90 PTX)
#   2. models    tests/mkbench writes two random-weight Q4_K_M models of real
#                shapes on the host: Llama-3-8B's layers (dim 4096, 32 heads,
#                8 KV heads of 128, ffn 14336, vocabulary 128256; GPU_CHECK_LAYERS
#                layers, default 4) and Gemma-3-4B's (KV heads of 256, the
#                sliding window, tied embeddings; 6 layers)
#   3. test_cuda every CUDA op against the CPU backend; a skipped test on a
#                host with a GPU is a failure
#   4. compare   ferry cmp-devices cuda,cpu on both models: greedy decoding in
#                lockstep, where the tokens first differ and the top-2 margin there
#      memcheck, racecheck: compute-sanitizer over test_cuda, beside the compare
#                (nothing there is timed), where the toolkit has compute-sanitizer
#   5. bench     ferry bench-gpu on the Llama-shaped model, alone on the GPU:
#                device-to-device copy, decode steps at batch 1/8/64, paged decode
#                attention at 4k-32k context, prefill matmuls
#   6. cluster   tools/gpu_cluster.sh: a prefill and a decode worker on the GPU, KV
#                staged through pinned host memory, against the same on the CPU: the
#                same answers, every block back
# GPU_CHECK_SIZES=tiny writes the dry run's tiny models instead (a quick look
# on a GPU host; tests/test_gpucheck.c runs it where there is no GPU, to see
# every GPU step fail).  Every step has its own timeout, clipped so that all of them end within
# GPU_CHECK_BUDGET seconds (default 400).  Output lands under $OUT (default
# build/gpu-check/DATE) in eight files: summary.txt, build.log, models.log,
# test_cuda.log, compare.log, sanitizer.log, bench.log, cluster.log; nothing is deleted.  The
# table (PASS/FAIL/SKIP per step) is printed last, after the tail of every
# failed step's log; the exit status is 0 when no step failed.
#
# --dry-run: the same steps on a machine without a GPU: the CUDA build,
# mkbench at tiny sizes, cmp-devices cpu,cpu (must be bit for bit equal),
# bench-gpu on the CPU backend; test_cuda may skip, the sanitizers are left
# out.  make test runs it (tests/test_gpucheck.c), so it cannot rot.
#
# First run on an H200 on 2026-11-28 (issue 31): its output is under
# bench/results/gpu/, its figures in BENCHMARKS.md.
#
# A GPU host has no package registry: bring ferry's Debian libraries along
# in the git-ignored .debs/ of the working tree, fetched here with
#   tools/fetch-debs.sh .debs
# (the list is in that script: the Makefile's PKGS, nng, gnutls and the .pc
# files its .pc requires, cmocka, make, pkgconf; their runtime libraries
# follow by dependency; 61 .deb files, 16 MiB, bookworm).  libmicrohttpd's .pc requires gnutls,
# whose .pc requires p11-kit-1, nettle, hogweed, libtasn1 and libidn2: with
# one missing `pkg-config --cflags` fails as a whole, and the Makefile then
# asks package by package and warns.  make and pkg-config may be missing on
# the host.  Debian keeps curl's headers in usr/include/x86_64-linux-gnu:
# tools/use-debs.sh puts /opt/debs/usr/include/x86_64-linux-gnu on CPATH, and the
# Makefile adds $PKG_CONFIG_SYSROOT_DIR/usr/include/<multiarch> itself.
# nng: build/nng (make deps builds nng 1.11 there) is git-ignored and does
# not travel unless carried; without it the build links the .debs'
# libnng 1.5.2 (-lnng), and print-flags, in build.log, says which.
# Then, from the working tree:
#     . tools/use-debs.sh .debs && sh tools/gpu_check.sh
# (or make gpu-check).  nvcc is looked for on PATH and at /usr/local/cuda/bin.
set -u
usage() {
    echo "usage: sh tools/gpu_check.sh [--dry-run]   (output under \$OUT; GPU_CHECK_BUDGET seconds, default 400)"
}
dry=0
case "${1:-}" in
'') ;;
--dry-run) dry=1 ;;
-h | --help) usage && exit 0 ;;
*) usage >&2 && exit 2 ;;
esac
[ $# -le 1 ] || { usage >&2 && exit 2; }

t0=$(date +%s)
budget=${GPU_CHECK_BUDGET:-400}
out=${OUT:-build/gpu-check/$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out" || exit 1
jobs=$(nproc 2>/dev/null || echo 4)
sum=$out/summary.txt
rows=""
failed=0
PATH=$PATH:/usr/local/cuda/bin
export PATH

say() { echo "$*" | tee -a "$sum"; }
elapsed() { echo $(($(date +%s) - t0)); }
# limit WANTED: the step's timeout, clipped to what the budget has left
limit() {
    left=$((budget - $(elapsed)))
    [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}
# row NAME RESULT SECONDS NOTE
row() {
    rows="$rows| $1 | $2 | $3 | $4 |
"
    case "$2" in FAIL*) failed=$((failed + 1)) ;; esac
}
# run LOG SECONDS CMD...: runs CMD under timeout, appending to LOG; sets rc
# and dt (124 or 137: timed out; 125: no time was left to start it, and
# dt is 0: a step not started took no time, although the clock may turn
# a second while the script says so, which under load it can)
run() {
    log=$1 lim=$2
    shift 2
    s=$(date +%s)
    echo "\$ $*  (timeout ${lim}s)" >>"$log"
    if [ "$lim" -lt 5 ]; then
        echo "not started: the budget of ${budget}s is spent" >>"$log"
        rc=125 dt=0
    else
        timeout -k 5 "$lim" "$@" >>"$log" 2>&1
        rc=$?
        dt=$(($(date +%s) - s))
    fi
    echo "(exit status $rc, ${dt}s)" >>"$log"
}
# verdict of a plain step from rc: PASS, FAIL (timed out), FAIL
verdict() {
    case "$rc" in
    0) echo PASS ;;
    124 | 137) echo "FAIL" ;;
    125) echo "SKIP" ;;
    *) echo FAIL ;;
    esac
}
note_rc() {
    case "$rc" in
    0) echo "${1:-}" ;;
    124 | 137) echo "timed out" ;;
    125) echo "no time left in the budget" ;;
    *) echo "exit status $rc${1:+; $1}" ;;
    esac
}
failed_logs=""

# ---- where and what ------------------------------------------------------------------------------------------
: >"$sum"
rev=$(git rev-parse --short HEAD 2>/dev/null) && { git diff --quiet HEAD 2>/dev/null || rev="$rev with changes"; }
say "ferry gpu_check.sh$([ $dry = 1 ] && echo ' --dry-run'), $(date -u '+%Y-%m-%d %H:%M UTC'), commit ${rev:-unknown (no git)}"
say "host: $(uname -m), $jobs cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo 2>/dev/null)"
gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    gpu=1
    nvidia-smi -L 2>&1 | sed 's/^/gpu: /' | tee -a "$sum"
    say "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -1); $(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -1) (driver)"
else
    say "gpu: none ($(command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>&1 | head -1 || echo 'nvidia-smi not found'))"
fi
nvcc_bin=$(command -v nvcc 2>/dev/null)
say "nvcc: ${nvcc_bin:-not found}$([ -n "$nvcc_bin" ] && "$nvcc_bin" --version | sed -n 's/.*release \([0-9.]*\).*/, CUDA \1 (toolkit)/p')"
san=$(command -v compute-sanitizer 2>/dev/null)
[ -z "$san" ] && [ -n "$nvcc_bin" ] && [ -x "$(dirname "$nvcc_bin")/compute-sanitizer" ] && san=$(dirname "$nvcc_bin")/compute-sanitizer
say "compute-sanitizer: ${san:-not found}"
[ $gpu = 0 ] && [ $dry = 0 ] && say "no GPU here: every GPU step will fail (--dry-run is the check for a machine without one)"
say ""

# ---- 1. build ------------------------------------------------------------------------------------------------
blog=$out/build.log
: >"$blog"
if ! command -v make >/dev/null 2>&1; then
    echo "make not found: it is in the .debs list (tools/fetch-debs.sh)" >>"$blog"
    rc=127 dt=0
else
    run "$blog" 5 make -s --no-print-directory print-flags
    run "$blog" "$(limit 240)" make -j"$jobs" --no-print-directory tests
fi
dirs=$(make -s --no-print-directory print-dirs 2>/dev/null)
build=${dirs% *}
bin=${dirs#* }
if [ "$rc" = 0 ] && ! grep -q '^CC=.* CUDA=1 ' "$blog"; then
    row build FAIL "$dt" "this build has no CUDA (nvcc not found, or CUDA=0): print-flags in build.log"
    failed_logs="$failed_logs $blog"
elif [ "$rc" = 0 ]; then
    row build PASS "$dt" "make -j$jobs tests, CUDA=1 ($build, $bin)"
else
    row build FAIL "$dt" "$(note_rc)"
    failed_logs="$failed_logs $blog"
fi
built=$rc
[ -z "$build" ] && built=1

# ---- 2. models -----------------------------------------------------------------------------------------------
mdir=build/gpu-check-models
mlog=$out/models.log
: >"$mlog"
llama=$mdir/llama3-8b-shape.gguf
gemma=$mdir/gemma3-4b-shape.gguf
if [ $dry = 1 ] || [ "${GPU_CHECK_SIZES:-}" = tiny ]; then
    largs="--shape llama3-8b --dim 256 --ffn 512 --heads 4 --kv-heads 2 --layers 2 --vocab 1024"
    gargs="--shape gemma3-4b --dim 256 --heads 2 --kv-heads 1 --head-dim 128 --ffn 512 --vocab 1024 --window 16"
else
    largs="--shape llama3-8b --layers ${GPU_CHECK_LAYERS:-4}"
    gargs="--shape gemma3-4b"
fi
# a model is kept when written before by the same mkbench with the same arguments
if [ "$built" = 0 ]; then
    mkdir -p "$mdir"
    mkv=$(cksum <"$build/tests/mkbench" | cut -d' ' -f1)
    lkey="$largs (mkbench $mkv)"
    gkey="$gargs (mkbench $mkv)"
    s=$(date +%s)
    # the two writers in parallel, each under the step's timeout
    lim=$(limit 60)
    echo "\$ mkbench $llama q4_k_m $largs & mkbench $gemma q4_k_m $gargs  (timeout ${lim}s)" >>"$mlog"
    rc=0
    if [ ! -s "$llama" ] || [ "$(cat "$llama.args" 2>/dev/null)" != "$lkey" ]; then
        rm -f "$llama.args"
        timeout -k 5 "$lim" "$build/tests/mkbench" "$llama" q4_k_m $largs >>"$mlog" 2>&1 && echo "$lkey" >"$llama.args" &
        pl=$!
    else
        echo "$llama: kept (written before with the same arguments)" >>"$mlog"
        pl=""
    fi
    if [ ! -s "$gemma" ] || [ "$(cat "$gemma.args" 2>/dev/null)" != "$gkey" ]; then
        rm -f "$gemma.args"
        timeout -k 5 "$lim" "$build/tests/mkbench" "$gemma" q4_k_m $gargs >>"$mlog" 2>&1 && echo "$gkey" >"$gemma.args" || rc=1
    else
        echo "$gemma: kept (written before with the same arguments)" >>"$mlog"
    fi
    [ -n "$pl" ] && { wait "$pl" || rc=1; }
    [ -s "$llama.args" ] && [ -s "$gemma.args" ] || rc=1
    dt=$(($(date +%s) - s))
    ls -l "$llama" "$gemma" >>"$mlog" 2>&1
    if [ "$rc" = 0 ]; then
        row models PASS "$dt" "$(du -m "$llama" | cut -f1) MiB + $(du -m "$gemma" | cut -f1) MiB, Q4_K_M"
    else
        row models FAIL "$dt" "mkbench failed: models.log"
        failed_logs="$failed_logs $mlog"
    fi
else
    rc=1
    row models SKIP 0 "no build"
fi
models=$rc

# ---- 3. test_cuda --------------------------------------------------------------------------------------------
tlog=$out/test_cuda.log
: >"$tlog"
if [ "$built" = 0 ]; then
    run "$tlog" "$(limit 60)" "$build/tests/test_cuda"
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$tlog" | tail -n 1)
    sk=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$tlog" | tail -n 1)
    counts="${p:-0} passed, ${sk:-0} skipped"
    if [ "$rc" != 0 ]; then
        row test_cuda FAIL "$dt" "$(note_rc "$counts")"
        failed_logs="$failed_logs $tlog"
    elif [ "${sk:-0}" -gt 0 ] && [ $dry = 0 ]; then
        row test_cuda FAIL "$dt" "$counts: a skip on a GPU host is a failure"
        failed_logs="$failed_logs $tlog"
    elif [ "${sk:-0}" -gt 0 ]; then
        row test_cuda SKIP "$dt" "$counts (no GPU: dry run)"
    else
        row test_cuda PASS "$dt" "$counts"
    fi
else
    row test_cuda SKIP 0 "no build"
fi

# ---- 4. compare, with the sanitizers beside it --------------------------------------------------------------------
clog=$out/compare.log
slog=$out/sanitizer.log
: >"$clog"
: >"$slog"
# each sanitizer logs apart while they run, outside $OUT (which keeps its
# seven files even if the whole command is cut short), merged after
part=build/gpu-check-parts
mkdir -p "$part"
lim=$(limit 120)
slim=$(limit 170) # racecheck over test_cuda took 107 s on the first run
pids=""
if [ "$built" = 0 ] && [ $dry = 0 ] && [ -n "$san" ]; then
    rm -f "$part"/*.rc
    : >"$part/memcheck"
    : >"$part/racecheck"
    (run "$part/memcheck" "$slim" "$san" --tool memcheck --leak-check full --error-exitcode 3 "$build/tests/test_cuda"
     echo "$rc $dt" >"$part/memcheck.rc") &
    pids="$pids $!"
    # every kernel, cuBLAS's too: the first GPU run's 82 hazards were all
    # inside cuBLAS's nvjet_* GEMM kernels; leaving those out
    # (--kernel-name-exclude kns=nvjet) made the sanitizer itself fail ("failed
    # to handle a hardware exception") in the second.  The verdict below
    # counts the hazards by kernel.
    (run "$part/racecheck" "$slim" "$san" --tool racecheck --error-exitcode 3 "$build/tests/test_cuda"
     echo "$rc $dt" >"$part/racecheck.rc") &
    pids="$pids $!"
fi
if [ "$models" = 0 ]; then
    if [ $dry = 1 ]; then
        devs=cpu,cpu cargs="-n 12 --prompt-tokens 40 -t 2"
    else
        devs=cuda,cpu cargs="-n 32 --prompt-tokens 64"
    fi
    crc=0
    s=$(date +%s)
    cnote=""
    for m in "$llama" "$gemma"; do
        echo "==== $(basename "$m")" >>"$clog"
        run "$clog" "$lim" "$bin/ferry" cmp-devices -m "$m" --devices "$devs" $cargs
        [ "$rc" = 0 ] || crc=$rc
        first=$(grep -o 'first difference at step [0-9]*' "$clog" | tail -n 1)
        ag=$(sed -n 's/.*greedy tokens agree at \([0-9]* of [0-9]*\) steps.*largest relative logit error \([^ ]*\) .*/\1 agree, rel err \2/p' "$clog" | tail -n 1)
        cnote="$cnote$(basename "$m" -shape.gguf): ${ag:-no result}${first:+, $first}; "
        # the 8-bit KV dtypes on the Llama shape: each device against the other with the same KV
        if [ "$m" = "$llama" ]; then
            for kd in fp8 int8; do
                run "$clog" "$(limit 60)" "$bin/ferry" cmp-devices -m "$m" --devices "$devs" $cargs --kv-dtype $kd
                [ "$rc" = 0 ] || crc=$rc
                ag=$(sed -n 's/.*greedy tokens agree at \([0-9]* of [0-9]*\) steps.*largest relative logit error \([^ ]*\) .*/\1 agree, rel err \2/p' "$clog" | tail -n 1)
                cnote="$cnote$kd KV: ${ag:-no result}; "
            done
        fi
        lim=$(limit 120)
    done
    dt=$(($(date +%s) - s))
    rc=$crc
    row "compare $devs" "$(verdict)" "$dt" "$(note_rc "${cnote%; }")"
    [ "$rc" = 0 ] || failed_logs="$failed_logs $clog"
else
    row compare SKIP 0 "no models"
fi
for p in $pids; do wait "$p"; done
for tool in memcheck racecheck; do
    if [ "$built" != 0 ]; then
        row "$tool" SKIP 0 "no build"
    elif [ $dry = 1 ]; then
        row "$tool" SKIP 0 "dry run: needs a GPU"
    elif [ -z "$san" ]; then
        row "$tool" SKIP 0 "compute-sanitizer not found"
    else
        echo "==== compute-sanitizer --tool $tool" >>"$slog"
        cat "$part/$tool" >>"$slog" 2>/dev/null
        read -r rc dt <"$part/$tool.rc" || { rc=1 dt=0; }
        # its last summary line ("ERROR SUMMARY: 0 errors", "RACECHECK SUMMARY: 0 hazards ...")
        summ=$(grep -o '[A-Z]* SUMMARY: .*' "$part/$tool" | tail -n 1)
        unsupported=$(grep -c 'Device not supported' "$part/$tool")
        races_lib=$(grep 'Race reported' "$part/$tool" | grep -c 'nvjet')
        races_own=$(grep -E 'Race reported|Sanitizer Error' "$part/$tool" | grep -vc 'nvjet')
        tests_failed=$(grep -c '^\[  FAILED  \]' "$part/$tool")
        rm -f "$part/$tool" "$part/$tool.rc" # merged into sanitizer.log
        if [ "$unsupported" != 0 ] && [ "$rc" != 0 ]; then
            row "$tool" SKIP "$dt" "compute-sanitizer: device not supported on this host"
        elif [ "$tool" = racecheck ] && [ "$rc" = 3 ] && [ -n "$summ" ] && [ "$races_own" = 0 ] &&
            [ "$tests_failed" = 0 ] && [ "$races_lib" -gt 0 ]; then
            row "$tool" PASS "$dt" "$summ: all $races_lib reports inside cuBLAS's nvjet kernels, none in ferry's"
        else
            row "$tool" "$(verdict)" "$dt" "$(note_rc "${summ:-no summary}")"
            [ "$rc" = 0 ] || failed_logs="$failed_logs $slog"
        fi
    fi
done
[ -s "$slog" ] || echo "compute-sanitizer did not run (see summary.txt)" >"$slog"

# ---- 5. bench ------------------------------------------------------------------------------------------------
belog=$out/bench.log
: >"$belog"
if [ "$models" = 0 ]; then
    if [ $dry = 1 ]; then
        run "$belog" "$(limit 60)" "$bin/ferry" bench-gpu -m "$llama" --device cpu -t 2 --copy-mib 16 --batches 1,2 \
            --ctx 32 --steps 3 --attn-ctx 64,128 --attn-batch 2 --matmul-n 16,32 --reps 3
    else
        run "$belog" "$(limit 180)" "$bin/ferry" bench-gpu -m "$llama" --device cuda --profile \
            --matmul-n 1,8,64,512,1024,2048
        brc=$rc
        # the vector matmul staged through shared memory (FY_CUDA_MMV=staged), decode and matmuls again
        echo "==== FY_CUDA_MMV=staged" >>"$belog"
        run "$belog" "$(limit 60)" env FY_CUDA_MMV=staged "$bin/ferry" bench-gpu -m "$llama" --device cuda \
            --only decode,matmul --matmul-n 1,8
        [ "$brc" = 0 ] || rc=$brc
    fi
    copy=$(sed -n 's/^| copy | .* | \([0-9.]* GB\/s\).*/\1/p' "$belog" | head -1)
    b1=$(sed -n 's/^| 1 | [0-9.]* | [0-9.]* | [^|]* | [0-9.]* | \([0-9]*%\) |.*/\1/p' "$belog" | head -1)
    g1=$(sed -n 's/^| 1 | [0-9.]* | [0-9.]* | [^|]* | [0-9.]* | [0-9]*% | [0-9.]* | \([^|]*\) |$/\1/p' "$belog" | head -1)
    s1=$(sed -n '/^==== FY_CUDA_MMV=staged/,$ s/^| 1 | [0-9.]* | [0-9.]* | [^|]* | [0-9.]* | \([0-9]*%\) |.*/\1/p' "$belog" | head -1)
    row bench-gpu "$(verdict)" "$dt" \
        "$(note_rc "copy ${copy:-?}; decode batch 1 at ${b1:-?} of copy${s1:+ (staged matmul: $s1)}; graphs save: ${g1:-?}")"
    [ "$rc" = 0 ] || failed_logs="$failed_logs $belog"
else
    row bench-gpu SKIP 0 "no models"
fi

# ---- 6. cluster ----------------------------------------------------------------------------------------------
# a disaggregated cluster on this host (tools/gpu_cluster.sh: 1 prefill and 1
# decode worker, each a process) on the GPU with KV staged through pinned host
# memory, then on the CPU: the same answers, transfers that passed the layout
# handshake, and every block back in its pool
ulog=$out/cluster.log
: >"$ulog"
if [ "$models" = 0 ]; then
    udir=build/gpu-check-cluster
    rm -rf "$udir"
    # the Llama shape with the byte tokenizer's 259 tokens as its vocabulary:
    # every generated token is a byte of the answer, so equal answers are
    # equal tokens (with the 128k vocabulary most tokens print nothing)
    umodel=$mdir/llama3-8b-shape-bytes.gguf
    s=$(date +%s)
    echo "\$ mkbench $umodel q4_k_m $largs --vocab 259" >>"$ulog"
    timeout -k 5 "$(limit 60)" "$build/tests/mkbench" "$umodel" q4_k_m $largs --vocab 259 >>"$ulog" 2>&1
    if [ $dry = 1 ]; then
        udev="cpu cpu" ux="staged auto"
    else
        udev="cuda cpu" ux="${GPU_CLUSTER_XFER:-staged} auto"
    fi
    urc=0
    set -- $ux
    for d in $udev; do
        lim=$(limit 90)
        dd=$d
        [ -e "$udir/$d" ] && dd=$d-2
        mkdir -p "$udir/$dd"
        GPU_CLUSTER_XFER=$1 FERRY_BIN=$bin run "$ulog" "$lim" sh tools/gpu_cluster.sh "$umodel" "$d" "$udir/$dd"
        shift
        [ "$rc" = 0 ] || urc=$rc
        for f in answers status metrics; do
            echo "---- $dd.$f" >>"$ulog"
            cat "$udir/$dd/$d.$f" >>"$ulog" 2>/dev/null
        done
        for w in prefill-0 decode-0; do
            echo "---- $dd: the end of $w.log" >>"$ulog"
            tail -n 25 "$udir/$dd/$d-run/logs/$w.log" >>"$ulog" 2>/dev/null
        done
    done
    set -- $udev
    a1=$(ls "$udir"/*/"$1".answers 2>/dev/null | head -1)
    a2=$(ls "$udir"/*/"$2".answers 2>/dev/null | tail -1)
    unote=""
    if [ "$urc" = 0 ]; then
        if grep -q 'falling back to the cpu' "$udir"/*/*-run/logs/*.log 2>/dev/null; then
            urc=1 unote="a worker fell back to the cpu"
        elif ! cmp -s "$a1" "$a2"; then
            urc=1 unote="answers differ (cluster.log)"
        elif grep -E 'state="(used|promised)"} [1-9]' "$udir"/*/*.metrics >/dev/null; then
            urc=1 unote="blocks still held after the requests"
        elif grep -E '(copy_failures_total|peer_failures_total|result="failed")[^ ]* [1-9]' "$udir"/*/*.metrics >/dev/null; then
            urc=1 unote="failed transfers"
        else
            unote="3 answers equal ($ux), every block back"
        fi
    fi
    rc=$urc
    dt=$(($(date +%s) - s))
    row "cluster $(echo $udev | tr ' ' ,)" "$(verdict)" "$dt" "$(note_rc "$unote")"
    [ "$rc" = 0 ] || failed_logs="$failed_logs $ulog"
else
    echo "no models" >"$ulog"
    row cluster SKIP 0 "no models"
fi

# ---- the table -----------------------------------------------------------------------------------------------
for f in $failed_logs; do
    echo
    echo "---- the end of $f"
    tail -n 15 "$f"
done
echo
{
    echo "| step | result | s | note |"
    echo "|---|---|---:|---|"
    printf '%s' "$rows"
    echo "total $(elapsed) s of a ${budget}-s budget; $failed failed; logs in $out"
} | tee -a "$sum"
[ "$failed" = 0 ]
