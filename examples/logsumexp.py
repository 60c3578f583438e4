"""Log-sum-exp over the last axis: lse[i] = m + log sum_j exp(x[i, j] - m), m = max_j x."""

from neptune_eq import dsl as ne
from neptune_eq.library import logsumexp

P = ne.program("logsumexp")
i, j = P.axes(i=64, j=1000)
x = P.input("x", i, j)
P.output("lse", logsumexp(x, j))
program = P.build()
