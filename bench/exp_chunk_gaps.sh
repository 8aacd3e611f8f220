#!/bin/sh
# exp_chunk_gaps.sh - how a stream reaches the client: N greedy streamed
# /v1/completions of MAXTOK tokens one after another against a local 1+1
# cluster (bench/cluster.sh), with speculative decoding as configured
# (decode.spec = ngram) and without it (decode.spec = none) in the same
# run; bench/chunk_gaps.py prints the tokens per SSE chunk and the gaps
# between chunks as the client reads them.  A speculative step's accepted
# run is one chunk (docs/architecture.md, "One chunk per step").
#   N=8 MAXTOK=128 sh bench/exp_chunk_gaps.sh
set -eu
. bench/cluster.sh
PY=${PY:-build/pyenv/bin/python}
for spec in ngram none; do
    cluster_start "chunks-$spec" --set decode.spec=$spec --set serve.metrics= \
        --set prefill.count=1 --set decode.count=1
    echo "== decode.spec = $spec"
    "$PY" bench/chunk_gaps.py "$HTTP_URL" "${N:-8}" "${MAXTOK:-128}"
    cluster_stop
done
