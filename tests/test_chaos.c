/*
 * test_chaos.c - the short chaos run: `ferry chaos` against a local
 * cluster (2 prefill and 2 decode workers on the default model), one round
 * of each fault (a prefill worker, a decode worker and the router killed
 * with SIGKILL, a burst of streams ending at once as a decode worker dies,
 * a decode worker stopped past the health timeout), under HTTP load, with
 * H2O eviction on and every other request asking for a small KV budget.  The
 * run must report: every request ended (none hung, no answer cut outside
 * the router's own death), the cluster healthy after every fault, no KV
 * block left held; and on a cluster with etcd and two routers, etcd
 * stopped past every lease and a router killed.  `make chaos` runs 100
 * rounds (with etcd and two routers).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "tests/cluster_util.h"
#include "tests/testutil.h"

/* Runs `ferry chaos` with args (NULL-terminated, after the binary and
 * "chaos"); its JSON summary must show no failure and no leaked block,
 * and every kind in kinds a round under load with no hung request and no
 * cut answer (the router's own death aside). */
static void run_chaos(const char *const *args, const char *const *kinds, size_t n_kinds)
{
    const char *bin = getenv("FERRY_BIN") ? getenv("FERRY_BIN") : "bin";
    char ferry[512], json[512], model[600];
    snprintf(ferry, sizeof(ferry), "%s/ferry", bin);
    snprintf(json, sizeof(json), "%s", fy_test_path("chaos.json"));
    snprintf(model, sizeof(model), "model.path=%s", tc_model());
    const char *argv[48];
    int na = 0;
    argv[na++] = ferry, argv[na++] = "chaos", argv[na++] = "-c", argv[na++] = "configs/local.ini";
    argv[na++] = "--json", argv[na++] = json, argv[na++] = "--set", argv[na++] = model;
    for (int i = 0; args[i] && na < 47; i++) argv[na++] = args[i];
    argv[na] = NULL;
    unlink(json);
    pid_t parent = getpid();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        execv(ferry, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    json_error_t err;
    json_t *j = json_load_file(json, 0, &err);
    if (!j) fail_msg("ferry chaos wrote no summary (status 0x%x): %s", status, err.text);
    const char *first = json_string_value(json_object_get(j, "first_failure"));
    print_message("chaos: %lld requests, recovered in at most %.2f s, %lld failures%s%s\n",
                  (long long)json_integer_value(json_object_get(j, "requests")),
                  json_real_value(json_object_get(j, "recover_max_s")),
                  (long long)json_integer_value(json_object_get(j, "failures")), first && *first ? ": " : "",
                  first ? first : "");
    assert_int_equal(json_integer_value(json_object_get(j, "failures")), 0);
    assert_int_equal(json_integer_value(json_object_get(j, "leaked_blocks")), 0);
    json_t *by = json_object_get(j, "outcomes");
    for (size_t k = 0; k < n_kinds; k++) {
        json_t *row = json_object_get(by, kinds[k]);
        assert_non_null(row);
        assert_int_equal(json_integer_value(json_object_get(row, "hung")), 0);
        if (strcmp(kinds[k], "kill-router")) assert_int_equal(json_integer_value(json_object_get(row, "cut")), 0);
        if (!strcmp(kinds[k], "stop-etcd")) { /* an etcd stall alone ends nothing */
            assert_int_equal(json_integer_value(json_object_get(row, "stream_error")), 0);
            assert_int_equal(json_integer_value(json_object_get(row, "http_error")), 0);
        }
        json_int_t n = 0;
        const char *key;
        json_t *v;
        json_object_foreach(row, key, v) n += json_integer_value(v);
        assert_true(n > 0); /* the round ran under load */
    }
    json_decref(j);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_chaos_rounds(void **state)
{
    if (!tc_available()) skip();
    /* under H2O eviction, every other request with a small KV budget:
     * the faults hit reservations of slots, kept-block transfers and
     * adoptions that place them (`make chaos` runs without eviction) */
    const char *const args[] = {"--rounds",    "5",
                                "--clients",   "3",
                                "--kv-budget", "48",
                                "--set",       "router.lease=10s",
                                "--set",       "decode.kv_mem=128MiB",
                                "--set",       "prefill.kv_mem=64MiB",
                                "--set",       "kv.evict=h2o",
                                NULL};
    const char *kinds[] = {"kill-prefill", "kill-decode", "kill-router", "burst", "stop-decode"};
    run_chaos(args, kinds, sizeof(kinds) / sizeof(kinds[0]));
}

/* Rank groups as workers (issue 21): a follower rank killed under load,
 * in a decode group of three tensor ranks and a prefill group of two
 * pipeline stages, and once a whole decode worker for comparison: every
 * request ends, the worker is started again with its group, and every
 * block comes back. */
static void test_chaos_ranks(void **state)
{
    if (!tc_available()) skip();
    const char *const args[] = {"--rounds",  "3",
                                "--clients", "2",
                                "--faults",  "kill-rank,kill-decode",
                                "--set",     "decode.count=1",
                                "--set",     "decode.tp=3",
                                "--set",     "prefill.count=1",
                                "--set",     "prefill.pp=2",
                                "--set",     "decode.kv_mem=64MiB",
                                "--set",     "prefill.kv_mem=64MiB",
                                NULL};
    const char *kinds[] = {"kill-rank", "kill-decode"};
    run_chaos(args, kinds, 2);
}

/* Membership in etcd with two routers (configs/chaos-etcd.ini, as `make
 * chaos` runs): etcd stopped past every lease (issue 32: 6 stream errors
 * and a 502 before), and a router killed while the other serves. */
static void test_chaos_etcd(void **state)
{
    if (!tc_available() || !tc_etcd_available()) skip();
    const char *const args[] = {
        "-c",    "configs/chaos-etcd.ini",  "--rounds", "2", "--clients", "3", "--faults", "stop-etcd,kill-router",
        "--set", "serve.restart_window=5s", NULL};
    const char *kinds[] = {"stop-etcd", "kill-router"};
    run_chaos(args, kinds, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chaos_rounds),
        cmocka_unit_test(test_chaos_ranks),
        cmocka_unit_test(test_chaos_etcd),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fy_test_tmpdir_remove();
    return rc;
}
