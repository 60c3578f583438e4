"""A reduction program: its axes, inputs and outputs (expressions over the nodes of neptune_eq.ir),
what is computed independent of how. Re-exported by neptune_eq.ir (`ir.Program`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .ir import Call, Const, Index, Length, Load, Node, ProgramError, Reduce, substitute, walk
from .irtext import show_shared
from .ops import MONOIDS, OPS

DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "bool", "uint8", "int8", "int16")
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8, "bool": 1,
               "uint8": 1, "int8": 1, "int16": 2}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    axes: tuple[str, ...]
    dtype: str = "float32"
    # the value the input holds, when a program computed it (a saved row max of the forward): the
    # e-graph knows the load equals it (what the numerics analysis proves of the one holds for the other)
    holds: Node | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Output:
    name: str
    axes: tuple[str, ...]
    expr: Node
    dtype: str | None = None  # None: float32


@dataclass
class Program:
    """A reduction program: what is computed, independent of how (the schedule)."""

    name: str
    axes: dict[str, int] = field(default_factory=dict)
    inputs: dict[str, TensorSpec] = field(default_factory=dict)
    outputs: list[Output] = field(default_factory=list)
    # axes whose length is only known at the call: `axes` holds the largest length the compile serves
    # (a bucket's bound); the e-graph holds no value for them and the kernels take them as arguments
    dynamic: frozenset[str] = frozenset()
    # a dynamic axis a derivation copied → the dynamic axis whose length it has at every call (the
    # gradient of one input read along two tied axes renames a reduction apart: Σ_j2 … beside j). Its
    # length is read where the other's is (lower/launch.length_source); no input need be declared over it
    same_length: dict[str, str] = field(default_factory=dict)
    # dynamic axes whose length a kernel may be specialised on (Triton's divisibility by 16 of an int
    # argument): a chunk axis (neptune_eq.chunked), whose chunks are tile multiples but the last — at
    # most one more compile, where a length left unspecialised leaves every access masked along the axis
    # unvectorised (its mask offs < n proves no alignment; a chunked backward's map ran at 0.9 TB/s)
    specialised: frozenset[str] = frozenset()

    def validate(self) -> Program:
        """Raise ProgramError naming the first problem found."""
        for ax, n in self.axes.items():
            if not isinstance(n, int) or n < 1:
                raise ProgramError(f"axis '{ax}' of program '{self.name}' has extent {n!r}; expected an int >= 1")
        for ax in self.dynamic:
            self._check_axis(ax, "the dynamic axes")
        for ax in self.specialised:
            if ax not in self.dynamic:
                raise ProgramError(f"axis '{ax}' of program '{self.name}' is specialised but not dynamic")
        for ax, of in self.same_length.items():
            if ax not in self.dynamic or of not in self.dynamic or of in self.same_length:
                raise ProgramError(f"axis '{ax}' of program '{self.name}' has the length of '{of}': both must be "
                                   f"dynamic, and '{of}' not itself a copy")
            if self.axes[ax] != self.axes[of]:
                raise ProgramError(f"axis '{ax}' of program '{self.name}' has the length of '{of}' but extent "
                                   f"{self.axes[ax]} against {self.axes[of]}")
        for spec in self.inputs.values():
            for ax in spec.axes:
                self._check_axis(ax, f"input '{spec.name}'")
            if spec.dtype not in DTYPES:
                raise ProgramError(f"input '{spec.name}' has unknown dtype {spec.dtype!r} (known: {DTYPES})")
        if not self.outputs:
            raise ProgramError(f"program '{self.name}' has no outputs")
        seen = set()
        for out in self.outputs:
            if out.name in self.inputs:
                raise ProgramError(f"output name '{out.name}' is also an input's name: name the output otherwise")
            if out.name in seen:
                raise ProgramError(f"output name '{out.name}' is used twice")
            seen.add(out.name)
            for ax in out.axes:
                self._check_axis(ax, f"output '{out.name}'")
            if len(set(out.axes)) != len(out.axes):
                raise ProgramError(f"output '{out.name}' repeats an axis: {out.axes}")
            for n in walk(out.expr):
                self._check_node(n, out.name)
            extra = out.expr.axes - set(out.axes)
            if extra:
                raise ProgramError(
                    f"output '{out.name}' is declared over axes {out.axes} but its expression also varies "
                    f"over {sorted(extra)}; reduce over them or add them to the output axes"
                )
        return self

    def _check_axis(self, ax: str, where: str) -> None:
        if ax not in self.axes:
            known = ", ".join(self.axes) or "none"
            raise ProgramError(f"unknown axis '{ax}' in {where} of program '{self.name}' (declared: {known})")

    def _check_node(self, n: Node, out: str) -> None:
        where = f"output '{out}'"
        if isinstance(n, Index | Length):
            self._check_axis(n.axis, where)
        elif isinstance(n, Load):
            spec = self.inputs.get(n.tensor)
            if spec is None:
                raise ProgramError(f"{where} reads unknown input '{n.tensor}' (inputs: {', '.join(self.inputs)})")
            if len(n.index) != len(spec.axes):
                raise ProgramError(
                    f"{where} indexes input '{n.tensor}' with {len(n.index)} indices; it has axes {spec.axes}"
                )
            for ax, idx in zip(spec.axes, n.index):
                if isinstance(idx, Index) and self.axes.get(idx.axis) != self.axes[ax]:
                    self._check_axis(idx.axis, where)
                    raise ProgramError(
                        f"shape mismatch in {where}: input '{n.tensor}' has axis '{ax}' of extent "
                        f"{self.axes[ax]} but is indexed by axis '{idx.axis}' of extent {self.axes[idx.axis]}"
                    )
        elif isinstance(n, Const) and n.value == 0.0 and math.copysign(1.0, n.value) < 0:
            # egglog's f64 (like the IR's hash) holds one zero: x / -0.0 would become x / 0.0
            raise ProgramError(f"{where} uses the constant -0.0, which the e-graph cannot tell from 0.0 (the sign "
                               "of x / -0.0 would be lost); write x / -0.0 as -(x / 0.0))")
        elif isinstance(n, Call):
            op = OPS.get(n.op)
            if op is None:
                raise ProgramError(f"{where} uses unknown operator '{n.op}' (known: {', '.join(OPS)})")
            if len(n.args) != op.arity:
                raise ProgramError(f"{where}: '{n.op}' takes {op.arity} arguments, got {len(n.args)}")
        elif isinstance(n, Reduce):
            if n.op not in MONOIDS:
                raise ProgramError(f"{where} reduces with unknown monoid '{n.op}' (known: {', '.join(MONOIDS)})")
            self._check_axis(n.axis, where)
            if n.axis not in n.body.axes:
                have = ", ".join(sorted(n.body.axes)) or "none"
                raise ProgramError(
                    f"{where}: {n.op} over axis '{n.axis}' but the body does not depend on '{n.axis}' "
                    f"(its axes: {have})"
                )

    def copies_within(self, axes) -> dict[str, str]:
        """same_length's entries whose two axes are both in `axes` (a program rebuilt over other axes)."""
        return {a: b for a, b in self.same_length.items() if a in axes and b in axes}

    def input_shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.axes[a] for a in self.inputs[name].axes)

    def output_shape(self, out: Output) -> tuple[int, ...]:
        return tuple(self.axes[a] for a in out.axes)

    def with_extents(self, extents: dict[str, int]) -> Program:
        """The same program specialised to other axis extents."""
        axes = dict(self.axes)
        for k, v in extents.items():
            if k not in axes:
                self._check_axis(k, "with_extents")
            axes[k] = v
        for ax, of in self.same_length.items():  # (a copy of an axis keeps its extent)
            axes[ax] = axes[of]
        return replace(self, axes=axes, inputs=dict(self.inputs), outputs=list(self.outputs)).validate()

    def with_dynamic(self, axes) -> Program:
        """The same program with the lengths of `axes` only known at the call (up to their extents here)."""
        dynamic = frozenset(axes)
        same = {a: b for a, b in self.same_length.items() if a in dynamic and b in dynamic}
        return replace(self, axes=dict(self.axes), inputs=dict(self.inputs), outputs=list(self.outputs),
                       dynamic=dynamic, same_length=same, specialised=self.specialised & dynamic).validate()

    def with_static_lengths(self) -> Program:
        """The same program with the length of every axis that is not dynamic written as its extent
        (`len(d)` → 64): only a dynamic axis's length is left for the kernels to take as an argument."""
        fixed = {Length(a): Const(float(n)) for a, n in self.axes.items() if a not in self.dynamic}
        if not any(isinstance(n, Length) for o in self.outputs for n in walk(o.expr)):
            return self
        outs = [Output(o.name, o.axes, substitute(o.expr, fixed), o.dtype) for o in self.outputs]
        return replace(self, axes=dict(self.axes), inputs=dict(self.inputs), outputs=outs).validate()

    def with_dtypes(self, dtypes: dict[str, str], outputs: str | None = None) -> Program:
        """The same program with other input dtypes (and, if given, one dtype for every output)."""
        inputs = dict(self.inputs)
        for k, v in dtypes.items():
            if k not in inputs:
                raise ProgramError(f"with_dtypes: unknown input '{k}' (inputs: {', '.join(inputs)})")
            inputs[k] = replace(inputs[k], dtype=v)
        outs = [Output(o.name, o.axes, o.expr, outputs or o.dtype) for o in self.outputs]
        return replace(self, axes=dict(self.axes), inputs=inputs, outputs=outs).validate()

    def unshadowed(self) -> Program:
        """The same program with every reduction over an axis that an enclosing reduction over another
        axis leaves free made over a fresh copy of that axis: (x[:-1] @ x.mT).softmax(-1) @ x captures
        Σ_i(… Σ_d x[j, d]·x[i, d] …)·x[i, d] in out[j, d], the inner Σ_d under a Σ_i whose body keeps d
        free. That is sound IR, but a plan read the inner d as the outer one and gave wrong numbers (a
        hunt, session 56: off by 2.6 on a [6, 4] input). A reduction nested in one over its own axis
        (max_j inside Σ_j) or standing in an output over its axis (a softmax's Σ_j, a norm's Σ_d) is
        the fusions' own pattern and stays. A copy of a dynamic axis is dynamic, with its length."""
        axes, dynamic, same = dict(self.axes), set(self.dynamic), dict(self.same_length)
        memo: dict = {}

        def fresh(a: str, context: frozenset[str]) -> str:
            k = 2
            while f"{a}{k}" in self.axes or f"{a}{k}" in context:
                k += 1
            name = f"{a}{k}"
            axes[name] = self.axes[a]
            if a in self.dynamic:
                dynamic.add(name)
                same[name] = self.same_length.get(a, a)
            return name

        def go(n: Node, context: frozenset[str], env: tuple, bound: frozenset = frozenset()) -> Node:
            # context: the axes an enclosing reduction over another axis leaves free (current names);
            # bound: the axes enclosing reductions bind (a layer norm's Σ_i inside Σ_d inside Σ_i stays)
            key = (n, context, env, bound)
            if key in memo:
                return memo[key]
            names = dict(env)
            if isinstance(n, Index):
                out = Index(names.get(n.axis, n.axis)) if isinstance(n.axis, str) else n
            elif isinstance(n, Reduce):
                # (nested in a copy of its own axis it rebinds that copy: max_d inside Σ_d2 is max_d2)
                ax = fresh(n.axis, context) if n.axis in context and n.axis not in bound else names.get(n.axis, n.axis)
                inner = tuple(sorted({**names, n.axis: ax}.items()))
                live = frozenset(names.get(a, a) for a in n.axes)
                out = Reduce(n.op, ax, go(n.body, (context - {n.axis}) | live, inner, bound | {n.axis}))
            elif isinstance(n, Call):
                out = Call(n.op, tuple(go(x, context, env, bound) for x in n.args))
            elif isinstance(n, Load):
                out = Load(n.tensor, tuple(go(x, context, env, bound) for x in n.index))
            else:
                out = n
            memo[key] = out
            return out

        outs = [Output(o.name, o.axes, go(o.expr, frozenset(), ()), o.dtype) for o in self.outputs]
        if all(a.expr is b.expr for a, b in zip(outs, self.outputs)):
            return self
        return replace(self, axes=axes, inputs=dict(self.inputs), outputs=outs, dynamic=frozenset(dynamic),
                       same_length=same, specialised=self.specialised & frozenset(dynamic)).validate()

    def __str__(self) -> str:
        return self.text()

    def text(self, *, exact: bool = False) -> str:
        """The program, readable; `exact` (the compile cache's key) writes constants bit for bit and
        every output's dtype, so programs that differ in either never share a key."""
        lines = [f"program {self.name}"]
        lines.append("  axes: " + ", ".join(f"{a}{'<=' if a in self.dynamic else '='}{n}"
                                            + (f" (len {self.same_length[a]})" if a in self.same_length else "")
                                            + (" (specialised)" if a in self.specialised else "")
                                            for a, n in self.axes.items()))
        for s in self.inputs.values():
            lines.append(f"  input {s.name}[{', '.join(s.axes)}]: {s.dtype}"
                         + (f" = {show_shared([s.holds], exact=exact)[1][0]}" if s.holds is not None else ""))
        lets, texts = show_shared([o.expr for o in self.outputs], exact=exact)
        lines += [f"  {k} = {v}" for k, v in lets]
        for o, text in zip(self.outputs, texts):
            dtype = f": {o.dtype or 'float32'}" if exact else ""
            lines.append(f"  {o.name}[{', '.join(o.axes)}]{dtype} = {text}")
        return "\n".join(lines)


