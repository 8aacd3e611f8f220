#!/bin/sh
# exp_grammar_ttft.sh - what a structured output adds to time to first
# token through a cluster (1 prefill, 1 decode worker, 1 thread each):
# chat requests one after another, alternating no response_format, a
# JSON Schema never seen before (its grammar compiled at submission, on
# the prefill worker and again on the decode worker) and the same schema
# again (found in the engines' caches).  Each request's TTFT is the
# router's ferry:time_to_first_token_seconds sum before and after it.
#   sh bench/exp_grammar_ttft.sh     results in bench/results/grammar_ttft/
set -u
cd "$(dirname "$0")/.." || exit 1
. bench/cluster.sh
OUT=${OUT:-bench/results/grammar_ttft}
ROUNDS=${ROUNDS:-12}
mkdir -p "$OUT"
cluster_start grammar-ttft --set prefill.count=1 --set decode.count=1 --set prefill.threads=1 \
    --set decode.threads=1 --set kv.prefix_cache=false || exit 1
python3 - "$HTTP_URL" "$ROUNDS" >"$OUT/ttft.txt" 2>"$OUT/ttft.log" <<'PY'
import json, sys, urllib.request, statistics
url, rounds = sys.argv[1], int(sys.argv[2])
def ttft_sum():
    for line in urllib.request.urlopen(url + "/metrics").read().decode().splitlines():
        if line.startswith("ferry:time_to_first_token_seconds_sum"):
            return float(line.split()[-1])
    raise SystemExit("no ferry:time_to_first_token_seconds_sum")
def schema(i):
    return {"type": "object", "properties": {
        "city%d" % i: {"type": "string", "maxLength": 20},
        "population": {"type": "integer"},
        "landmarks": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "kind": {"enum": ["museum", "park", "bridge", "tower"]}},
            "required": ["name", "kind"]}, "maxItems": 4}},
        "required": ["city%d" % i, "population", "landmarks"]}
def ask(fmt, i):
    body = {"messages": [{"role": "user", "content": "Describe the city of Lyon in %d words, as JSON." % (40 + i)}],
            "max_tokens": 1, "temperature": 0}
    if fmt: body["response_format"] = fmt
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    before = ttft_sum()
    json.loads(urllib.request.urlopen(req).read())
    return ttft_sum() - before
res = {"none": [], "new schema": [], "cached schema": []}
for i in range(rounds):
    res["none"].append(ask(None, i))
    s = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema(i), "strict": True}}
    res["new schema"].append(ask(s, i))
    res["cached schema"].append(ask(s, i))
print("| response_format | requests | TTFT median (ms) | mean (ms) | vs none (median) |")
print("|---|---:|---:|---:|---:|")
base = statistics.median(res["none"])
for k, v in res.items():
    print("| %s | %d | %.1f | %.1f | %+.1f ms |" % (k, len(v), 1e3 * statistics.median(v), 1e3 * statistics.mean(v),
                                                 1e3 * (statistics.median(v) - base)))
PY
echo "exit $?" >>"$OUT/ttft.log"
cat "$OUT/ttft.txt"
cluster_stop
