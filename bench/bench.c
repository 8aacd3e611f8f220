/*
 * bench.c - `ferry bench`: prefill and decode tokens per second at batch 1
 * on one model, for each thread count asked, next to the memory-bandwidth
 * bound measured in the same run with the same threads.
 *
 * The bound: a decode step reads every weight once, so it cannot run
 * faster than (weight bytes per token) / (memory bandwidth).  Bandwidth is
 * measured two ways: memcpy counted as bytes read + bytes written (the
 * STREAM "copy" convention), and a plain read-only sweep.  Both buffers
 * are far larger than the last-level cache; each figure is the best of 5
 * sweeps before and 5 after the model runs.  Tokens are random ids drawn
 * with a fixed seed; speeds are medians of --reps runs.
 */
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "tools/cli.h"
#include "common/clock.h"
#include "tools/commands.h"
#include "engine/engine_config.h"
#include "common/log.h"
#include "common/mem.h"
#include "model/model.h"
#include "engine/runner.h"
#include "engine/sampler.h"
#include "bench/stats.h"

#define BW_BYTES ((size_t)512 << 20)
#define MAX_THREAD_COUNTS 8
#define MAX_PROMPTS 8

/* ---- memory bandwidth --------------------------------------------------------------- */

typedef struct bw_job {
    char *dst;
    const char *src;
    size_t bytes;
    int read_only;
    uint64_t sink;
    pthread_barrier_t *barrier;
} bw_job_t;

static uint64_t read_sweep_scalar(const uint64_t *s, size_t n)
{
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        a0 += s[i], a1 += s[i + 1], a2 += s[i + 2], a3 += s[i + 3];
        a4 += s[i + 4], a5 += s[i + 5], a6 += s[i + 6], a7 += s[i + 7];
    }
    return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

#if defined(__x86_64__)
/* 32-byte loads, so that the sweep measures memory, not the loop (the
 * scalar loop tops out below what one core can stream) */
__attribute__((target("avx2"))) static uint64_t read_sweep_avx2(const uint64_t *s, size_t n)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 16 <= n; i += 16) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(s + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(s + i + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(s + i + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(s + i + 12)));
    }
    __m256i t = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t v[4];
    _mm256_storeu_si256((__m256i *)v, t);
    return v[0] + v[1] + v[2] + v[3];
}
#endif

static void *bw_thread(void *p)
{
    bw_job_t *j = p;
    pthread_barrier_wait(j->barrier);
    if (!j->read_only) {
        memcpy(j->dst, j->src, j->bytes);
        return NULL;
    }
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) {
        j->sink = read_sweep_avx2((const uint64_t *)j->src, j->bytes / 8);
        return NULL;
    }
#endif
    j->sink = read_sweep_scalar((const uint64_t *)j->src, j->bytes / 8);
    return NULL;
}

/* Bytes per second moved by n_threads: memcpy (read + write counted) or a
 * read-only sweep; best of 5. */
static double measure_bw(char *a, char *b, int n_threads, int read_only)
{
    double best = 0.0;
    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[64];
        bw_job_t jobs[64];
        pthread_barrier_t barrier;
        pthread_barrier_init(&barrier, NULL, (unsigned)n_threads + 1);
        size_t share = BW_BYTES / (size_t)n_threads & ~(size_t)4095;
        for (int i = 0; i < n_threads; i++) {
            jobs[i] = (bw_job_t){b + (size_t)i * share, a + (size_t)i * share, share, read_only, 0, &barrier};
            pthread_create(&th[i], NULL, bw_thread, &jobs[i]);
        }
        pthread_barrier_wait(&barrier);
        double t = fy_now_s();
        for (int i = 0; i < n_threads; i++) pthread_join(th[i], NULL);
        t = fy_now_s() - t;
        pthread_barrier_destroy(&barrier);
        double moved = (double)share * n_threads * (read_only ? 1.0 : 2.0);
        if (moved / t > best) best = moved / t;
    }
    return best;
}

/* ---- model speed --------------------------------------------------------------------- */

typedef struct bench_result {
    int threads;
    double copy_bw, read_bw;
    double prefill_tps, decode_tps;
    fy_backend_profile_t prof; /* one profiled decode run */
    int prof_tokens;
    fy_backend_profile_t prof_pre; /* one profiled prefill */
    int n_prompt;
    const char *attn; /* FY_CPU_ATTN for this run: "tiles", "rows" or "bf16" */
} bench_result_t;

static fy_status_t run_model(const fy_model_t *m, int threads, const char *isa, int n_prompt, int n_gen, int reps,
                             bool profile, bench_result_t *res)
{
    const fy_model_config_t *c = fy_model_config(m);
    fy_engine_stack_t s = {0};
    fy_backend_t *be = NULL;
    fy_runner_t *r = NULL;
    fy_kvm_t *kvm = NULL;
    fy_block_table_t bt = {0};
    int32_t *prompt = NULL;
    float *logits = NULL;
    double *pre = NULL, *dec = NULL;
    fy_status_t st;
    fy_runner_params_t rp;
    fy_runner_params_default(&rp);
    rp.max_batch_tokens = n_prompt;
    rp.max_seqs = 1;
    rp.max_logits = 1;
    rp.max_ctx = n_prompt + n_gen + 1;
    /* the sequence's whole context reserved at once, no admission */
    if ((rp.n_kv_blocks = fy_runner_pool_blocks(m, 0, &rp, rp.max_ctx, 1, 0, 0)) < 1) return FY_ERR_INVALID;
    fy_engine_build_t eb; /* no engine: the loops below drive the runner */
    fy_engine_build_default(&eb);
    eb.threads = threads;
    eb.isa = isa;
    eb.runner = rp;
    eb.prefix_caching = false; /* every run computes its prompt */
    eb.no_engine = true;
    if ((st = fy_engine_stack_create(m, &eb, &s))) return st;
    be = s.be, r = s.runner, kvm = s.kvm;
    if ((st = fy_kvm_seq_init(kvm, &bt, rp.max_ctx, NULL))) goto out;
    prompt = fy_malloc((size_t)n_prompt * sizeof(int32_t));
    logits = fy_malloc((size_t)c->vocab_size * sizeof(float));
    pre = fy_calloc((size_t)reps, sizeof(double));
    dec = fy_calloc((size_t)reps, sizeof(double));
    if (!prompt || !logits || !pre || !dec) {
        st = FY_ERR_NOMEM;
        goto out;
    }
    fy_rng_t rng;
    fy_rng_seed(&rng, 1234);
    for (int i = 0; i < n_prompt; i++) prompt[i] = (int32_t)(fy_rng_next(&rng) % (uint64_t)c->vocab_size);

    for (int rep = -1; rep < reps; rep++) { /* rep -1 warms caches and page tables */
        if ((st = fy_kvm_seq_reserve(kvm, &bt, rp.max_ctx, NULL))) goto out;
        fy_forward_seq_t f = {&bt, prompt, n_prompt, 0, 1, NULL};
        double t = fy_now_s();
        if ((st = fy_runner_forward(r, &f, 1, logits))) goto out;
        t = fy_now_s() - t;
        int32_t tok = fy_argmax(logits, c->vocab_size);
        double t2 = fy_now_s();
        for (int i = 0; i < n_gen; i++) {
            fy_forward_seq_t d = {&bt, &tok, 1, n_prompt + i, 1, NULL};
            if ((st = fy_runner_forward(r, &d, 1, logits))) goto out;
            tok = fy_argmax(logits, c->vocab_size);
        }
        t2 = fy_now_s() - t2;
        fy_kvm_seq_release(kvm, &bt);
        if (rep >= 0) {
            pre[rep] = n_prompt / t;
            dec[rep] = n_gen / t2;
        }
    }
    res->prefill_tps = median(pre, reps);
    res->decode_tps = median(dec, reps);
    /* one more run with per-op timing, for the breakdown (skipped with --no-profile: at 8B and
     * 2,048 tokens one prefill takes minutes) */
    if (!profile) goto out;
    if ((st = fy_kvm_seq_reserve(kvm, &bt, rp.max_ctx, NULL))) goto out;
    {
        fy_forward_seq_t f = {&bt, prompt, n_prompt, 0, 1, NULL};
        fy_backend_profile_enable(be, true);
        if ((st = fy_runner_forward(r, &f, 1, logits))) goto out;
        fy_backend_profile_get(be, &res->prof_pre);
        fy_backend_profile_enable(be, false);
        int32_t tok = fy_argmax(logits, c->vocab_size);
        fy_backend_profile_enable(be, true);
        for (int i = 0; i < n_gen; i++) {
            fy_forward_seq_t d = {&bt, &tok, 1, n_prompt + i, 1, NULL};
            if ((st = fy_runner_forward(r, &d, 1, logits))) goto out;
            tok = fy_argmax(logits, c->vocab_size);
        }
        fy_backend_profile_get(be, &res->prof);
        res->prof_tokens = n_gen;
        fy_backend_profile_enable(be, false);
    }
    fy_kvm_seq_release(kvm, &bt);
out:
    if (bt.blocks) {
        fy_kvm_seq_release(kvm, &bt);
        fy_kvm_seq_deinit(&bt);
    }
    fy_free(prompt);
    fy_free(logits);
    fy_free(pre);
    fy_free(dec);
    fy_engine_stack_destroy(&s);
    return st;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/*
 * --alternate VAR=A,B: one engine stack, and runs (a prompt, then n_gen
 * decode steps) that set VAR to A or B in turn, ABBA, so that both see the
 * same weights in memory and the same drift of a shared machine.  For
 * variables the backend reads at every batch (FY_CPU_FUSE).  Fills, per
 * value, the median decode tok/s, and the median over rounds of B / A in
 * wall time and in tokens per CPU-second (the latter leaves out time the
 * process was descheduled; with one thread only, as workers spin).
 */
typedef struct alt_result {
    double tps[2], lo[2], hi[2];
    double ratio, ratio_lo, ratio_hi, cpu_ratio;
} alt_result_t;

static fy_status_t run_alternate(const fy_model_t *m, int threads, const char *isa, int n_prompt, int n_gen, int rounds,
                                 const char *var, const char *const vals[2], alt_result_t *out)
{
    const fy_model_config_t *c = fy_model_config(m);
    fy_engine_stack_t s = {0};
    fy_block_table_t bt = {0};
    int32_t *prompt = fy_malloc((size_t)n_prompt * sizeof(int32_t));
    float *logits = fy_malloc((size_t)c->vocab_size * sizeof(float));
    double *wall = fy_calloc((size_t)rounds * 2, sizeof(double)), *cpu = fy_calloc((size_t)rounds * 2, sizeof(double));
    double *tmp = fy_calloc((size_t)rounds, sizeof(double));
    fy_status_t st = FY_ERR_NOMEM;
    if (!prompt || !logits || !wall || !cpu || !tmp) goto out;
    fy_runner_params_t rp;
    fy_runner_params_default(&rp);
    rp.max_batch_tokens = n_prompt;
    rp.max_seqs = 1;
    rp.max_logits = 1;
    rp.max_ctx = n_prompt + n_gen + 1;
    /* the sequence's whole context reserved at once, no admission */
    if ((rp.n_kv_blocks = fy_runner_pool_blocks(m, 0, &rp, rp.max_ctx, 1, 0, 0)) < 1) {
        st = FY_ERR_INVALID;
        goto out;
    }
    fy_engine_build_t eb;
    fy_engine_build_default(&eb);
    eb.threads = threads;
    eb.isa = isa;
    eb.runner = rp;
    eb.prefix_caching = false;
    eb.no_engine = true;
    if ((st = fy_engine_stack_create(m, &eb, &s))) goto out;
    if ((st = fy_kvm_seq_init(s.kvm, &bt, rp.max_ctx, NULL))) goto out;
    fy_rng_t rng;
    fy_rng_seed(&rng, 1234);
    for (int i = 0; i < n_prompt; i++) prompt[i] = (int32_t)(fy_rng_next(&rng) % (uint64_t)c->vocab_size);
    for (int r = -1; r < rounds; r++) { /* round -1 warms caches and page tables */
        for (int k = 0; k < 2; k++) {
            int v = (r & 1) ? 1 - k : k; /* A B, then B A */
            setenv(var, vals[v], 1);
            if ((st = fy_kvm_seq_reserve(s.kvm, &bt, rp.max_ctx, NULL))) goto out;
            fy_forward_seq_t f = {&bt, prompt, n_prompt, 0, 1, NULL};
            if ((st = fy_runner_forward(s.runner, &f, 1, logits))) goto out;
            int32_t tok = fy_argmax(logits, c->vocab_size);
            double t = fy_now_s(), tc = cpu_s();
            for (int i = 0; i < n_gen; i++) {
                fy_forward_seq_t d = {&bt, &tok, 1, n_prompt + i, 1, NULL};
                if ((st = fy_runner_forward(s.runner, &d, 1, logits))) goto out;
                tok = fy_argmax(logits, c->vocab_size);
            }
            t = fy_now_s() - t, tc = cpu_s() - tc;
            fy_kvm_seq_release(s.kvm, &bt);
            if (r >= 0) wall[2 * r + v] = n_gen / t, cpu[2 * r + v] = n_gen / tc;
        }
    }
    for (int v = 0; v < 2; v++) {
        for (int r = 0; r < rounds; r++) tmp[r] = wall[2 * r + v];
        out->tps[v] = median(tmp, rounds), out->lo[v] = tmp[0], out->hi[v] = tmp[rounds - 1];
    }
    for (int r = 0; r < rounds; r++) tmp[r] = wall[2 * r + 1] / wall[2 * r];
    out->ratio = median(tmp, rounds), out->ratio_lo = tmp[0], out->ratio_hi = tmp[rounds - 1];
    for (int r = 0; r < rounds; r++) tmp[r] = cpu[2 * r + 1] / cpu[2 * r];
    out->cpu_ratio = median(tmp, rounds);
    st = FY_OK;
out:
    unsetenv(var);
    if (bt.blocks) {
        fy_kvm_seq_release(s.kvm, &bt);
        fy_kvm_seq_deinit(&bt);
    }
    fy_free(prompt);
    fy_free(logits);
    fy_free(wall);
    fy_free(cpu);
    fy_free(tmp);
    fy_engine_stack_destroy(&s);
    return st;
}

static void cpu_name(char *buf, size_t cap)
{
    snprintf(buf, cap, "unknown cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c += 2;
                c[strcspn(c, "\n")] = '\0';
                snprintf(buf, cap, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry bench [-m MODEL] [--threads 1,2] [--prompt-tokens 128] [--gen-tokens 64] [--reps 3]\n"
               "                   [--isa auto|avx2|scalar] [--attn tiles,rows,bf16]\n"
               "  prefill and decode tokens per second at batch 1, for each thread count, against the\n"
               "  memory-bandwidth bound measured in the same run\n"
               "  -m, --model PATH       .gguf file or Hugging Face folder (default " FY_CLI_DEFAULT_MODEL ")\n"
               "  -t, --threads LIST     thread counts, comma-separated (default 1,2)\n"
               "      --prompt-tokens LIST prompt lengths, comma-separated (default 128); prefill tok/s\n"
               "                         is also given against the first length's, same threads and kernel\n"
               "      --gen-tokens N     decoded tokens (default 64)\n"
               "      --reps N           runs per figure; the median is kept (default 3)\n"
               "      --isa NAME         CPU kernels (default auto)\n"
               "      --attn LIST        CPU prefill attention, comma-separated: tiles (default), rows (the\n"
               "                         one-row walk, for reference), bf16 (tiles in bf16 arithmetic, on\n"
               "                         CPUs with avx512_bf16); sets FY_CPU_ATTN\n"
               "      --alternate VAR=A,B  instead: one process, decode runs with the environment variable\n"
               "                         VAR set to A and to B in turn (ABBA, --reps rounds), the median ratio\n"
               "                         B / A; for variables the backend reads at every batch (FY_CPU_FUSE)\n"
               "      --no-profile       skip the profiled run and the per-op tables (one prefill fewer)\n"
               "  -h, --help\n");
}

int fy_cmd_bench(int argc, char **argv)
{
    enum { O_PROMPT = 256, O_GEN, O_REPS, O_ISA, O_ATTN, O_ALT, O_NOPROF };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"threads", required_argument, 0, 't'},
        {"prompt-tokens", required_argument, 0, O_PROMPT},
        {"gen-tokens", required_argument, 0, O_GEN},
        {"reps", required_argument, 0, O_REPS},
        {"isa", required_argument, 0, O_ISA},
        {"attn", required_argument, 0, O_ATTN},
        {"alternate", required_argument, 0, O_ALT},
        {"no-profile", no_argument, 0, O_NOPROF},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *model = FY_CLI_DEFAULT_MODEL;
    const char *isa = NULL;
    int counts[MAX_THREAD_COUNTS] = {1, 2}, n_counts = 2;
    int prompts[MAX_PROMPTS] = {128}, n_prompts = 1;
    const char *attns[3] = {"tiles"};
    int n_attns = 1;
    long n_gen = 64, reps = 3;
    bool profile = true;
    char alt_var[64] = "";
    const char *alt_vals[2] = {NULL, NULL};
    char alt_buf[256];
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 't':
            if (!fy_cli_parse_int_list("--threads", optarg, 1, 64, counts, MAX_THREAD_COUNTS, &n_counts)) return 2;
            break;
        case O_PROMPT:
            if (!fy_cli_parse_int_list("--prompt-tokens", optarg, 1, 8192, prompts, MAX_PROMPTS, &n_prompts)) return 2;
            break;
        case O_GEN:
            if (!fy_cli_parse_int("--gen-tokens", optarg, 1, 8192, &n_gen)) return 2;
            break;
        case O_REPS:
            if (!fy_cli_parse_int("--reps", optarg, 1, 100, &reps)) return 2;
            break;
        case O_ISA: isa = optarg; break;
        case O_NOPROF: profile = false; break;
        case O_ATTN: {
            static const char *const known[] = {"tiles", "rows", "bf16"};
            n_attns = 0;
            for (const char *t = optarg; *t;) {
                size_t len = strcspn(t, ",");
                int k = 0;
                while (k < 3 && (strlen(known[k]) != len || strncmp(t, known[k], len))) k++;
                if (k == 3 || n_attns == 3) {
                    fprintf(stderr, "ferry: bench: --attn takes a list of tiles, rows, bf16, not '%s'\n", optarg);
                    return 2;
                }
                attns[n_attns++] = known[k];
                t += len + (t[len] == ',');
            }
            if (!n_attns) {
                fprintf(stderr, "ferry: bench: --attn needs a kernel\n");
                return 2;
            }
            break;
        }
        case O_ALT: {
            snprintf(alt_buf, sizeof(alt_buf), "%s", optarg);
            char *eq = strchr(alt_buf, '='), *comma = eq ? strchr(eq, ',') : NULL;
            if (!eq || !comma || eq == alt_buf || (size_t)(eq - alt_buf) >= sizeof(alt_var)) {
                fprintf(stderr, "ferry: bench: --alternate takes VAR=A,B, not '%s'\n", optarg);
                return 2;
            }
            *eq = *comma = '\0';
            memcpy(alt_var, alt_buf, (size_t)(eq - alt_buf) + 1);
            alt_vals[0] = eq + 1, alt_vals[1] = comma + 1;
            break;
        }
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!fy_cli_no_operands("bench", argc, argv, usage)) return 2;
    fy_model_t *m;
    if (fy_model_load(model, &m) != FY_OK) return 1;
    if (alt_var[0]) {
        char cpu[256], date[64];
        cpu_name(cpu, sizeof(cpu));
        time_t now = time(NULL);
        strftime(date, sizeof(date), "%Y-%m-%d", gmtime(&now));
        printf("ferry bench --alternate, %s\nmachine: %s, %ld cores online\n", date, cpu,
               sysconf(_SC_NPROCESSORS_ONLN));
        printf("%s=%s (A) against %s=%s (B), one process, %ld rounds ABBA of a %d-token prompt and %ld decode "
               "steps\n\n",
               alt_var, alt_vals[0], alt_var, alt_vals[1], reps, prompts[0], n_gen);
        printf("| threads | A decode tok/s | B decode tok/s | B / A (median of rounds) | B / A per CPU-second |\n"
               "|---:|---:|---:|---:|---:|\n");
        int rc = 0;
        for (int i = 0; i < n_counts && !rc; i++) {
            alt_result_t a = {0};
            if (run_alternate(m, counts[i], isa, prompts[0], (int)n_gen, (int)reps, alt_var, alt_vals, &a) != FY_OK) {
                rc = 1;
                break;
            }
            char cr[32] = "-"; /* workers spin: CPU time means something with one thread only */
            if (counts[i] == 1) snprintf(cr, sizeof(cr), "%.3f", a.cpu_ratio);
            printf("| %d | %.1f (%.1f-%.1f) | %.1f (%.1f-%.1f) | %.3f (%.3f-%.3f) | %s |\n", counts[i], a.tps[0],
                   a.lo[0], a.hi[0], a.tps[1], a.lo[1], a.hi[1], a.ratio, a.ratio_lo, a.ratio_hi, cr);
            fflush(stdout);
        }
        fy_model_destroy(m);
        return rc;
    }
    char *a = fy_aligned_alloc(4096, BW_BYTES), *b = fy_aligned_alloc(4096, BW_BYTES);
    if (!a || !b) {
        fprintf(stderr, "ferry: bench: cannot allocate bandwidth buffers\n");
        fy_free(a), fy_free(b), fy_model_destroy(m);
        return 1;
    }
    memset(a, 1, BW_BYTES);
    memset(b, 2, BW_BYTES);

    char cpu[256], desc[512], date[64];
    cpu_name(cpu, sizeof(cpu));
    fy_model_describe(m, desc, sizeof(desc));
    time_t now = time(NULL);
    strftime(date, sizeof(date), "%Y-%m-%d", gmtime(&now));
    double wbytes = (double)fy_model_weight_bytes_per_token(m);
    printf("ferry bench, %s\nmachine: %s, %ld cores online\nmodel: %s\n", date, cpu, sysconf(_SC_NPROCESSORS_ONLN),
           desc);
    printf("batch 1, prompts of %d", prompts[0]);
    for (int p = 1; p < n_prompts; p++) printf(", %d", prompts[p]);
    printf(" tokens, decode %ld tokens, median of %ld runs\n\n", n_gen, reps);
    printf("| prompt | attention | threads | copy GB/s | read GB/s | bound tok/s (copy / read) | prefill tok/s | "
           "vs prompt %d | decode tok/s | decode / copy bound | decode / read bound |\n",
           prompts[0]);
    printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    int rc = 0, n_res = 0;
    bench_result_t *res_all = fy_calloc((size_t)n_prompts * n_attns * n_counts, sizeof(bench_result_t));
    if (!res_all) rc = 1;
    for (int p = 0; p < n_prompts && !rc; p++) {
        for (int at = 0; at < n_attns && !rc; at++) {
            for (int i = 0; i < n_counts; i++) {
                bench_result_t res = {.threads = counts[i], .n_prompt = prompts[p], .attn = attns[at]};
                setenv("FY_CPU_ATTN", attns[at], 1); /* read when the backend is created */
                /* bandwidth on this shared machine moves between runs: measure it
                 * before and after the model and keep the higher figure, which
                 * makes the bound the stricter one */
                res.copy_bw = measure_bw(a, b, counts[i], 0);
                res.read_bw = measure_bw(a, b, counts[i], 1);
                if (run_model(m, counts[i], isa, prompts[p], (int)n_gen, (int)reps, profile, &res) != FY_OK) {
                    rc = 1;
                    break;
                }
                res.copy_bw = fmax(res.copy_bw, measure_bw(a, b, counts[i], 0));
                res.read_bw = fmax(res.read_bw, measure_bw(a, b, counts[i], 1));
                double cb = res.copy_bw / wbytes, rb = res.read_bw / wbytes;
                /* the first prompt length's figure for the same threads and kernel */
                double first = res.prefill_tps;
                for (int k = 0; k < n_res; k++)
                    if (res_all[k].n_prompt == prompts[0] && res_all[k].threads == counts[i] &&
                        !strcmp(res_all[k].attn, attns[at]))
                        first = res_all[k].prefill_tps;
                printf("| %d | %s | %d | %.1f | %.1f | %.0f / %.0f | %.1f | %.0f%% | %.1f | %.0f%% | %.0f%% |\n",
                       prompts[p], attns[at], counts[i], res.copy_bw / 1e9, res.read_bw / 1e9, cb, rb, res.prefill_tps,
                       100.0 * res.prefill_tps / first, res.decode_tps, 100.0 * res.decode_tps / cb,
                       100.0 * res.decode_tps / rb);
                fflush(stdout);
                res_all[n_res++] = res;
            }
        }
    }
    unsetenv("FY_CPU_ATTN");
    for (int pass = 0; pass < 2 && rc == 0 && profile; pass++) {
        printf("\n%s time per token by op (ms, one profiled run; columns: prompt / attention / threads)\n\n| op |",
               pass ? "decode" : "prefill");
        for (int i = 0; i < n_res; i++)
            printf(" %d / %s / %d |", res_all[i].n_prompt, res_all[i].attn, res_all[i].threads);
        printf("\n|---|");
        for (int i = 0; i < n_res; i++) printf("---:|");
        printf("\n");
        for (int op = 0; op < FY_OP_COUNT; op++) {
            printf("| %s |", fy_backend_op_name((fy_backend_op_t)op));
            for (int i = 0; i < n_res; i++) {
                const bench_result_t *x = &res_all[i];
                printf(" %.3f |", pass ? (double)x->prof.ns[op] / 1e6 / x->prof_tokens
                                       : (double)x->prof_pre.ns[op] / 1e6 / x->n_prompt);
            }
            printf("\n");
        }
    }
    fy_free(res_all);
    fy_free(a);
    fy_free(b);
    fy_model_destroy(m);
    return rc;
}
