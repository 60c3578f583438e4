"""Row softmax: y[i, j] = exp(x[i, j] - max_j x) / sum_j exp(x[i, j] - max_j x)."""

from neptune_eq import dsl as ne
from neptune_eq.library import softmax

P = ne.program("softmax")
i, j = P.axes(i=64, j=1000)
x = P.input("x", i, j)
P.output("y", softmax(x, j))
program = P.build()
