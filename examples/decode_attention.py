"""Decode attention: one query row per head against a long key axis (FlashDecoding territory).

At this shape a pass over the keys gives only b·h = 8 programs for 132 SMs, so the cost model
splits the key axis; `prefill` is the same program with as many queries as keys, where the
query tiles already fill the GPU and the rolling pass is not split.
"""

import math

from neptune_eq import dsl as ne
from neptune_eq.library import attention

P = ne.program("decode_attention")
b, h, i, j, d, e = P.axes(b=1, h=8, i=1, j=4096, d=32, e=32)
q = P.input("q", b, h, i, d)
k = P.input("k", b, h, j, d)
v = P.input("v", b, h, j, e)
P.output("o", attention(q, k, v, key_axis=j, dim_axis=d, scale=1 / math.sqrt(32)), (b, h, i, e))
program = P.build()
prefill = program.with_extents({"i": 4096, "h": 32, "d": 128, "e": 128})
