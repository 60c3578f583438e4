"""Fill the compile cache for bench/grad_attention.py: one process per (operator, length) compiles
the forward, both derived backwards and the training forward (one fwd+bwd call on the GPU), in
parallel — compiling is single-threaded Python, and the benchmark then finds every plan cached.

    python bench/grad_warm.py --ops causal_pf global_pf --L 1024 16384
"""

from __future__ import annotations

import argparse


def warm(op: str, L: int) -> None:
    from cases import Case

    import neptune_eq

    case = Case(op, L)
    leaves = [x.detach().clone().requires_grad_() for x in case.inputs("cuda")]
    prog = neptune_eq.compile(case.fn, *leaves)
    prog(*leaves).sum().backward()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", nargs="+", required=True)
    ap.add_argument("--L", nargs="+", type=int, required=True)
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        warm(args.one[0], int(args.one[1]))
        return
    from cases import warm_in_parallel

    warm_in_parallel(__file__, args.ops, args.L)


if __name__ == "__main__":
    main()
