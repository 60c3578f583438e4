"""y[i] = Σ_j sqrt(exp(x[i, j] − max_j x)): the built-in rules find no rolling correction through sqrt.

With the user rule `sqrt(a) / sqrt(b) -> sqrt(a / b)` (rules/sqrt.rules) they do: see docs/RULES.md.
    neptune-eq explore examples/sqrt_sum.py --rules sqrt
"""

from neptune_eq import dsl as ne

P = ne.program("sqrt_sum")
i, j = P.axes(i=64, j=1000)
x = P.input("x", i, j)
P.output("y", ne.sum(ne.sqrt(ne.exp(x - ne.max(x, j))), j))
program = P.build()
