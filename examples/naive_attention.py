"""Attention written naively: probabilities normalised *before* the P·V contraction.

p = exp(s - m) / l, then o = sum_j p·v. The e-graph still fuses it into one kernel, by factoring
1/l out of the sum over keys (delayed normalisation) or by a correction over two producers.
"""

import math

from neptune_eq import dsl as ne

P = ne.program("naive_attention")
b, h, i, j, d, e = P.axes(b=1, h=2, i=96, j=96, d=32, e=32)
q = P.input("q", b, h, i, d)
k = P.input("k", b, h, j, d)
v = P.input("v", b, h, j, e)
s = ne.sum(q * k, d) / math.sqrt(32)
m = ne.max(s, j)
p = ne.exp(s - m) / ne.sum(ne.exp(s - m), j)
P.output("o", ne.sum(p * v, j), (b, h, i, e))
program = P.build()
