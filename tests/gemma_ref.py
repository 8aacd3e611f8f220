"""gemma_ref.py MODEL.gguf FERRY_DUMP - an independent Gemma 3 forward pass
in numpy (float64 activations; the tied output head in float32), from a
GGUF's weights as gguf-py dequantizes them, written from llama.cpp's gemma3
graph: sqrt(dim) embeddings, RMSNorm with the file's (already 1 + w)
weights before and after attention and MLP, per-head Q/K norms, NEOX rope
with base 10000 on sliding layers and rope.freq_base on every sixth
(global) layer, 1/sqrt(head_dim) query scale, GELU-tanh gated MLP, a key at
j masked for the query at i when i - j >= sliding_window.

FERRY_DUMP (written by tests/test_gemma.c): int32 n, int32 ids[n], int32 m,
int32 rows[m], float32 logits[m][vocab] - ferry's logits at those positions.

Prints one line per measure, for the test to parse:
  rel_err ALL           ferry's logits against the reference, all rows
  rel_err_late X        rows at or past the window (where it matters)
  rel_err_late_global X the same rows against a reference without the window
  top1 K M              rows where ferry's argmax is the reference's
"""
import struct
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def main():
    path, dump = sys.argv[1], sys.argv[2]
    r = GGUFReader(path)
    tensors = {t.name: t for t in r.tensors}

    def weight(name, dtype=np.float64):
        t = tensors[name]
        shape = [int(x) for x in t.shape][::-1]  # gguf lists ne[0] first
        return dequantize(t.data, t.tensor_type).astype(dtype).reshape(shape)

    def key(k):
        f = r.fields[k]
        return f.parts[f.data[0]].tolist()[0]

    n_layers = key("gemma3.block_count")
    dim = key("gemma3.embedding_length")
    n_heads = key("gemma3.attention.head_count")
    n_kv = key("gemma3.attention.head_count_kv")
    hd = key("gemma3.attention.key_length")
    eps = key("gemma3.attention.layer_norm_rms_epsilon")
    base = key("gemma3.rope.freq_base")
    window = key("gemma3.attention.sliding_window")

    with open(dump, "rb") as f:
        n = struct.unpack("<i", f.read(4))[0]
        ids = np.frombuffer(f.read(4 * n), dtype=np.int32)
        m = struct.unpack("<i", f.read(4))[0]
        rows = np.frombuffer(f.read(4 * m), dtype=np.int32)
        got = np.frombuffer(f.read(), dtype=np.float32).reshape(m, -1).astype(np.float64)

    emb = weight("token_embd.weight", np.float32)

    def rms(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w

    def rope(v, theta):  # v [n, heads, hd], halves rotated (neox)
        half = hd // 2
        inv = 1.0 / theta ** (np.arange(half) * 2.0 / hd)
        ang = np.arange(len(v))[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = v[..., :half], v[..., half:]
        return np.concatenate([a * c - b * s, a * s + b * c], -1)

    def gelu_tanh(g):
        return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))

    def forward():
        """the logits of rows with the window and without, one pass over the weights"""
        xs = [emb[ids].astype(np.float64) * np.sqrt(dim) for _ in range(2)]
        i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        causal = j > i
        outside = i - j >= window
        for layer in range(n_layers):
            p = "blk.%d." % layer
            is_global = (layer + 1) % 6 == 0
            w = {name: weight(p + name + ".weight") for name in (
                "attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output",
                "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm")}
            theta = base if is_global else 10000.0
            for use_window, x in enumerate(xs):
                h = rms(x, w["attn_norm"])
                q = (h @ w["attn_q"].T).reshape(n, n_heads, hd)
                k = (h @ w["attn_k"].T).reshape(n, n_kv, hd)
                v = (h @ w["attn_v"].T).reshape(n, n_kv, hd)
                q = rope(rms(q, w["attn_q_norm"]), theta)
                k = rope(rms(k, w["attn_k_norm"]), theta)
                mask = causal | outside if use_window and not is_global else causal
                att = np.zeros((n, n_heads, hd))
                for hh in range(n_heads):
                    kh = hh // (n_heads // n_kv)
                    s = q[:, hh, :] @ k[:, kh, :].T / np.sqrt(hd)
                    s[mask] = -np.inf
                    s = np.exp(s - s.max(1, keepdims=True))
                    att[:, hh, :] = (s / s.sum(1, keepdims=True)) @ v[:, kh, :]
                o = att.reshape(n, n_heads * hd) @ w["attn_output"].T
                x = x + rms(o, w["post_attention_norm"])
                h = rms(x, w["ffn_norm"])
                g = gelu_tanh(h @ w["ffn_gate"].T) * (h @ w["ffn_up"].T)
                xs[use_window] = x + rms(g @ w["ffn_down"].T, w["post_ffw_norm"])
        out_norm = weight("output_norm.weight")
        return [(rms(x[rows], out_norm).astype(np.float32) @ emb.T).astype(np.float64) for x in xs]

    def rel(a, b):
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    glob, ref = forward()
    late = rows >= window
    print("rel_err %.6g" % rel(got, ref))
    if late.any():
        print("rel_err_late %.6g" % rel(got[late], ref[late]))
        print("rel_err_late_global %.6g" % rel(got[late], glob[late]))
    print("top1 %d %d" % (int((got.argmax(1) == ref.argmax(1)).sum()), m))


if __name__ == "__main__":
    main()
