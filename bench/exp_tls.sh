#!/bin/sh
# exp_tls.sh - what TLS at the router's door (router.tls_cert) costs: two
# clusters of `ferry serve` side by side (a router and one colocated
# decode worker each), one with plain HTTP and one with HTTPS, loaded in
# turn (ROUNDS interleaved rounds, so that neither has the machine to
# itself longer) with short completions (16 prompt tokens, 4 out) from
# ferry-bench, closed loop at CONC in flight over kept-alive connections;
# then the cost of a new connection: NCONN fresh `curl` GETs of /health on
# each, connect, TLS handshake and total time (medians).
#   sh bench/exp_tls.sh            results in bench/results/tls/ (summary.txt)
set -u
cd "$(dirname "$0")/.." || exit 1
BENCH=${BENCH:-bin/ferry-bench}
OUT=${OUT:-bench/results/tls}
BASE=${BASE:-28400}
CONC=${CONC:-4}
N=${N:-100}
ROUNDS=${ROUNDS:-3}
NCONN=${NCONN:-50}
mkdir -p "$OUT"
rm -rf "$OUT/run-http" "$OUT/run-https" "$OUT/pki"
# a CA and a certificate for 127.0.0.1 (P-256)
mkdir -m 700 "$OUT/pki"
(cd "$OUT/pki" && umask 077 && K='-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes' &&
    openssl req -x509 $K -keyout ca.key -out ca.pem -days 2 -subj /CN=bench-ca &&
    printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >server.ext &&
    openssl req $K -keyout server.key -out server.csr -subj /CN=ferry &&
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 \
        -extfile server.ext) >"$OUT/openssl.log" 2>&1 || { cat "$OUT/openssl.log"; exit 1; }
PLAIN=http://127.0.0.1:$((BASE + 80))
TLS=https://127.0.0.1:$((BASE + 180))
start() { # NAME PORT-BASE HTTP-URL [--set ...]
    name=$1 b=$2 url=$3
    shift 3
    bin/ferry serve -c configs/local.ini --set serve.run_dir="$OUT/run-$name" --set serve.metrics= \
        --set router.listen=tcp://127.0.0.1:$b --set router.events=tcp://127.0.0.1:$((b + 1)) \
        --set router.http="$url" --set prefill.count=0 --set decode.count=1 \
        --set decode.listen=tcp://127.0.0.1:$((b + 20)) --set decode.metrics= --set decode.spec=none \
        "$@" >"$OUT/serve-$name.log" 2>&1 &
}
start http $BASE "$PLAIN"
P1=$!
start https $((BASE + 100)) "$TLS" --set router.tls_cert="$OUT/pki/server.pem" \
    --set router.tls_key="$OUT/pki/server.key"
P2=$!
# the private keys and the clusters' run folders do not outlive the run
trap 'kill -TERM $P1 $P2 2>/dev/null; wait $P1 $P2 2>/dev/null; rm -rf "$OUT/pki" "$OUT/run-http" "$OUT/run-https"' \
    EXIT INT TERM
for name in http https; do
    for _ in $(seq 600); do grep -q "cluster ready" "$OUT/serve-$name.log" && break; sleep 0.2; done
    grep -q "cluster ready" "$OUT/serve-$name.log" || { cat "$OUT/serve-$name.log"; exit 1; }
done
for round in $(seq "$ROUNDS"); do
    for name in http https; do
        if [ $name = http ]; then url=$PLAIN ca=; else url=$TLS ca="--cacert $OUT/pki/ca.pem"; fi
        # shellcheck disable=SC2086
        $BENCH --backend http -u "$url" $ca -n "$N" -C "$CONC" --input-len 16 --output-len 4 --seed "$round" \
            --no-progress --label "$name-$round" --json "$OUT/$name-$round.json" >"$OUT/$name-$round.txt" 2>&1 ||
            { cat "$OUT/$name-$round.txt"; exit 1; }
    done
done
{
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys, statistics as st
out, rounds = sys.argv[1], int(sys.argv[2])
for name in ("http", "https"):
    rps, ttft, e2e, failed = [], [], [], 0
    for r in range(1, rounds + 1):
        run = json.load(open(f"{out}/{name}-{r}.json"))["runs"][0]
        rps.append(run["request_throughput"]); failed += run["n_failed"]
        ttft.append(run["ttft"]["p50"] * 1e3); e2e.append(run["e2e"]["p50"] * 1e3)
    print(f"{name:5}: {st.median(rps):6.1f} req/s (rounds {', '.join('%.1f' % x for x in rps)}), "
          f"TTFT p50 {st.median(ttft):5.1f} ms, e2e p50 {st.median(e2e):5.1f} ms, failed {failed}")
PY
for name in http https; do
    if [ $name = http ]; then url=$PLAIN; else url=$TLS; fi
    for _ in $(seq "$NCONN"); do
        curl -s -o /dev/null --cacert "$OUT/pki/ca.pem" -w '%{time_connect} %{time_appconnect} %{time_total}\n' \
            "$url/health"
    done >"$OUT/conn-$name.txt"
    sort -n -k3 "$OUT/conn-$name.txt" | awk -v n="$name" '{c[NR]=$1; a[NR]=$2; t[NR]=$3}
        END {m=int((NR+1)/2); printf "%-5s: a new connection and GET /health, the median of %d by total: %.2f ms (TCP connect at %.2f ms, TLS handshake done at %.2f ms)\n", n, NR, t[m]*1e3, c[m]*1e3, a[m]*1e3}'
done
} | tee "$OUT/summary.txt"
