/*
 * token_trie.h - the vocabulary's byte strings as a trie, for grammar
 * masks (grammar.h).
 *
 * Built once per tokenizer: every plain token's decoded bytes (what the
 * detokenizer emits for it) become a path from the root; a node that ends
 * one or more tokens lists their ids.  The nodes are in depth-first order
 * and each knows where its subtree ends, so a walk skips a subtree that
 * the grammar cannot enter in one step.  Special and control tokens, and
 * tokens with no bytes, are left out; the end-of-generation tokens are
 * kept apart (the mask allows them exactly when the grammar is complete).
 * Immutable after creation; shareable between threads.
 *
 * Not here: the grammar (grammar.h), sampling.
 */
#ifndef FY_TOKEN_TRIE_H
#define FY_TOKEN_TRIE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct fy_tokenizer fy_tokenizer_t;

typedef struct fy_trie_node {
    int32_t end;       /* index one past this node's subtree */
    int32_t tok_first; /* first of tok_count ids in the trie's token list */
    uint16_t tok_count;
    uint8_t byte; /* the byte on the edge into this node (root: 0) */
    uint8_t pad;
} fy_trie_node_t;

typedef struct fy_token_trie {
    int32_t n_vocab;
    fy_trie_node_t *nodes; /* [n_nodes], depth-first; nodes[0] is the root */
    int32_t n_nodes;
    int32_t *toks;   /* [n_toks] token ids, grouped by node */
    int32_t n_toks;  /* tokens in the trie */
    int32_t max_len; /* longest token, bytes */
    int32_t *eog;    /* [n_eog] end-of-generation ids */
    int32_t n_eog;
    /* each token's bytes, for accepting a token without a walk */
    const uint8_t **tok_bytes; /* [n_vocab], NULL when not in the trie */
    uint32_t *tok_len;         /* [n_vocab] */
    uint8_t *store;            /* owns the bytes tok_bytes points into */
} fy_token_trie_t;

/* From explicit byte strings: bytes[i] (len[i] bytes) is token i's text;
 * skip[i] true leaves token i out (special); eog lists the
 * end-of-generation ids (copied).  Fails with FY_ERR_INVALID for a bad id
 * in eog, FY_ERR_NOMEM. */
fy_status_t fy_token_trie_create(int32_t n_vocab, const uint8_t *const *bytes, const uint32_t *len, const bool *skip,
                                 const int32_t *eog, int32_t n_eog, fy_token_trie_t **t_p);
/* From a tokenizer: plain tokens' bytes (fy_tokenizer_token_bytes without
 * specials); special tokens out; EOG = fy_tokenizer_is_eog. */
fy_status_t fy_token_trie_from_tokenizer(const fy_tokenizer_t *tok, fy_token_trie_t **t_p);
void fy_token_trie_destroy(fy_token_trie_t *t); /* accepts NULL */

static inline int32_t fy_token_trie_n_vocab(const fy_token_trie_t *t) { return t->n_vocab; }
static inline size_t fy_token_trie_mask_words(const fy_token_trie_t *t) { return ((size_t)t->n_vocab + 31) / 32; }
bool fy_token_trie_is_eog(const fy_token_trie_t *t, int32_t id);

#endif /* FY_TOKEN_TRIE_H */
