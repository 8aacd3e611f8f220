/*
 * test_cli.c - every command line as a user types it: each ferry
 * subcommand, ferry-router/-prefill/-decode, ferry-bench and its
 * subcommands run (fork/exec of $FERRY_BIN/..., no shell) with --help and
 * -h (the usage on stdout, nothing on stderr, status 0, and nothing
 * started: `ferry info --help` once looked for a model named --help) and
 * with an unknown option (the usage on stderr, nothing on stdout, status
 * 2).  -c is a configuration file wherever it is taken (a missing one is
 * named, status 2); ferry-bench's concurrency is -C and -c is refused
 * with a hint.  Options that parse reach the work: a model that is not
 * there is named, status 1.  Log lines carry the time and the process's
 * name.  `ferry --version` names the nng linked.
 *
 * Nothing here listens or loads a model; each run has a deadline.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <regex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/mem.h"
#include "rpc/rpc.h"
#include "tools/cli.h"
#include "tests/testutil.h"

/* a command's deadline; a sanitizer build's forward pass is several
 * times slower (UBSan's bench-batch of 16 x 160 prompt tokens outlived
 * 30 s beside two other sanitizer suites, 2026-11-29) */
#ifdef FY_DEBUG
#define RUN_DEADLINE_S 120.0
#else
#define RUN_DEADLINE_S 30.0
#endif

typedef fy_test_run_t run_t;

static void run_free(run_t *r) { fy_test_run_free(r); }

/* bin/PROG ARGS... (NULL-terminated), stdout and stderr to files, stdin
 * from /dev/null; fails the test past the deadline. */
static run_t run_argv(const char *const *args)
{
    char prog[PATH_MAX];
    snprintf(prog, sizeof(prog), "%s/%s", fy_test_bindir(), args[0]);
    return fy_test_run(prog, args + 1, RUN_DEADLINE_S);
}

/* The commands: the program, then the subcommand's words (NULL-padded). */
typedef struct cmd {
    const char *argv[3];
} cmd_t;

static const cmd_t COMMANDS[] = {
    {{"ferry", "generate"}},      {{"ferry", "info"}},
    {{"ferry", "bench"}},         {{"ferry", "bench-kv"}},
    {{"ferry", "bench-batch"}},   {{"ferry", "bench-xfer"}},
    {{"ferry", "bench-spec"}},    {{"ferry", "bench-ttft"}},
    {{"ferry", "bench-ranks"}},   {{"ferry", "plan"}},
    {{"ferry", "request"}},       {{"ferry", "serve"}},
    {{"ferry", "chaos"}},         {{"ferry"}},
    {{"ferry-router"}},           {{"ferry-prefill"}},
    {{"ferry-decode"}},           {{"ferry-bench"}},
    {{"ferry-bench", "echo"}},    {{"ferry-bench", "auth"}},
    {{"ferry", "config"}},        {{"ferry", "bench-group"}},
    {{"ferry", "bench-reshard"}}, {{"ferry", "bench-prec"}},
};
#define N_COMMANDS (int)(sizeof(COMMANDS) / sizeof(COMMANDS[0]))

static bool have_bins(void)
{
    const char *need[] = {"ferry", "ferry-router", "ferry-prefill", "ferry-decode", "ferry-bench"};
    for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s/%s", fy_test_bindir(), need[i]);
        if (access(path, X_OK)) {
            print_message("skipped: %s is not built\n", path);
            return false;
        }
    }
    return true;
}

/* The command's words, then extra (NULL-terminated), as one argv. */
static run_t run_cmd(const cmd_t *c, const char *const *extra)
{
    const char *args[24];
    int n = 0;
    for (int i = 0; i < 3 && c->argv[i]; i++) args[n++] = c->argv[i];
    for (int i = 0; extra[i] && n < 23; i++) args[n++] = extra[i];
    args[n] = NULL;
    return run_argv(args);
}

static const char *name_of(const cmd_t *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%s%s", c->argv[0], c->argv[1] ? " " : "", c->argv[1] ? c->argv[1] : "");
    return buf;
}

static void test_help(void **state)
{
    if (!have_bins()) skip();
    const char *flags[] = {"--help", "-h"};
    for (int i = 0; i < N_COMMANDS; i++) {
        for (int f = 0; f < 2; f++) {
            char name[64];
            const char *extra[] = {flags[f], NULL};
            run_t r = run_cmd(&COMMANDS[i], extra);
            name_of(&COMMANDS[i], name, sizeof(name));
            if (r.status != 0 || !strstr(r.out, "usage: ") || r.err[0])
                fail_msg("%s %s: status %d (want 0), stdout:\n%s\nstderr:\n%s", name, flags[f], r.status, r.out, r.err);
            /* the usage names the command it is for */
            if (!strstr(r.out, COMMANDS[i].argv[1] ? COMMANDS[i].argv[1] : COMMANDS[i].argv[0]))
                fail_msg("%s %s: the usage does not name it:\n%s", name, flags[f], r.out);
            /* where it points for the keys, it points to the complete reference: configs/local.ini sets
             * some 50 of the table's keys; ferry-bench's --model asks the server, not for a "default" */
            if (strstr(r.out, "documents every key") ||
                (strstr(r.out, "--config FILE      the cluster's configuration") &&
                 !strstr(r.out, "ferry config --markdown")) ||
                strstr(r.out, "default \"default\""))
                fail_msg("%s %s: the usage points to an incomplete reference or a wrong default:\n%s", name, flags[f],
                         r.out);
            run_free(&r);
        }
    }
}

/* `ferry --version` names the nng it links (build/nng's from make deps,
 * or the system's): the one this test links, built by the same make. */
static void test_version(void **state)
{
    if (!have_bins()) skip();
    const char *args[] = {"ferry", "--version", NULL};
    run_t r = run_argv(args);
    char want[96];
    snprintf(want, sizeof(want), "ferry: nng %s%s\n", fy_rpc_nng_version(),
             fy_rpc_nng_fixed() ? "" : " (older than 1.6: nng issue 1653; make deps builds nng 1.11)");
    if (r.status != 0 || strcmp(r.out, want) || r.err[0])
        fail_msg("ferry --version: status %d (want 0), stdout:\n%s\n(want %s)stderr:\n%s", r.status, r.out, want,
                 r.err);
    run_free(&r);
}

static void test_unknown_option(void **state)
{
    if (!have_bins()) skip();
    const char *bad[][3] = {{"--no-such-option", NULL}, {"-Z", NULL}, {"--help=x", NULL}};
    for (int i = 0; i < N_COMMANDS; i++) {
        for (int b = 0; b < 3; b++) {
            char name[64];
            run_t r = run_cmd(&COMMANDS[i], bad[b]);
            name_of(&COMMANDS[i], name, sizeof(name));
            /* bare `ferry` takes a command, not an option: its "unknown command" */
            bool named = strstr(r.err, "unrecognized option") || strstr(r.err, "invalid option") ||
                         strstr(r.err, "doesn't allow an argument") || strstr(r.err, "unknown command");
            if (r.status != 2 || !strstr(r.err, "usage: ") || r.out[0] || !named)
                fail_msg("%s %s: status %d (want 2), stdout:\n%s\nstderr:\n%s", name, bad[b][0], r.status, r.out,
                         r.err);
            run_free(&r);
        }
    }
}

/* -c FILE is a configuration wherever it is taken: a missing one is named. */
static void test_config_flag(void **state)
{
    if (!have_bins()) skip();
    char missing[PATH_MAX]; /* fy_test_path's buffers rotate */
    snprintf(missing, sizeof(missing), "%s", fy_test_path("no-such.ini"));
    const cmd_t takers[] = {
        {{"ferry", "serve"}}, {{"ferry", "request"}}, {{"ferry", "chaos"}},
        {{"ferry-router"}},   {{"ferry-prefill"}},    {{"ferry-decode"}},
    };
    for (size_t i = 0; i < sizeof(takers) / sizeof(takers[0]); i++) {
        char name[64];
        const char *extra[] = {"-c", missing, "-p", "x", NULL};
        if (strcmp(takers[i].argv[1] ? takers[i].argv[1] : "", "request")) extra[2] = NULL; /* -p: request's */
        run_t r = run_cmd(&takers[i], extra);
        name_of(&takers[i], name, sizeof(name));
        if (r.status != 2 || !strstr(r.err, "no-such.ini"))
            fail_msg("%s -c %s: status %d (want 2), stderr:\n%s", name, missing, r.status, r.err);
        run_free(&r);
    }
    /* ferry-bench's concurrency is -C; -c is refused, with a hint */
    const char *old[] = {"ferry-bench", "-c", "8", NULL};
    run_t r = run_argv(old);
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "-C (--concurrency)"));
    run_free(&r);
    /* -C parses: the run goes on to the address check (a remote one is refused) */
    const char *now[] = {"ferry-bench", "-C", "8", "-u", "tcp://192.0.2.1:7400", "-n", "1", NULL};
    r = run_argv(now);
    assert_int_equal(r.status, 2);
    assert_null(strstr(r.err, "usage: "));
    assert_non_null(strstr(r.err, "192.0.2.1"));
    run_free(&r);
}

/* Options that parse reach the work: the model that is not there is named. */
static void test_options_reach_the_work(void **state)
{
    if (!have_bins()) skip();
    char missing[PATH_MAX];
    snprintf(missing, sizeof(missing), "%s", fy_test_path("no-such-model.gguf"));
    const char *runs[][16] = {
        {"ferry", "generate", "-m", missing, "-p", "hi", "-n", "4", "--temp", "0", "--top-k", "5", "-t", "1", NULL},
        {"ferry", "info", missing, NULL},
        {"ferry", "info", "-m", missing, NULL},
        {"ferry", "bench", "-m", missing, "--threads", "1", "--reps", "1", NULL},
        {"ferry", "bench", "-m", missing, "--alternate", "FY_CPU_FUSE=0,1", "--reps", "1", NULL},
        {"ferry", "bench-batch", "-m", missing, "--batches", "1,2", "-t", "1", NULL},
        {"ferry", "bench-spec", "--model", missing, "--batch", "1", "--workload", "open", NULL},
        {"ferry", "plan", "-m", missing, "--kv-mem", "1GiB", NULL},
    };
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        run_t r = run_argv(runs[i]);
        if (r.status != 1 || !strstr(r.err, "no-such-model.gguf") || strstr(r.err, "usage: "))
            fail_msg("ferry %s: status %d (want 1), stderr:\n%s", runs[i][1], r.status, r.err);
        run_free(&r);
    }
    /* a bad value is refused before any work, naming the option */
    const char *bad[] = {"ferry", "generate", "-m", missing, "-p", "hi", "--top-p", "2", NULL};
    run_t r = run_argv(bad);
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "--top-p expects"));
    assert_null(strstr(r.err, "no-such-model"));
    run_free(&r);
    const char *bad_alt[] = {"ferry", "bench", "-m", missing, "--alternate", "FY_CPU_FUSE", NULL};
    r = run_argv(bad_alt);
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "--alternate takes VAR=A,B"));
    assert_null(strstr(r.err, "no-such-model"));
    run_free(&r);
    /* a worker's CPU list is applied first thing at start-up: one it may
     * not use, or one that does not parse, stops it with the key named */
    const char *cpus[][4] = {{"ferry-decode", "--set", "decode.cpus=1023", NULL},
                             {"ferry-prefill", "--set", "prefill.cpus=0-x", NULL}};
    for (size_t i = 0; i < 2; i++) {
        r = run_argv(cpus[i]);
        if (r.status != 1 || !strstr(r.err, i ? "prefill.cpus = '0-x'" : "decode.cpus: CPU 1023"))
            fail_msg("%s %s: status %d (want 1), stderr:\n%s", cpus[i][0], cpus[i][2], r.status, r.err);
        run_free(&r);
    }
    /* ranks a model cannot be split into are refused before any process is
     * forked, naming the counts (SmolLM2 has 9 heads) */
    const char *model = fy_test_default_model();
    if (model) {
        const char *tp[] = {"ferry", "generate", "-m", model, "-p", "hi", "-n", "1", "--tp", "2", NULL};
        r = run_argv(tp);
        if (r.status != 2 || !strstr(r.err, "tp 2 does not divide the model's 9 attention heads"))
            fail_msg("generate --tp 2: status %d (want 2), stderr:\n%s", r.status, r.err);
        run_free(&r);
        /* a decode benchmark without a decode-only window (16 prompts of 160
         * tokens take 5 prefill steps of 512; each request ends after 4
         * tokens) says so instead of printing a row of zeros */
        const char *nosteady[] = {"ferry", "bench-batch",  "-m", model, "--batches", "16", "--prompt-tokens",
                                  "160",   "--gen-tokens", "4",  "-t",  "2",         NULL};
        r = run_argv(nosteady);
        if (r.status != 1 || !strstr(r.err, "batch 16: no steady state") || strstr(r.out, "| 16 |"))
            fail_msg("bench-batch without a steady state: status %d (want 1), stdout:\n%s\nstderr:\n%s", r.status,
                     r.out, r.err);
        run_free(&r);
    }
    /* an operand where none is taken */
    const char *extra[] = {"ferry", "bench-kv", "now", NULL};
    r = run_argv(extra);
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err, "unexpected argument 'now'"));
    run_free(&r);
}

/* Without -m, generate and info run the default model (relative to the
 * working directory); where it is not there they say which file they
 * looked for, where, and that `make model` fetches it, rather than the
 * loader's bare "cannot open". */
static void test_no_default_model(void **state)
{
    if (!have_bins()) skip();
    char prog[PATH_MAX], cwd[PATH_MAX];
    assert_non_null(realpath(fy_test_bindir(), prog));
    strncat(prog, "/ferry", sizeof(prog) - strlen(prog) - 1);
    assert_non_null(getcwd(cwd, sizeof(cwd)));
    assert_int_equal(chdir(fy_test_tmpdir()), 0); /* no models/ here */
    const char *const runs[][8] = {{"generate", "-p", "hi", "-n", "1", NULL}, {"info", NULL}};
    for (size_t i = 0; i < FY_ARRAY_LEN(runs); i++) {
        run_t r = fy_test_run(prog, runs[i], RUN_DEADLINE_S);
        if (r.status != 1 || !strstr(r.err, "-m was not given") || !strstr(r.err, "make model") ||
            !strstr(r.err, "models/SmolLM2-135M-Instruct.Q4_1.gguf") || !strstr(r.err, fy_test_tmpdir()))
            fail_msg("ferry %s without a model: status %d (want 1), stderr:\n%s", runs[i][0], r.status, r.err);
        run_free(&r);
    }
    assert_int_equal(chdir(cwd), 0);
}

/* The answer ends its line before the summary: one newline where its text
 * did not end with one, none where it did, none for an empty answer. */
static void test_answer_line(void **state)
{
    static const struct {
        const char *pieces[3], *want;
    } cases[] = {
        {{"Blue", " sky", NULL}, "Blue sky\n"},
        {{"Blue", " sky\n", NULL}, "Blue sky\n"},
        {{"a\n", "", NULL}, "a\n"},
        {{NULL}, ""},
    };
    for (size_t i = 0; i < FY_ARRAY_LEN(cases); i++) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        assert_non_null(f);
        fy_cli_answer_t a = {.out = f};
        for (int k = 0; k < 3 && cases[i].pieces[k]; k++)
            fy_cli_answer_put(&a, cases[i].pieces[k], strlen(cases[i].pieces[k]));
        fy_cli_answer_end(&a);
        assert_int_equal(len, strlen(cases[i].want)); /* flushed: all of it there before the summary */
        fclose(f);
        assert_string_equal(buf, cases[i].want);
        free(buf);
    }
}

/* "TIME NAME: LEVEL: MESSAGE", time in UTC with milliseconds; a %m sees
 * the caller's errno, which logging leaves as it was. */
static void test_log_line(void **state)
{
    regex_t re;
    assert_int_equal(regcomp(&re,
                             "^20[0-9][0-9]-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9]\\.[0-9]{3}Z "
                             "(test_cli|decode-7): (error|warning): ",
                             REG_EXTENDED | REG_NOSUB),
                     0);
    fy_test_log_begin();
    errno = ENOENT;
    fy_error("open x: %m");
    assert_int_equal(errno, ENOENT);
    fy_log_set_prefix("decode-7");
    fy_warn("named");
    fy_log_set_prefix(NULL);
    fy_test_log_end();
    const char *text = fy_test_log_text();
    char line[512];
    const char *nl = strchr(text, '\n');
    assert_non_null(nl);
    snprintf(line, sizeof(line), "%.*s", (int)(nl - text), text);
    if (regexec(&re, line, 0, NULL, 0) || !strstr(line, "test_cli: error: open x: No such file or directory"))
        fail_msg("first line: '%s'", line);
    snprintf(line, sizeof(line), "%s", nl + 1);
    line[strcspn(line, "\n")] = '\0';
    if (regexec(&re, line, 0, NULL, 0) || !strstr(line, " decode-7: warning: named"))
        fail_msg("second line: '%s'", line);
    /* the time is now's, to the second (UTC) */
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char day[16];
    strftime(day, sizeof(day), "%Y-%m-%d", &tm);
    assert_non_null(strstr(text, day));
    /* a binary's lines carry its program name */
    if (have_bins()) {
        const char *args[] = {"ferry", "info", "/nonexistent/model.gguf", NULL};
        run_t r = run_argv(args);
        snprintf(line, sizeof(line), "%s", r.err);
        line[strcspn(line, "\n")] = '\0';
        regfree(&re);
        assert_int_equal(regcomp(&re, "^[-0-9]{10}T[:0-9]{8}\\.[0-9]{3}Z ferry: error: model: /nonexistent/model.gguf",
                                 REG_EXTENDED | REG_NOSUB),
                         0);
        if (r.status != 1 || regexec(&re, line, 0, NULL, 0)) fail_msg("status %d, stderr: %s", r.status, r.err);
        run_free(&r);
    }
    regfree(&re);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_unknown_option),
        cmocka_unit_test(test_config_flag),
        cmocka_unit_test(test_options_reach_the_work),
        cmocka_unit_test(test_log_line),
        cmocka_unit_test(test_no_default_model),
        cmocka_unit_test(test_answer_line),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fy_test_tmpdir_remove();
    return rc;
}
