/*
 * tokenizer.h - text <-> token ids for Llama-family models.
 *
 * Two algorithms, from two sources each:
 *   - byte-level BPE (GPT-2 style: pre-tokenizer regexes, then merge ranks
 *     over the GPT-2 byte-to-unicode alphabet), used by SmolLM2, Llama-3,
 *     Qwen2 and friends;
 *   - SentencePiece-style BPE with byte fallback (Llama-2 style: "▁" for
 *     spaces, merges by score or by rank, unknown bytes as <0xXX> tokens).
 * Read from GGUF metadata (tokenizer.ggml.*) or from a Hugging Face
 * tokenizer.json.  Token types decide what text becomes, as in llama.cpp
 * and Hugging Face tokenizers: user-defined tokens (Gemma's runs of
 * spaces, tabs and newlines; tokenizer.json's added tokens that are not
 * special) are text, matched whole in any text before the model runs and
 * always decoded.  Control tokens (BOS/EOS, <|im_start|>, <start_of_turn>)
 * are matched in text only when the caller asks (parse_special), so that
 * user text can never inject them.
 *
 * A tokenizer is immutable after creation and safe to share between
 * threads.  It knows nothing of models or chat templates.
 */
#ifndef FY_TOKENIZER_H
#define FY_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"
#include "common/status.h"

typedef struct fy_tokenizer fy_tokenizer_t;

typedef enum fy_tokenizer_kind {
    FY_TOKENIZER_BPE_BYTE = 0, /* GPT-2 byte-level BPE */
    FY_TOKENIZER_SPM,          /* SentencePiece-style BPE with byte fallback */
} fy_tokenizer_kind_t;

/* From GGUF metadata (tokenizer.ggml.model "gpt2" or "llama", tokens,
 * merges/scores, token_type, bos/eos ids, tokenizer.ggml.pre).  Logs the
 * fault and returns FY_ERR_FORMAT / FY_ERR_UNSUPPORTED on bad metadata. */
fy_status_t fy_tokenizer_from_gguf(const fy_gguf_t *gguf, fy_tokenizer_t **tok_p);

/* From a Hugging Face tokenizer.json (model type BPE, with or without
 * byte_fallback; pre_tokenizer/normalizer/decoder as Llama-2/3, SmolLM,
 * GPT-2 write them).  config_path is tokenizer_config.json or NULL; when
 * given it supplies bos/eos tokens and add_bos_token. */
fy_status_t fy_tokenizer_from_json(const char *json_path, const char *config_path, fy_tokenizer_t **tok_p);

void fy_tokenizer_destroy(fy_tokenizer_t *tok); /* accepts NULL */

fy_tokenizer_kind_t fy_tokenizer_kind(const fy_tokenizer_t *tok);
int32_t fy_tokenizer_vocab_size(const fy_tokenizer_t *tok);
int32_t fy_tokenizer_bos(const fy_tokenizer_t *tok); /* -1 if none */
int32_t fy_tokenizer_eos(const fy_tokenizer_t *tok); /* -1 if none */
/* Whether encode(add_bos = true) actually prepends BOS for this model. */
bool fy_tokenizer_wants_bos(const fy_tokenizer_t *tok);
/* End of generation: EOS, and the end-of-turn tokens of chat models
 * (<|im_end|>, <|eot_id|>, <|end|>, <|endoftext|>, <end_of_turn>, and
 * Gemma's <start_of_turn>, which only a turn that has ended can be followed
 * by) present in the vocabulary. */
bool fy_tokenizer_is_eog(const fy_tokenizer_t *tok, int32_t id);
/* Control, unknown or unused: not text.  User-defined tokens are text
 * ("  ", "\n\n" in Gemma 3) and are not special. */
bool fy_tokenizer_is_special(const fy_tokenizer_t *tok, int32_t id);
/*
 * The most bytes of text one token of encode's output can stand for: the
 * longest token (as stored or as decoded, special tokens' text included),
 * and at least 4 (the unknown token stands for one UTF-8 character).  A
 * text of more than max_ctx times this many bytes needs more than max_ctx
 * tokens, so it can be refused without tokenizing it.  0 when there is no
 * such bound: a vocabulary with neither every byte's token nor an unknown
 * token drops bytes it cannot spell.
 */
size_t fy_tokenizer_max_token_text(const fy_tokenizer_t *tok);
/* Id of the token whose vocabulary string is exactly text, or -1. */
int32_t fy_tokenizer_find(const fy_tokenizer_t *tok, const char *text);
/* The vocabulary string of a token (as stored, not decoded). */
const char *fy_tokenizer_piece(const fy_tokenizer_t *tok, int32_t id);

/*
 * Encodes len bytes of text (any bytes: invalid UTF-8 is encoded through
 * byte tokens, never dropped).  add_bos prepends BOS only when the model
 * wants it (fy_tokenizer_wants_bos).  User-defined tokens are matched in
 * any text; parse_special matches control and unknown tokens written in
 * the text too; leave it false for untrusted text, which then never gives
 * a special token (fy_tokenizer_is_special).
 * Writes at most max_tokens ids; *n_p is always set to the number of ids
 * the text needs.  Returns FY_ERR_NO_SPACE when that exceeds max_tokens.
 */
fy_status_t fy_tokenizer_encode(const fy_tokenizer_t *tok, const char *text, size_t len, bool add_bos,
                                bool parse_special, int32_t *tokens, size_t max_tokens, size_t *n_p);

/*
 * The bytes that token id stands for in decoded text (byte-level BPE
 * mapped back to bytes, "▁" to space, <0xXX> to its byte; user-defined
 * tokens as written).  Special tokens give their text when render_special
 * is true and nothing otherwise.
 * Invalid ids give nothing.  The pointer lives as long as the tokenizer.
 */
void fy_tokenizer_token_bytes(const fy_tokenizer_t *tok, int32_t id, bool render_special, const char **bytes_p,
                              size_t *len_p);

/* Whole-sequence decode into out (NUL-terminated, truncated to cap-1).
 * Returns the full length the text needs. */
size_t fy_tokenizer_decode(const fy_tokenizer_t *tok, const int32_t *tokens, size_t n, bool render_special, char *out,
                           size_t cap);

/*
 * Streaming detokenizer: push one token at a time, get the text that is
 * ready.  An incomplete UTF-8 sequence at the end is held back until the
 * bytes that complete it arrive; bytes that can never form valid UTF-8 are
 * passed through unchanged, so the concatenated output equals
 * fy_tokenizer_decode() byte for byte.  For SPM models the space that the
 * tokenizer prefixed to the text is removed from the first piece.
 */
typedef struct fy_detok {
    const fy_tokenizer_t *tok;
    bool render_special;
    bool at_start;
    uint8_t held[4];
    uint8_t n_held;
} fy_detok_t;

#define FY_DETOK_MAX_OUT 256 /* enough for one token's bytes plus held bytes */

void fy_detok_init(fy_detok_t *d, const fy_tokenizer_t *tok, bool render_special);
/* Appends token id; writes the ready bytes to out (cap >= FY_DETOK_MAX_OUT,
 * longer tokens are truncated) and returns their count.  Not NUL-terminated. */
size_t fy_detok_push(fy_detok_t *d, int32_t id, char *out, size_t cap);
/* Emits whatever is held back (at the end of a stream). */
size_t fy_detok_flush(fy_detok_t *d, char *out, size_t cap);

#endif /* FY_TOKENIZER_H */
