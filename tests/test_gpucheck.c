/*
 * test_gpucheck.c - the one-shot device check (tools/gpu_check.sh) cannot
 * rot: its dry run, on this machine without a GPU, goes through every
 * step (the CUDA build as make test made it, mkbench's tiny models,
 * test_cuda, cmp-devices cpu,cpu bit for bit, bench-gpu on the CPU
 * backend) and leaves its table and its eight files under $OUT.  The
 * same script without --dry-run here, where no GPU is, must fail every
 * GPU step (a skipped test_cuda is a failure there, and cuda is never
 * replaced by the CPU), with a stand-in compute-sanitizer whose memcheck
 * reports errors (the step fails, both logs merged into one file); and a
 * spent budget must show as such.
 *
 * The script calls make, which sees this make's variables through
 * MAKEFLAGS (SAN, WERROR), so it finds the build it runs in with nothing
 * to do.  Skips where that build has no CUDA (no nvcc, or CUDA=0).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <dirent.h>

#include "common/mem.h"
#include "tests/testutil.h"

/* runs cmd (a shell line) with its output into out_file; the exit status */
static int run_sh(const char *cmd, const char *out_file)
{
    char line[4096];
    snprintf(line, sizeof(line), "%s >%s 2>&1", cmd, out_file);
    int rc = system(line);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static char *slurp(const char *path)
{
    char *t = fy_test_read_file(path, NULL);
    if (!t) print_message("cannot read %s\n", path);
    assert_non_null(t);
    return t;
}

static void expect_in(const char *text, const char *what, const char *where)
{
    if (!strstr(text, what)) print_message("%s lacks \"%s\":\n%s\n", where, what, text);
    assert_non_null(strstr(text, what));
}

static int setup(void **state)
{
    /* the build this test runs in, as make sees it (MAKEFLAGS carries SAN and WERROR) */
    const char *flags = fy_test_path("flags.txt");
    if (run_sh("make -s --no-print-directory print-flags", flags) != 0) {
        print_message("make print-flags failed\n");
        return -1;
    }
    char *f = fy_test_read_file(flags, NULL);
    bool cuda = f && strstr(f, " CUDA=1 ");
    fy_free(f);
    *state = (void *)(uintptr_t)cuda;
    return 0;
}

static int teardown(void **state)
{
    fy_test_tmpdir_remove();
    return 0;
}

#define NEED_CUDA()                                                                                                    \
    do {                                                                                                               \
        if (!*state) {                                                                                                 \
            printf("this build has no CUDA (nvcc not found, or CUDA=0): the check's build step needs it; skipping\n"); \
            skip();                                                                                                    \
        }                                                                                                              \
    } while (0)

static void test_dry_run(void **state)
{
    NEED_CUDA();
    char dir[512], cmd[1024];
    snprintf(dir, sizeof(dir), "%s", fy_test_path("out"));
    snprintf(cmd, sizeof(cmd), "OUT=%s timeout 150 sh tools/gpu_check.sh --dry-run", dir);
    const char *so = fy_test_path("stdout.txt");
    int rc = run_sh(cmd, so);
    char *out = slurp(so);
    if (rc) print_message("gpu_check.sh --dry-run: exit status %d\n%s\n", rc, out);
    assert_int_equal(rc, 0);
    /* the table comes last */
    const char *table = strstr(out, "| step | result | s | note |");
    assert_non_null(table);
    expect_in(table, "| build | PASS |", "the table");
    expect_in(table, "| models | PASS |", "the table");
    expect_in(table, "| compare cpu,cpu | PASS |", "the table");
    expect_in(table, "| memcheck | SKIP | 0 | dry run: needs a GPU |", "the table");
    expect_in(table, "| racecheck | SKIP | 0 | dry run: needs a GPU |", "the table");
    expect_in(table, "| bench-gpu | PASS |", "the table");
    expect_in(table, "| cluster cpu,cpu | PASS | ", "the table");
    expect_in(table, " | 3 answers equal (staged auto), every block back |", "the table");
    assert_true(strstr(table, "| test_cuda | SKIP |") || strstr(table, "| test_cuda | PASS |"));
    expect_in(table, "; 0 failed; logs in", "the table");
    const char *end = out + strlen(out);
    while (end > out && end[-1] == '\n') end--;
    const char *last = end;
    while (last > out && last[-1] != '\n') last--;
    assert_true(!strncmp(last, "total ", 6));
    /* exactly its eight files under $OUT, none empty */
    static const char *const files[] = {"summary.txt", "build.log",     "models.log", "test_cuda.log",
                                        "compare.log", "sanitizer.log", "bench.log",  "cluster.log"};
    int n = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        bool known = false;
        for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) known |= !strcmp(e->d_name, files[i]);
        if (!known) print_message("unexpected file under $OUT: %s\n", e->d_name);
        assert_true(known);
        n++;
    }
    closedir(d);
    assert_int_equal(n, 8);
    char path[600];
    char *t[8];
    for (int i = 0; i < 8; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        t[i] = slurp(path);
        assert_true(strlen(t[i]) > 0);
    }
    /* the summary holds the header and the table; the logs what ran */
    expect_in(t[0], "gpu: none", "summary.txt");
    expect_in(t[0], "| bench-gpu | PASS |", "summary.txt");
    expect_in(t[1], "CUDA=1", "build.log");
    expect_in(t[1], "CUDA_ARCHS=-gencode arch=compute_80,code=sm_80", "build.log");
    expect_in(t[1], "arch=compute_90,code=compute_90", "build.log");
    expect_in(t[2], "--shape gemma3-4b", "models.log");
    expect_in(t[3], "test_cuda", "test_cuda.log");
    /* both models compared, every logit equal */
    const char *a = strstr(t[4], "logits bit for bit equal: yes");
    assert_non_null(a);
    assert_non_null(strstr(a + 1, "logits bit for bit equal: yes"));
    expect_in(t[4], "==== gemma3-4b-shape.gguf", "compare.log");
    expect_in(t[6], "| copy | 16 MiB D2D |", "bench.log");
    expect_in(t[6], "| batch | step ms", "bench.log");
    expect_in(t[6], "| 64 | ", "bench.log");       /* attention at context 64 */
    expect_in(t[6], "| 32 | bf16 |", "bench.log"); /* matmul at 32 tokens */
    /* the staged cluster and the direct one: their answers, every block back */
    expect_in(t[7], "cpu (staged): 3 of 3 answered", "cluster.log");
    expect_in(t[7], "cpu (auto): 3 of 3 answered", "cluster.log");
    expect_in(t[7], "path=\"staged\"} ", "cluster.log");
    expect_in(t[7], "state=\"used\"} 0", "cluster.log");
    for (int i = 0; i < 8; i++) fy_free(t[i]);
    fy_free(out);
}

/* Without --dry-run on a machine without a GPU every GPU step fails, with
 * its reason: test_cuda's skips, cuda not usable (never the CPU in its
 * place).  Tiny models keep it short. */
static void test_no_gpu_fails(void **state)
{
    NEED_CUDA();
    if (system("nvidia-smi -L >/dev/null 2>&1") == 0) {
        printf("this machine has a GPU: the check would run; skipping\n");
        skip();
    }
    /* a stand-in compute-sanitizer on PATH: memcheck finds two errors, racecheck none */
    char bindir[512], fake[600], cmd[2048];
    snprintf(bindir, sizeof(bindir), "%s", fy_test_path("fakebin"));
    assert_int_equal(mkdir(bindir, 0700), 0);
    snprintf(fake, sizeof(fake), "%s/compute-sanitizer", bindir);
    static const char script[] =
        "#!/bin/sh\n"
        "echo \"========= COMPUTE-SANITIZER (stand-in) $*\"\n"
        "case \"$2\" in\n"
        "memcheck) echo '========= ERROR SUMMARY: 2 errors'; exit 3 ;;\n"
        "*) echo '========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)'; exit 0 ;;\n"
        "esac\n";
    assert_true(fy_test_write_file(fake, script, sizeof(script) - 1));
    assert_int_equal(chmod(fake, 0700), 0);
    char dir[512];
    snprintf(dir, sizeof(dir), "%s", fy_test_path("out-nogpu"));
    snprintf(cmd, sizeof(cmd), "PATH=%s:$PATH OUT=%s GPU_CHECK_SIZES=tiny timeout 150 sh tools/gpu_check.sh", bindir,
             dir);
    const char *so = fy_test_path("stdout-nogpu.txt");
    int rc = run_sh(cmd, so);
    char *out = slurp(so);
    if (rc != 1) print_message("exit status %d\n%s\n", rc, out);
    assert_int_equal(rc, 1);
    expect_in(out, "no GPU here: every GPU step will fail", "the output");
    expect_in(out, "| build | PASS |", "the output");
    expect_in(out, "skipped: a skip on a GPU host is a failure |", "the output");
    expect_in(out, "| compare cuda,cpu | FAIL |", "the output");
    expect_in(out, "| bench-gpu | FAIL |", "the output");
    expect_in(out, "cuda is not usable here", "the output"); /* the tail of compare.log, before the table */
    expect_in(out, "| memcheck | FAIL |", "the output");
    expect_in(out, "exit status 3; ERROR SUMMARY: 2 errors |", "the output");
    expect_in(out, "| racecheck | PASS |", "the output");
    expect_in(out, "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings) |", "the output");
    expect_in(out, "| cluster cuda,cpu | FAIL |", "the output");
    expect_in(out, "a worker fell back to the cpu |", "the output");
    expect_in(out, "; 5 failed; logs in", "the output");
    /* both sanitizers' logs merged into one file; still eight files */
    char path[600];
    snprintf(path, sizeof(path), "%s/sanitizer.log", dir);
    char *slog = slurp(path);
    const char *m = strstr(slog, "==== compute-sanitizer --tool memcheck");
    assert_non_null(m);
    assert_non_null(strstr(m, "(stand-in) --tool memcheck --leak-check full --error-exitcode 3"));
    assert_non_null(strstr(m, "==== compute-sanitizer --tool racecheck"));
    fy_free(slog);
    int n = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    assert_int_equal(n, 8);
    fy_free(out);
}

/* A budget spent before the build starts: the build fails naming it, and
 * nothing after it runs. */
static void test_budget_spent(void **state)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "OUT=%s GPU_CHECK_BUDGET=0 timeout 60 sh tools/gpu_check.sh --dry-run",
             fy_test_path("out-budget"));
    const char *so = fy_test_path("stdout-budget.txt");
    int rc = run_sh(cmd, so);
    char *out = slurp(so);
    if (rc != 1) print_message("exit status %d\n%s\n", rc, out);
    assert_int_equal(rc, 1);
    expect_in(out, "| build | FAIL | 0 | no time left in the budget |", "the output");
    expect_in(out, "| models | SKIP | 0 | no build |", "the output");
    expect_in(out, "| bench-gpu | SKIP | 0 | no models |", "the output");
    fy_free(out);
}

static void test_usage(void **state)
{
    const char *so = fy_test_path("stdout-usage.txt");
    assert_int_equal(run_sh("sh tools/gpu_check.sh --wet-run", so), 2);
    char *out = slurp(so);
    expect_in(out, "usage: sh tools/gpu_check.sh [--dry-run]", "the output");
    fy_free(out);
    assert_int_equal(run_sh("sh tools/gpu_check.sh --help", so), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_usage),
        cmocka_unit_test(test_budget_spent),
        cmocka_unit_test(test_dry_run),
        cmocka_unit_test(test_no_gpu_fails),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
