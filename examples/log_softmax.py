"""Log-softmax: y[i, j] = x[i, j] - logsumexp_j x."""

from neptune_eq import dsl as ne
from neptune_eq.library import log_softmax

P = ne.program("log_softmax")
i, j = P.axes(i=64, j=1000)
x = P.input("x", i, j)
P.output("y", log_softmax(x, j))
program = P.build()
