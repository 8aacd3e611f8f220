/*
 * test_rpc.c - the nng layer: replies now and later, timeouts, a peer
 * that is not there, cancellation on destroy, event streams in order and
 * a full queue refusing instead of blocking.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mem.h"
#include "rpc.h"
#include "testutil.h"

static char url_buf[4][160];

static const char *url(int i)
{
    snprintf(url_buf[i], sizeof(url_buf[i]), "ipc://%s/s%d", fy_test_tmpdir(), i);
    return url_buf[i];
}

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Echoes requests at once, except "later" (held until release_held) and
 * "never" (held until the end of the test). */
typedef struct srv {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    fy_rpc_call_t *held[32];
    int n_held;
    fy_rpc_call_t *never[32];
    int n_never;
} srv_t;

static void handler(void *arg, fy_rpc_call_t *call, const void *msg, size_t len)
{
    srv_t *s = arg;
    pthread_mutex_lock(&s->mu);
    if (len == 5 && !memcmp(msg, "later", 5)) {
        s->held[s->n_held++] = call;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    if (len == 5 && !memcmp(msg, "never", 5)) {
        s->never[s->n_never++] = call;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    pthread_mutex_unlock(&s->mu);
    fy_rpc_reply(call, msg, len);
}

static void wait_held(srv_t *s, int n)
{
    pthread_mutex_lock(&s->mu);
    while (s->n_held < n) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static void release_all(srv_t *s)
{
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_never; i++) fy_rpc_reply(s->never[i], "late", 4);
    s->n_never = 0;
    pthread_mutex_unlock(&s->mu);
}

typedef struct result {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
    fy_status_t st[32];
    char text[32][16];
} result_t;

static void on_reply(void *arg, fy_status_t st, const void *reply, size_t len)
{
    result_t *r = arg;
    pthread_mutex_lock(&r->mu);
    r->st[r->n] = st;
    if (st == FY_OK) snprintf(r->text[r->n], sizeof(r->text[0]), "%.*s", (int)len, (const char *)reply);
    r->n++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void wait_results(result_t *r, int n)
{
    pthread_mutex_lock(&r->mu);
    while (r->n < n) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

static void test_call_now_and_later(void **state)
{
    srv_t s = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    fy_rpc_server_t *srv;
    assert_int_equal(fy_rpc_server_create(url(0), 8, handler, &s, &srv), FY_OK);
    fy_rpc_client_t *c;
    assert_int_equal(fy_rpc_client_create(url(0), &c), FY_OK);
    void *rep;
    size_t len;
    assert_int_equal(fy_rpc_call(c, "hello", 5, 5.0, &rep, &len), FY_OK);
    assert_int_equal(len, 5);
    assert_memory_equal(rep, "hello", 5);
    fy_free(rep);

    /* three deferred calls and an immediate one in flight together: the
     * immediate one is answered while the others wait, and the deferred
     * ones are answered later from this thread */
    result_t r = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    for (int i = 0; i < 3; i++) assert_int_equal(fy_rpc_call_async(c, "later", 5, 5.0, on_reply, &r), FY_OK);
    wait_held(&s, 3);
    assert_int_equal(fy_rpc_call_async(c, "now", 3, 5.0, on_reply, &r), FY_OK);
    wait_results(&r, 1);
    assert_string_equal(r.text[0], "now");
    for (int i = 0; i < 3; i++) fy_rpc_reply(s.held[i], "done", 4);
    wait_results(&r, 4);
    for (int i = 1; i < 4; i++) {
        assert_int_equal(r.st[i], FY_OK);
        assert_string_equal(r.text[i], "done");
    }
    fy_rpc_client_destroy(c);
    fy_rpc_server_destroy(srv);
}

static void test_timeouts_and_absent_peer(void **state)
{
    srv_t s = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    fy_rpc_server_t *srv;
    assert_int_equal(fy_rpc_server_create(url(1), 4, handler, &s, &srv), FY_OK);
    fy_rpc_client_t *c;
    assert_int_equal(fy_rpc_client_create(url(1), &c), FY_OK);
    void *rep;
    size_t len;
    double t0 = mono();
    assert_int_equal(fy_rpc_call(c, "never", 5, 0.2, &rep, &len), FY_ERR_TIMEOUT);
    double dt = mono() - t0;
    assert_true(dt >= 0.15 && dt < 2.0);
    /* the server still serves; the abandoned call's slot is replied later */
    assert_int_equal(fy_rpc_call(c, "ping", 4, 5.0, &rep, &len), FY_OK);
    fy_free(rep);
    release_all(&s);
    fy_rpc_client_destroy(c);
    fy_rpc_server_destroy(srv);

    /* nobody listens: the call ends at its deadline */
    assert_int_equal(fy_rpc_client_create(url(2), &c), FY_OK);
    t0 = mono();
    assert_int_equal(fy_rpc_call(c, "ping", 4, 0.2, &rep, &len), FY_ERR_TIMEOUT);
    assert_true(mono() - t0 < 2.0);
    /* a peer that comes up later is reached by the same client */
    assert_int_equal(fy_rpc_server_create(url(2), 4, handler, &s, &srv), FY_OK);
    assert_int_equal(fy_rpc_call(c, "ping", 4, 5.0, &rep, &len), FY_OK);
    fy_free(rep);
    fy_rpc_client_destroy(c);
    fy_rpc_server_destroy(srv);
}

static void test_destroy_cancels(void **state)
{
    srv_t s = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    fy_rpc_server_t *srv;
    assert_int_equal(fy_rpc_server_create(url(3), 8, handler, &s, &srv), FY_OK);
    fy_rpc_client_t *c;
    assert_int_equal(fy_rpc_client_create(url(3), &c), FY_OK);
    result_t r = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    for (int i = 0; i < 5; i++) assert_int_equal(fy_rpc_call_async(c, "never", 5, 30.0, on_reply, &r), FY_OK);
    fy_rpc_client_destroy(c); /* returns only after every callback ran */
    assert_int_equal(r.n, 5);
    for (int i = 0; i < 5; i++) assert_int_equal(r.st[i], FY_ERR_CANCELLED);
    release_all(&s);
    fy_rpc_server_destroy(srv);
}

typedef struct sink {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
    int last;
    bool in_order;
} sink_t;

static void on_event(void *arg, const void *buf, size_t len)
{
    sink_t *k = arg;
    int v = -1;
    if (len == sizeof(int)) memcpy(&v, buf, sizeof(int));
    pthread_mutex_lock(&k->mu);
    if (v != k->last + 1) k->in_order = false;
    k->last = v;
    k->n++;
    pthread_cond_broadcast(&k->cv);
    pthread_mutex_unlock(&k->mu);
}

static void test_push_pull(void **state)
{
    char u[160];
    snprintf(u, sizeof(u), "ipc://%s/events", fy_test_tmpdir());
    sink_t k = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .last = -1, .in_order = true};
    /* the pusher may come first: messages wait in its queue */
    fy_push_t *p;
    assert_int_equal(fy_push_create(u, 1024, &p), FY_OK);
    for (int i = 0; i < 100; i++) assert_int_equal(fy_push_send(p, &i, sizeof(i)), FY_OK);
    fy_pull_t *q;
    assert_int_equal(fy_pull_create(u, on_event, &k, &q), FY_OK);
    for (int i = 100; i < 2000; i++) {
        while (fy_push_send(p, &i, sizeof(i)) == FY_ERR_NO_SPACE) usleep(1000);
    }
    pthread_mutex_lock(&k.mu);
    double t0 = mono();
    while (k.n < 2000 && mono() - t0 < 20) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&k.cv, &k.mu, &ts);
    }
    pthread_mutex_unlock(&k.mu);
    assert_int_equal(k.n, 2000);
    assert_true(k.in_order);
    fy_pull_destroy(q);

    /* nobody reads: the queue fills and sends are refused at once, never blocking */
    double t1 = mono();
    int refused = 0;
    for (int i = 0; i < 3000 && !refused; i++) refused = fy_push_send(p, &i, sizeof(i)) == FY_ERR_NO_SPACE;
    assert_true(refused);
    assert_true(fy_push_dropped(p) >= 1);
    assert_true(mono() - t1 < 5.0);
    fy_push_destroy(p);
}

static void test_error_messages(void **state)
{
    fy_msgw_t w;
    fy_msg_error(&w, 42, FY_ERR_OVERLOADED, "too busy");
    void *buf;
    size_t len;
    assert_int_equal(fy_msgw_finish(&w, &buf, &len), FY_OK);
    fy_msgr_t r;
    assert_int_equal(fy_msgr_parse(&r, buf, len), FY_OK);
    assert_string_equal(fy_msgr_type(&r), "error");
    char code[32], msg[64];
    fy_msgr_str(&r, "code", FY_REQ, NULL, code, sizeof(code));
    fy_msgr_str(&r, "message", FY_REQ, NULL, msg, sizeof(msg));
    assert_string_equal(code, "overloaded");
    assert_string_equal(msg, "too busy");
    assert_int_equal(fy_msg_error_code(code), FY_ERR_OVERLOADED);
    assert_int_equal(fy_msg_error_code("nonsense"), FY_ERR_INTERNAL);
    for (int st = 1; st < FY_STATUS_COUNT; st++) assert_int_equal(fy_msg_error_code(fy_status_tag(st)), st);
    fy_msgr_free(&r);
    fy_free(buf);
}

static int teardown(void **state)
{
    fy_test_tmpdir_remove();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_call_now_and_later),
        cmocka_unit_test(test_timeouts_and_absent_peer),
        cmocka_unit_test(test_destroy_cancels),
        cmocka_unit_test(test_push_pull),
        cmocka_unit_test(test_error_messages),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
