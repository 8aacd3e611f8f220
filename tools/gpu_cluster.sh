#!/bin/sh
# gpu_cluster.sh MODEL DEVICE OUTDIR - a disaggregated cluster (1 prefill, 1 decode
# worker, each its own process) on one host, on DEVICE (cuda or cpu), KV moved
# between them as worker.kv_transfer says (GPU_CLUSTER_XFER, default staged for
# cuda, auto for cpu): 3 greedy prompts of 32 tokens, then the cluster's status
# (every worker's blocks) and both workers' KV and staging metrics (curl, or
# python3 where there is no curl).  Use a model whose vocabulary is the byte
# tokenizer's 259 tokens (tests/mkbench --vocab 259), so that every generated
# token is a byte of the answer and equal answers mean equal tokens.
# Writes OUTDIR/DEVICE.answers (one answer a line), OUTDIR/DEVICE.status,
# OUTDIR/DEVICE.metrics and the workers' logs under OUTDIR/DEVICE-run/logs.
# Run it for cuda and cpu and compare the .answers files (tools/gpu_check.sh
# step 6 does).  Exit status 0 when the cluster answered all 3 prompts and
# both workers' metrics were read.
set -u
[ $# = 3 ] || { echo "usage: sh tools/gpu_cluster.sh MODEL cuda|cpu OUTDIR" >&2 && exit 2; }
m=$1 dev=$2 od=$3
bin=${FERRY_BIN:-bin}
mkdir -p "$od" || exit 1
run=$od/$dev-run
rm -rf "$run"
case "$dev" in cuda) xfer=${GPU_CLUSTER_XFER:-staged} ;; *) xfer=${GPU_CLUSTER_XFER:-auto} ;; esac
# ports apart from configs/local.ini's defaults, so a cluster left on them does not answer
sets="--set model.path=$m --set serve.run_dir=$run --set worker.device=$dev --set worker.kv_transfer=$xfer
 --set prefill.count=1 --set decode.count=1 --set prefill.threads=4 --set decode.threads=4
 --set router.listen=tcp://127.0.0.1:7700 --set router.events=tcp://127.0.0.1:7701 --set router.http=
 --set prefill.listen=tcp://127.0.0.1:7710 --set prefill.metrics=http://127.0.0.1:7810
 --set decode.listen=tcp://127.0.0.1:7720 --set decode.metrics=http://127.0.0.1:7820
 --set prefill.kv_mem=256MiB --set decode.kv_mem=512MiB"
# shellcheck disable=SC2086
"$bin/ferry" serve -c configs/local.ini $sets >"$od/$dev.serve.log" 2>&1 &
sp=$!
req() { "$bin/ferry" request -r tcp://127.0.0.1:7700 --secret "$run/kv.secret" "$@"; }
i=0
until req --status >/dev/null 2>&1; do
    i=$((i + 1))
    if [ $i -gt 120 ] || ! kill -0 $sp 2>/dev/null; then
        echo "$dev: the cluster did not come up (serve.log):"
        tail -n 20 "$od/$dev.serve.log"
        kill $sp 2>/dev/null
        wait $sp 2>/dev/null
        exit 1
    fi
    sleep 0.5
done
ok=0
: >"$od/$dev.answers"
for p in "The quick brown fox jumps over the lazy dog. Once upon a time" \
    "int main(void) { return 0; } // a program that" \
    "Paris is the capital of France, and Berlin is the capital of"; do
    # several prompts' blocks: a prompt of 3 blocks and more
    p="$p $p $p"
    if a=$(req -p "$p" -n 32 --ignore-eos -q --timeout 120 2>>"$od/$dev.request.log"); then
        ok=$((ok + 1))
        printf '%s\n' "$a" | od -An -c | tr -s ' ' | tr -d '\n' >>"$od/$dev.answers"
        echo >>"$od/$dev.answers"
    else
        echo "(no answer)" >>"$od/$dev.answers"
    fi
done
sleep 1
req --status >"$od/$dev.status" 2>&1
# a GPU host may have no curl (the first GPU run's had none, and this read nothing): python3 then
scrape() {
    { curl -s "$1" 2>/dev/null ||
        python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
            "$1" 2>/dev/null; } | grep -E '^ferry:(kv_blocks|kv_staging|kv_transfer|layout)' | grep -v _bucket
}
scrape http://127.0.0.1:7820/metrics >"$od/$dev.metrics"
scrape http://127.0.0.1:7810/metrics >>"$od/$dev.metrics"
kill -INT $sp 2>/dev/null
wait $sp 2>/dev/null
echo "$dev ($xfer): $ok of 3 answered; $(grep -c 'state="used"' "$od/$dev.metrics") pools' metrics read"
[ $ok = 3 ] && [ "$(grep -c 'state="used"' "$od/$dev.metrics")" = 2 ]
