/*
 * token_trie.c - the vocabulary as a byte trie (see token_trie.h): tokens
 * sorted by their bytes give the depth-first node order in one pass.
 *
 * Not here: walking it against a grammar (grammar.c's mask).
 */
#include "grammar/token_trie.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/mem.h"
#include "model/tokenizer.h"

typedef struct sort_ctx {
    const uint8_t *const *bytes;
    const uint32_t *len;
} sort_ctx_t;

static int cmp_tok(const void *a, const void *b, void *arg)
{
    const sort_ctx_t *c = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = c->len[x], ly = c->len[y];
    int r = memcmp(c->bytes[x], c->bytes[y], lx < ly ? lx : ly);
    if (r) return r;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static bool in_list(const int32_t *ids, int32_t n, int32_t id)
{
    for (int32_t i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

bool fy_token_trie_is_eog(const fy_token_trie_t *t, int32_t id) { return in_list(t->eog, t->n_eog, id); }

void fy_token_trie_destroy(fy_token_trie_t *t)
{
    if (!t) return;
    fy_free(t->nodes);
    fy_free(t->toks);
    fy_free(t->eog);
    fy_free(t->tok_bytes);
    fy_free(t->tok_len);
    fy_free(t->store);
    fy_free(t);
}

fy_status_t fy_token_trie_create(int32_t n_vocab, const uint8_t *const *bytes, const uint32_t *len, const bool *skip,
                                 const int32_t *eog, int32_t n_eog, fy_token_trie_t **t_p)
{
    if (n_vocab <= 0 || n_eog < 0) {
        fy_error("token_trie: vocabulary of %d tokens, %d eog", n_vocab, n_eog);
        return FY_ERR_INVALID;
    }
    for (int32_t i = 0; i < n_eog; i++) {
        if (eog[i] < 0 || eog[i] >= n_vocab) {
            fy_error("token_trie: eog token %d outside the vocabulary of %d", eog[i], n_vocab);
            return FY_ERR_INVALID;
        }
    }
    fy_token_trie_t *t = fy_calloc(1, sizeof(*t));
    int32_t *order = fy_malloc((size_t)n_vocab * sizeof(int32_t));
    if (!t || !order) goto nomem;
    t->n_vocab = n_vocab;
    size_t total = 0;
    int32_t n = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        if ((skip && skip[i]) || len[i] == 0 || in_list(eog, n_eog, i)) continue;
        order[n++] = i;
        total += len[i];
    }
    t->n_toks = n;
    t->tok_bytes = fy_calloc((size_t)n_vocab, sizeof(*t->tok_bytes));
    t->tok_len = fy_calloc((size_t)n_vocab, sizeof(*t->tok_len));
    t->store = fy_malloc(total + 1);
    t->toks = fy_malloc(((size_t)n + 1) * sizeof(int32_t));
    /* at most one node per byte, plus the root */
    t->nodes = fy_malloc((total + 1) * sizeof(fy_trie_node_t));
    t->eog = fy_malloc(((size_t)n_eog + 1) * sizeof(int32_t));
    if (!t->tok_bytes || !t->tok_len || !t->store || !t->toks || !t->nodes || !t->eog) goto nomem;
    if (n_eog) memcpy(t->eog, eog, (size_t)n_eog * sizeof(int32_t));
    t->n_eog = n_eog;
    size_t off = 0;
    for (int32_t k = 0; k < n; k++) {
        int32_t i = order[k];
        memcpy(t->store + off, bytes[i], len[i]);
        t->tok_bytes[i] = t->store + off;
        t->tok_len[i] = len[i];
        off += len[i];
        if ((int32_t)len[i] > t->max_len) t->max_len = (int32_t)len[i];
    }
    sort_ctx_t c = {t->tok_bytes, t->tok_len};
    qsort_r(order, (size_t)n, sizeof(int32_t), cmp_tok, &c);

    /* sorted strings give the depth-first order directly: path[d] is the
     * node at depth d on the previous string's path */
    int32_t *path = fy_malloc(((size_t)t->max_len + 1) * sizeof(int32_t));
    if (!path) goto nomem;
    int32_t nn = 1, depth = 0, nt = 0;
    t->nodes[0] = (fy_trie_node_t){0};
    path[0] = 0;
    const uint8_t *prev = NULL;
    uint32_t prev_len = 0;
    for (int32_t k = 0; k < n; k++) {
        int32_t id = order[k];
        const uint8_t *s = t->tok_bytes[id];
        uint32_t l = t->tok_len[id], common = 0;
        if (prev)
            while (common < l && common < prev_len && s[common] == prev[common]) common++;
        while (depth > (int32_t)common) t->nodes[path[depth--]].end = nn;
        for (uint32_t j = common; j < l; j++) {
            t->nodes[nn] = (fy_trie_node_t){.byte = s[j], .tok_first = nt};
            path[++depth] = nn++;
        }
        fy_trie_node_t *node = &t->nodes[path[depth]];
        if (node->tok_count == 0) node->tok_first = nt;
        if (node->tok_count < UINT16_MAX) {
            t->toks[nt++] = id;
            node->tok_count++;
        }
        prev = s;
        prev_len = l;
    }
    while (depth >= 0) t->nodes[path[depth--]].end = nn;
    t->n_nodes = nn;
    fy_free(path);
    fy_free(order);
    *t_p = t;
    return FY_OK;
nomem:
    fy_free(order);
    fy_token_trie_destroy(t);
    fy_error("token_trie: out of memory for %d tokens", n_vocab);
    return FY_ERR_NOMEM;
}

fy_status_t fy_token_trie_from_tokenizer(const fy_tokenizer_t *tok, fy_token_trie_t **t_p)
{
    int32_t n = fy_tokenizer_vocab_size(tok);
    const uint8_t **bytes = fy_calloc((size_t)n, sizeof(*bytes));
    uint32_t *len = fy_calloc((size_t)n, sizeof(*len));
    bool *skip = fy_calloc((size_t)n, sizeof(*skip));
    int32_t *eog = fy_calloc((size_t)n, sizeof(*eog));
    fy_status_t st = FY_ERR_NOMEM;
    if (!bytes || !len || !skip || !eog) {
        fy_error("token_trie: out of memory for %d tokens", n);
        goto out;
    }
    int32_t n_eog = 0;
    for (int32_t i = 0; i < n; i++) {
        if (fy_tokenizer_is_eog(tok, i)) eog[n_eog++] = i;
        skip[i] = fy_tokenizer_is_special(tok, i);
        const char *p = NULL;
        size_t l = 0;
        if (!skip[i]) fy_tokenizer_token_bytes(tok, i, false, &p, &l);
        bytes[i] = (const uint8_t *)p;
        len[i] = (uint32_t)l;
    }
    st = fy_token_trie_create(n, bytes, len, skip, eog, n_eog, t_p);
out:
    fy_free(bytes);
    fy_free(len);
    fy_free(skip);
    fy_free(eog);
    return st;
}
