#!/usr/bin/env python3
"""spec_oracle.py - offline study of lookup proposers on the greedy text of
`ferry bench-spec --dump FILE` (prompts and outputs without speculation):
for each proposer, the accepted tokens and the speed-up a batch-1 decode
would get under a forward-pass cost curve (ms for 1..n tokens; default the
quiet-machine figures of BENCHMARKS.md issue 8: 3.6 ms for 1 token, 4.3 for
2, 5.4 for 4, 10.5 for 9, linear in between and past).  Upper bounds:
  oracle-k    the longest match's continuation, cut to exactly what passes
              (a perfect sizing of one chain);
  oracle-any  the best continuation over every earlier occurrence of every
              matching suffix, cut likewise (what a token tree holding all
              of them would accept, costed as a chain of the accepted run:
              a tree's extra rows are not charged, so this is generous).
The first output token comes from the prompt's pass and is not counted.
usage: spec_oracle.py DUMP [--cost 1:3.6,2:4.3,4:5.4,9:10.5]
"""
import sys


def cost_fn(spec):
    pts = sorted((int(a), float(b)) for a, b in (p.split(':') for p in spec.split(',')))

    def c(n):
        for (n0, c0), (n1, c1) in zip(pts, pts[1:]):
            if n <= n1:
                return c0 + (c1 - c0) * (n - n0) / (n1 - n0)
        (n0, c0), (n1, c1) = pts[-2], pts[-1]
        return c1 + (c1 - c0) / (n1 - n0) * (n - n1)
    return c


def matches(t, maxm=32):
    """(match length, continuation start) of every earlier occurrence of a suffix of t."""
    n = len(t)
    for e in range(n - 1, 0, -1):
        m = 0
        while m < maxm and m < e and t[e - 1 - m] == t[n - 1 - m]:
            m += 1
        if m:
            yield m, e


def ngram(t, k, nmax=3):
    n = len(t)
    for m in range(min(nmax, n - 1), 0, -1):
        suf = t[n - m:]
        for s in range(n - m - 1, -1, -1):
            if t[s:s + m] == suf:
                return t[s + m:s + m + k]
    return []


def longest(t, k):
    best, at = 0, None
    for m, e in matches(t):
        if m > best:
            best, at = m, e
    return t[at:at + k] if at is not None else []


def run(data, propose, cost):
    toks = secs = acc = prop = 0
    for p, o in data:
        j = 1
        while j < len(o):
            d = propose(p + o[:j], o[j:])
            a = 0
            while a < len(d) and j + a < len(o) and d[a] == o[j + a]:
                a += 1
            toks += min(a + 1, len(o) - j)
            secs += cost(len(d) + 1)
            acc += a
            prop += len(d)
            j += a + 1
    return toks * cost(1) / secs, acc, prop


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    spec = '1:3.6,2:4.3,4:5.4,9:10.5'
    if '--cost' in sys.argv:
        spec = sys.argv[sys.argv.index('--cost') + 1]
    cost = cost_fn(spec)
    data = {}
    lines = open(sys.argv[1]).read().split('\n')
    for i in range(0, len(lines) - 1, 2):
        w = 'rewrite' if lines[i][1] == '0' else 'open'
        data.setdefault(w, []).append((list(map(int, lines[i].split()[1:])), list(map(int, lines[i + 1].split()[1:]))))

    def cut(d, rest):
        a = 0
        while a < len(d) and a < len(rest) and d[a] == rest[a]:
            a += 1
        return d[:a]

    def oracle_any(t, rest):
        best = []
        for m, e in matches(t):
            d = cut(t[e:e + 16], rest)
            if len(d) > len(best):
                best = d
        return best

    print('cost curve (ms):', spec)
    print('| workload | proposer | speed-up (model) | accepted / proposed |')
    print('|---|---|---:|---:|')
    for w, ds in data.items():
        rows = [('ngram k=%d' % k, lambda t, r, k=k: ngram(t, k)) for k in (2, 3, 4, 8)]
        rows += [('longest match k=%d' % k, lambda t, r, k=k: longest(t, k)) for k in (2, 3, 4, 8)]
        rows += [('oracle-k', lambda t, r: cut(longest(t, 16), r)), ('oracle-any', oracle_any)]
        for name, f in rows:
            s, a, p = run(ds, f, cost)
            print('| %s | %s | %.2fx | %d / %d |' % (w, name, s, a, p))


if __name__ == '__main__':
    main()
