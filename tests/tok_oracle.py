#!/usr/bin/env python3
"""tok_oracle.py - the expected token ids of tests/data/tok_corpus.json for
each built-in model, from Hugging Face's `tokenizers` package (a second
implementation, not ferry's), written to tests/data/tok_expected.json.

    python3 -m venv build/venv-tok
    build/venv-tok/bin/pip install tokenizers gguf numpy
    build/venv-tok/bin/python tests/tok_oracle.py models/*.gguf

There is no model hub here, so the tokenizer.json that transformers would
load is built from the GGUF's own arrays, as llama.cpp reads them:

  - tokenizer.ggml.model "gpt2": byte-level BPE with the file's merges and
    the pre-tokenizer its tokenizer.ggml.pre names (SmolLM2's "smollm":
    single digits, then GPT-2's regex);
  - "llama" (SentencePiece, Gemma 3): BPE with byte fallback over the
    normalized text (" " -> "\u2581", a "\u2581" prefix when
    add_space_prefix), the merges SentencePiece's BPE implies: every split
    of a normal token into two normal tokens, ranked by the merged token's
    score (transformers' SentencePieceExtractor does the same).

Token types (tokenizer.ggml.token_type) decide what text may become:
USER_DEFINED tokens (Gemma's runs of spaces, tabs and newlines, its HTML
tags) are added tokens with special=False, normalized=False: matched in the
raw text before the model runs, longest match first, as llama.cpp and
transformers do.  CONTROL tokens are left out of the added tokens: they
stand for untrusted text's expected ids, which must never hold one (ferry
matches them only when asked to parse specials, and only chat templates
ask).  The script checks its own output against facts known from llama.cpp
before it writes anything.
"""
import json
import os
import sys

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "data", "tok_corpus.json")
EXPECTED = os.path.join(HERE, "data", "tok_expected.json")


def read_gguf(path):
    r = gguf.GGUFReader(path)

    def field(name, default=None):
        f = r.fields.get(name)
        if f is None:
            return default
        if len(f.data) == 1 and f.types[0] != gguf.GGUFValueType.ARRAY:
            v = f.parts[f.data[0]]
            return bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else v.tolist()[0]
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]

    meta = {
        "model": field("tokenizer.ggml.model"),
        "pre": field("tokenizer.ggml.pre", "default"),
        "tokens": field("tokenizer.ggml.tokens"),
        "types": field("tokenizer.ggml.token_type"),
        "scores": field("tokenizer.ggml.scores"),
        "merges": field("tokenizer.ggml.merges"),
        "add_space_prefix": field("tokenizer.ggml.add_space_prefix", False),
        "unk": field("tokenizer.ggml.unknown_token_id"),
    }
    if meta["types"] is None:
        meta["types"] = [NORMAL] * len(meta["tokens"])
    return meta


def vocab_dict(tokens):
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # a repeated text keeps its first id, as in ferry and llama.cpp
    return vocab


def spm_merges(tokens, types, scores, vocab):
    """SentencePiece BPE's merges: a pair of normal tokens whose concatenation
    is a normal token, best merged score first (ties: the merged token's id)."""
    normal = {t for t, ty in zip(tokens, types) if ty == NORMAL}
    found = []
    for i, t in enumerate(tokens):
        if types[i] != NORMAL or len(t) < 2 or vocab.get(t) != i:
            continue
        for k in range(1, len(t)):
            left, right = t[:k], t[k:]
            if left in normal and right in normal:
                found.append((-scores[i], i, vocab[left], vocab[right], left, right))
    found.sort()
    return [(f[4], f[5]) for f in found]


def build(meta):
    tokens, types = meta["tokens"], meta["types"]
    vocab = vocab_dict(tokens)
    if meta["model"] == "gpt2":
        if meta["pre"] not in ("smollm", "default", "gpt-2", "starcoder"):
            sys.exit(f"tok_oracle: pre-tokenizer {meta['pre']} is not written here")
        merges = [tuple(m.split(" ", 1)) for m in meta["merges"]]
        tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        parts = [byte_level]
        if meta["pre"] in ("smollm", "starcoder"):
            parts.insert(0, pre_tokenizers.Digits(individual_digits=True))
        tk.pre_tokenizer = pre_tokenizers.Sequence(parts)
        tk.decoder = decoders.ByteLevel()
    elif meta["model"] == "llama":
        merges = spm_merges(tokens, types, meta["scores"], vocab)
        unk = tokens[meta["unk"]] if meta["unk"] is not None else None
        tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token=unk, fuse_unk=True))
        norm = [normalizers.Replace(" ", "\u2581")]
        if meta["add_space_prefix"]:
            norm.insert(0, normalizers.Prepend("\u2581"))
        tk.normalizer = normalizers.Sequence(norm)
        tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    else:
        sys.exit(f"tok_oracle: tokenizer model {meta['model']} is not written here")
    user = [t for t, ty in zip(tokens, types) if ty == USER_DEFINED and t]
    tk.add_tokens([AddedToken(t, special=False, normalized=False, lstrip=False, rstrip=False, single_word=False)
                   for t in user])
    for t in user:  # added tokens must keep the GGUF's ids
        assert tk.token_to_id(t) == vocab[t], t
    return tk


# Facts from llama.cpp's llama-tokenize (tests/test_tokenizer.c has more of SmolLM2's).
KNOWN = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": [
        ("Hello world", [19556, 905]),
        ("   multiple   spaces  ", [256, 2701, 256, 5600, 256]),
        ("line one\nline two\n\n", [1311, 582, 198, 1311, 827, 1116]),
        ("\u4f60\u597d\uff0c\u4e16\u754c", [18645, 250, 48392, 138, 12831, 7906, 240, 178, 239, 230]),
        ("<|im_start|>user", [44, 108, 306, 79, 3738, 108, 46, 4093]),
    ],
    "gemma-3-270m-q4_k_m.gguf": [
        ("  ", [138]),  # one USER_DEFINED token in llama.cpp, two "\u2581" in ferry before
        ("\n\n", [108]),
        ("\t\t", [255969]),
    ],
}


def main():
    paths = sys.argv[1:]
    if not paths:
        sys.exit("usage: tok_oracle.py MODEL.gguf...")
    with open(CORPUS, encoding="utf-8") as f:
        corpus = json.load(f)
    out = {}
    for path in paths:
        name = os.path.basename(path)
        meta = read_gguf(path)
        tk = build(meta)
        control = {i for i, ty in enumerate(meta["types"]) if ty == CONTROL}
        for text, want in KNOWN.get(name, []):
            got = tk.encode(text, add_special_tokens=False).ids
            if got != want:
                sys.exit(f"tok_oracle: {name}: {text!r} gives {got}, llama.cpp {want}")
        ids = []
        for text in corpus:
            got = tk.encode(text, add_special_tokens=False).ids
            if control & set(got):
                sys.exit(f"tok_oracle: {name}: {text!r} gives a control token: {got}")
            ids.append(got)
        out[name] = ids
        print(f"{name}: {len(ids)} strings, {sum(map(len, ids))} ids")
    with open(EXPECTED, "w", encoding="utf-8") as f:
        f.write("{\n")
        for k, name in enumerate(out):
            f.write(f'  "{name}": [\n')
            rows = [json.dumps(r, separators=(",", ":")) for r in out[name]]
            f.write(",\n".join("    " + r for r in rows))
            f.write("\n  ]" + ("," if k + 1 < len(out) else "") + "\n")
        f.write("}\n")


if __name__ == "__main__":
    main()
