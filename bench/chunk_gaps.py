# chunk_gaps.py URL N MAXTOK (bench/exp_chunk_gaps.sh runs it): N streamed /v1/completions one after another;
# prints the gaps between SSE chunks that carried tokens (as the client
# reads them) and the tokens per chunk (from the chunk's logprobs).
import json, socket, sys, time
url, n, maxtok = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
host, port = url.split("//")[1].split(":")
port = int(port)
prompts = ["one two three four five one two three four five one two three four five one two",
           "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick",
           "Write a short story about a robot who learns to paint.",
           "List the numbers from 1 to 50 separated by commas: 1, 2, 3,"]
gaps, per_chunk = [], []
for i in range(n):
    body = json.dumps({"prompt": prompts[i % len(prompts)], "max_tokens": maxtok, "stream": True,
                       "temperature": 0, "ignore_eos": True, "logprobs": 0}).encode()
    s = socket.create_connection((host, port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
              + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    buf, last, done = b"", None, False
    while not done:
        d = s.recv(65536)
        if not d: break
        t = time.monotonic()
        buf += d
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            k = ev.find(b"data: ")
            if k < 0: continue
            p = ev[k + 6:]
            if p == b"[DONE]": done = True; break
            j = json.loads(p)
            ch = j.get("choices") or []
            ntok = len(((ch[0].get("logprobs") or {}).get("tokens")) or []) if ch else 0
            if ntok == 0: continue
            per_chunk.append(ntok)
            if last is not None: gaps.append(t - last)
            last = t
    s.close()
gaps.sort()
def pct(p): return gaps[min(len(gaps) - 1, int(p * len(gaps)))] * 1e3
under = lambda ms: 100.0 * sum(1 for g in gaps if g < ms / 1e3) / len(gaps)
print("requests %d, tokens %d, chunks %d, tokens/chunk %.2f (max %d)" % (n, sum(per_chunk), len(per_chunk),
      sum(per_chunk) / len(per_chunk), max(per_chunk)))
print("gaps %d: <1 ms %.1f%%, <10 ms %.1f%%; p10 %.2f ms, p50 %.2f ms, p90 %.2f ms, p99 %.2f ms" % (
      len(gaps), under(1), under(10), pct(0.1), pct(0.5), pct(0.9), pct(0.99)))
