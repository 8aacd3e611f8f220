/*
 * test_chaos.c - the short chaos run: `ferry chaos` against a local
 * cluster (2 prefill and 2 decode workers on the default model), one round
 * of each fault (a prefill worker, a decode worker and the router killed
 * with SIGKILL, a burst of streams ending at once as a decode worker dies,
 * a decode worker stopped past the health timeout), under HTTP load, with
 * H2O eviction on and every other request asking for a small KV budget.  The
 * run must report: every request ended (none hung, no answer cut outside
 * the router's own death), the cluster healthy after every fault, no KV
 * block left held.  `make chaos` runs 100 rounds.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "cluster_util.h"
#include "testutil.h"

static void test_chaos_rounds(void **state)
{
    if (!tc_available()) skip();
    const char *bin = getenv("FERRY_BIN") ? getenv("FERRY_BIN") : "bin";
    char ferry[512], json[512], model[600];
    snprintf(ferry, sizeof(ferry), "%s/ferry", bin);
    snprintf(json, sizeof(json), "%s", fy_test_path("chaos.json"));
    snprintf(model, sizeof(model), "model.path=%s", tc_model());
    pid_t parent = getpid();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        /* under H2O eviction, every other request with a small KV budget:
         * the faults hit reservations of slots, kept-block transfers and
         * adoptions that place them (`make chaos` runs without eviction) */
        execl(ferry, ferry, "chaos", "-c", "configs/local.ini", "--rounds", "5", "--clients", "3", "--json", json,
              "--kv-budget", "48", "--set", model, "--set", "router.lease=10s", "--set", "decode.kv_mem=128MiB",
              "--set", "prefill.kv_mem=64MiB", "--set", "kv.evict=h2o", (char *)NULL);
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
    const char *kinds[] = {"kill-prefill", "kill-decode", "kill-router", "burst", "stop-decode"};
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        json_t *row = json_object_get(by, kinds[k]);
        assert_non_null(row);
        assert_int_equal(json_integer_value(json_object_get(row, "hung")), 0);
        if (strcmp(kinds[k], "kill-router")) assert_int_equal(json_integer_value(json_object_get(row, "cut")), 0);
        json_int_t n = 0;
        const char *key;
        json_t *v;
        json_object_foreach(row, key, v) n += json_integer_value(v);
        assert_true(n > 0); /* the round ran under load */
    }
    json_decref(j);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chaos_rounds),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fy_test_tmpdir_remove();
    return rc;
}
