# cluster.sh - sourced by the experiment scripts: start and stop a local
# ferry cluster (`ferry serve`) on ports of its own (17400..., HTTP
# 18080), so an experiment never meets another cluster on this host.
#   cluster_start NAME [--set key=value ...]   waits until it is ready
#   cluster_stop                               SIGTERM, then waits
# Variables: ROUTER (nng address), SECRET (the cluster's secret file, for
# ferry-bench --secret), HTTP_URL, CLUSTER_LOG.
FERRY=${FERRY:-bin/ferry}
BENCH=${BENCH:-bin/ferry-bench}
ROUTER=tcp://127.0.0.1:17400
HTTP_URL=http://127.0.0.1:18080
CLUSTER_PID=

cluster_start() {
    cname=$1
    shift
    run_dir=${RUN_BASE:-run/bench}/$cname
    rm -rf "$run_dir"
    mkdir -p "$run_dir"
    CLUSTER_LOG=$run_dir/serve.log
    SECRET=$run_dir/kv.secret
    "$FERRY" serve -c configs/local.ini \
        --set serve.run_dir="$run_dir" \
        --set router.listen=$ROUTER --set router.events=tcp://127.0.0.1:17401 \
        --set router.http=$HTTP_URL \
        --set prefill.listen=tcp://127.0.0.1:17410 --set decode.listen=tcp://127.0.0.1:17420 \
        "$@" >"$CLUSTER_LOG" 2>&1 &
    CLUSTER_PID=$!
    i=0
    while ! grep -q "cluster ready" "$CLUSTER_LOG" 2>/dev/null; do
        if ! kill -0 "$CLUSTER_PID" 2>/dev/null || [ $i -ge 1200 ]; then
            echo "cluster $cname did not start; its log:" >&2
            tail -20 "$CLUSTER_LOG" >&2
            cluster_stop
            return 1
        fi
        sleep 0.1
        i=$((i + 1))
    done
    echo "cluster $cname: $(grep 'cluster ready' "$CLUSTER_LOG")" >&2
}

cluster_stop() {
    [ -n "$CLUSTER_PID" ] || return 0
    kill -TERM "$CLUSTER_PID" 2>/dev/null
    wait "$CLUSTER_PID" 2>/dev/null
    CLUSTER_PID=
}

trap cluster_stop EXIT INT TERM
