"""gguf_dequant.py TYPE:IN:OUT ... - dequantizes raw GGUF blocks with gguf-py.

For tests/test_quant.c: each argument names a GGML type as gguf-py spells
it (Q4_K, IQ4_NL, ...), a file of whole blocks of that type, and a file to
write their values to as little-endian float32.  gguf-py's numpy
dequantizers are an implementation independent of ferry's (common/dtype.c).
Exit status 3: gguf-py or numpy cannot be imported (the test skips).
"""
import sys

try:
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
except ImportError as e:
    print(f"gguf_dequant: {e}", file=sys.stderr)
    sys.exit(3)

for arg in sys.argv[1:]:
    name, src, dst = arg.split(":", 2)
    qtype = GGMLQuantizationType[name]
    data = np.fromfile(src, dtype=np.uint8)
    out = dequantize(data, qtype).astype("<f4", copy=False)
    out.tofile(dst)
