"""Global attention: o[b,h,i,e] = sum_j softmax_j(q·k / sqrt(d)) v[b,h,j,e]."""

import math

from neptune_eq import dsl as ne
from neptune_eq.library import attention

P = ne.program("attention")
b, h, i, j, d, e = P.axes(b=1, h=2, i=96, j=96, d=32, e=32)
q = P.input("q", b, h, i, d)
k = P.input("k", b, h, j, d)
v = P.input("v", b, h, j, e)
P.output("o", attention(q, k, v, key_axis=j, dim_axis=d, scale=1 / math.sqrt(32)), (b, h, i, e))
program = P.build()
