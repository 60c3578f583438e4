"""RMSNorm feeding a matmul: y[i, n] = sum_k (x[i, k] / rms_k(x)) w[k, n]. The norm factors out of the
contraction (it does not depend on k), so both sums share one pass over k."""

from neptune_eq import dsl as ne
from neptune_eq.library import rmsnorm

P = ne.program("rmsnorm_matmul")
i, k, n = P.axes(i=64, k=256, n=64)
x = P.input("x", i, k)
w = P.input("w", k, n)
P.output("y", ne.sum(rmsnorm(x, k) * w, k), (i, n))
program = P.build()
