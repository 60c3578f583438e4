"""From a traced aten graph to an ir.Program, in two passes over the nodes reachable from the output.

    infer   every node's dimensions as axis variables (axes.AxisTable); operations unify them
    resolve relations get a direction; axes get names (see `TEMPLATES`)
    build   every node's IR expression over the named program axes

Handlers (ops_*.py) implement both passes for one family of aten operators. Axis names: the
dimensions of inputs, then of outputs, then of other values are named by position from
`TEMPLATES` (a 4-d q[B, H, L, D] gives b, h, i, d), taking the next free letter when the
preferred one is taken (the keys of k[B, H, S, D] become j, its features share d with q; v's
features become e); axes without a template get n0, n1, .... Axes computed from others by a
reshape are named after them: the kv head of grouped-query attention split off query head `h` is
`h0` (= h // G), a merged (b, h) is `bh`.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass, field, replace

import torch
from torch import fx

from .. import dsl, ir
from . import rounding
from .axes import AxisTable, Dim, Resolution
from .checks import IndexCheck, analyse, holds_at_every_length, index_program, refuse_reduced_index
from .exprs import add, arg_extreme_axis, call, const, negate, select, substitute
from .exprs import reduce as reduce_expr
from .inplace import functional_twin
from .lengths import LengthValues
from .operands import Info, InputDecl, OpCall, Operand, Translation, Unavailable, dtype_name, op_name
from .source import CaptureError, located, location
from .symsizes import SizeTrace

TEMPLATES = {1: "i", 2: "id", 3: "bid", 4: "bhid", 5: "bhgid"}


# operations drawing random numbers (F.dropout traces to bernoulli): named as such when refused
_RANDOM = frozenset({"bernoulli", "native_dropout", "rand", "rand_like", "randn", "randn_like", "randint",
                     "randint_like", "randperm", "uniform", "normal", "multinomial", "exponential",
                     "geometric", "cauchy", "log_normal", "poisson"})


@dataclass
class Translator(LengthValues):
    """Translates one traced graph; `handlers` maps aten overloads to objects with
    infer(translator, call) -> dims and build(translator, call) -> ir.Node (see ops_*.py)."""

    graph: fx.Graph
    inputs: list[InputDecl]  # one per placeholder
    constants: dict[str, tuple[str, torch.Tensor]]  # get_attr target -> (input name, value)
    handlers: dict
    name: str = "captured"
    axes: AxisTable = field(default_factory=AxisTable)
    infos: dict = field(default_factory=dict)
    renames: dict = field(default_factory=dict)
    # the classes a contraction's product varies along (its result's and the one it sums over): an axis
    # unified later with its summed class would be captured by the sum (keep_apart)
    bodies: list = field(default_factory=list)
    exprs: dict = field(default_factory=dict)
    exact_exprs: dict = field(default_factory=dict)  # rounding.exact's memo
    narrowed: dict = field(default_factory=dict)  # rounding.narrowed's memo
    inexact_readers: frozenset = frozenset()  # aten ops that read a narrowed value unrounded (rounding.py)
    compute_rank: int = 2  # the kernels' float precision (rounding.RANK): float64 programs compute in it
    symbolic_lengths: bool = False  # lengths as len(axis), not numbers (a dynamic function's capture)
    sizes: SizeTrace | None = None  # which numbers of the graph are sizes (frontend/symsizes.py)
    written_sizes: set = field(default_factory=set)  # the keys of sizes.values written with len(axis)
    res: Resolution | None = None
    checks: list[IndexCheck] = field(default_factory=list)
    storage_reads: set[str] = field(default_factory=set)  # inputs as_strided reads (they must be contiguous)
    _builder: dsl.ProgramBuilder | None = None
    _declared: set[str] = field(default_factory=set)

    # ---------------------------------------------------------------- driver
    def run(self) -> Translation:
        nodes = self._reachable()
        out_node = nodes[-1]
        for node in nodes[:-1]:
            self._guard(node, self._infer)
        outs = _flat_outputs(out_node)
        for n in outs:
            self.axes.prefer.update(v for v in self.infos[n].dims if v is not None)
        try:
            self.res = self.axes.resolve()
        except CaptureError as e:  # (a conflict among reshapes: name their lines)
            lines = list(dict.fromkeys(w for n in self.axes.reshaped_at if (w := location(n)) is not None))
            raise CaptureError(f"{e} (the reshapes {'; '.join(lines)})" if lines else str(e)) from None
        ends = [*self.input_dtypes.values(), *(self.infos[n].dtype for n in outs if isinstance(self.infos[n], Info))]
        self.compute_rank = 3 if torch.float64 in ends else 2
        self.res.reserved = {d.name for d in self.inputs} | {name for name, _ in self.constants.values()}
        self._check_distinct(nodes[:-1])
        self._name_axes(nodes[:-1], outs)
        for node in nodes[:-1]:
            self._guard(node, self._build)
        return self._assemble(outs)

    def _guard(self, node: fx.Node, step) -> None:
        self.axes.at = node
        try:
            step(node)
        except CaptureError as e:
            raise located(e, location(node)) from None

    def _reachable(self) -> list[fx.Node]:
        out = next(n for n in reversed(self.graph.nodes) if n.op == "output")
        keep: set[fx.Node] = {out}
        stack = [out]
        while stack:
            for a in stack.pop().all_input_nodes:
                if a not in keep:
                    keep.add(a)
                    stack.append(a)
        return [n for n in self.graph.nodes if n in keep]

    # ---------------------------------------------------------------- pass 1
    def _infer(self, node: fx.Node) -> None:
        if node.op in ("placeholder", "get_attr"):
            val = node.meta["val"]
            self.infos[node] = Info(self.axes.dims_for(val.shape, data=True), tuple(val.shape), val.dtype)
            return
        if node.op != "call_function":
            raise CaptureError(f"unsupported graph node {node.op} {node.target}")
        if node.target is operator.getitem:
            src, k = node.args
            part = self.infos[src][k]
            if isinstance(part, Unavailable):
                raise CaptureError(f"unsupported use of {part.what}")
            self.infos[node] = part
            return
        handler = self._handler(node)
        call = self._call(node, pass2=False)
        result = handler.infer(self, call)
        self.infos[node] = self._wrap_info(node, result)

    def _handler(self, node: fx.Node):
        h = self.handlers.get(node.target) or self.handlers.get(functional_twin(node))
        if h is None:
            name = op_name(node.target)
            why = " (random numbers: dropout and sampling run outside the compiled function)" \
                if name.split(".")[-1].lstrip("_") in _RANDOM else ""
            raise CaptureError(f"unsupported operation {name}{why}")
        return h

    def _wrap_info(self, node: fx.Node, result):
        val = node.meta["val"]
        if isinstance(val, tuple | list):
            out = []
            for v, dims in zip(val, result):
                if isinstance(dims, Unavailable) or dims is None:
                    out.append(dims)
                else:
                    out.append(dims if isinstance(dims, Info) else Info(tuple(dims), tuple(v.shape), v.dtype))
            return tuple(out)
        if isinstance(result, Info):
            return result
        return Info(tuple(result), tuple(val.shape), val.dtype)

    def _placeholder_index(self, node: fx.Node) -> int:
        return [n for n in self.graph.nodes if n.op == "placeholder"].index(node)

    def _call(self, node: fx.Node, *, pass2: bool, exact: bool = False) -> OpCall:
        """The call's arguments as Operands; in pass 2 with their expressions, exact (rounding.py) for
        every operand when `exact`, else for the narrowed ones (unless the call moves values or is a
        matmul, and computes at their dtype)."""
        counter = itertools.count()
        renames = self.renames.get(node, {})
        wide = rounding.computes_in(node, self.infos) if pass2 else 0
        inexact = pass2 and (node.target in self.inexact_readers or functional_twin(node) in self.inexact_readers)

        def conv(a):
            if not isinstance(a, fx.Node):
                return a
            pos = next(counter)
            info = self.infos[a]
            if not isinstance(info, Info):
                raise CaptureError(f"operation on a non-tensor value {a.name}")
            if not pass2:
                return Operand(pos, info)
            taken = exact or ((rounding.narrower(info.dtype, wide) or not inexact) and rounding.narrowed(self, a))
            expr = rounding.exact(self, a) if taken else self.exprs[a]
            mapping = renames.get(pos)
            if mapping:
                info, expr = self._apply_rename(info, expr, mapping)
            return Operand(pos, info, expr)

        args = fx.node.map_aggregate(node.args, conv)
        kwargs = fx.node.map_aggregate(node.kwargs, conv)
        return OpCall(node, tuple(args), dict(kwargs))

    def _apply_rename(self, info: Info, expr: ir.Node, mapping: dict[int, int]):
        find = self.axes.find
        by_root = {find(old): new for old, new in mapping.items()}
        dims = tuple(by_root.get(find(v), v) if v is not None else None for v in info.dims)
        subst = {self.res.name(old): self.res.index(new) for old, new in by_root.items()}
        return Info(dims, info.shape, info.dtype), self.substitute(expr, subst)

    # helpers for handlers (pass 1)
    def combine(self, call: OpCall, n_slots: int, operands: list[tuple[Operand, list[int | None]]]) -> list[Dim]:
        """Unify operand dimensions placed in slots (`operands`: (operand, slot per dimension or None
        to leave a dimension out)); records renames of operands that would repeat an axis."""
        entries = [list(zip(slots, op.dims)) for op, slots in operands]
        out, renames = self.axes.combine(n_slots, entries, self._apart)
        if renames:
            rec = self.renames.setdefault(call.node, {})
            for k, mapping in renames.items():
                rec[operands[k][0].pos] = mapping
        return out

    def keep_apart(self, dims: list) -> None:
        """Record a value no fx node holds that varies along `dims` (a contraction's product, before
        its sum): t1 @ t1.mT + t1 had unified the product's column axis with the class it sums over, t1's
        columns, so the sum bound its own output axis — wrong, silently (fuzzer seed 1057)."""
        self.bodies.append([v for v in dims if v is not None])

    def _apart(self, a: int, b: int) -> bool:
        """Some value seen so far varies along both classes (unifying them would make it a diagonal)."""
        find = self.axes.find
        values = (part.dims for info in self.infos.values() for part in _tensor_parts(info))
        for dims in itertools.chain(values, self.bodies):
            roots = {find(v) for v in dims if v is not None}
            if a in roots and b in roots:
                return True
        return False

    def broadcast(self, call: OpCall, operands: list[Operand], rank: int | None = None) -> list[Dim]:
        """Dimensions of the elementwise combination of `operands` (right-aligned broadcasting)."""
        rank = max(op.ndim for op in operands) if rank is None else rank
        placed = [(op, [rank - op.ndim + k for k in range(op.ndim)]) for op in operands]
        return self.combine(call, rank, placed)

    # ---------------------------------------------------------------- resolution and naming
    def _check_distinct(self, nodes: list[fx.Node]) -> None:
        for node in nodes:
            for part in _tensor_parts(self.infos.get(node)):
                roots = [self.axes.find(v) for v in part.dims if v is not None]
                if len(set(roots)) != len(roots):
                    raise located(
                        CaptureError("the dimensions of a value could not be kept apart as distinct axes"),
                        location(node),
                    )

    def _name_axes(self, nodes: list[fx.Node], outs: list[fx.Node]) -> None:
        """Inputs' dimensions that are iterated, then outputs', then indexed dimensions, then the rest."""
        must = {self.axes.find(v) for v in self.axes.indexed}

        def claim(info: Info, *, indexed: bool | None = None) -> None:
            template = TEMPLATES.get(len(info.dims), "")
            for k, v in enumerate(info.dims):
                if v is None and indexed is False and k < len(template):
                    self.res.reserved.add(template[k])  # q[B, H, 1, D]: k's keys are j, not i
                if v is None or not self.res.is_axis(v):
                    continue
                if indexed is not None and (self.axes.find(v) in must) != indexed:
                    continue
                self.res.claim(v, template[k] if k < len(template) else None)

        placeholders = [self.infos[n] for n in nodes if n.op == "placeholder"]
        for info in placeholders:
            claim(info, indexed=False)
        for n in outs:
            claim(self.infos[n])
        for info in placeholders + [self.infos[n] for n in nodes if n.op == "get_attr"]:
            claim(info)
        for n in nodes:
            for part in _tensor_parts(self.infos[n]):
                claim(part)

    # ---------------------------------------------------------------- pass 2
    def _build(self, node: fx.Node) -> None:
        if node.op == "placeholder":
            decl = self.inputs[self._placeholder_index(node)]
            self.exprs[node] = self._load(decl.name, self.infos[node])
            return
        if node.op == "get_attr":
            name, value = self.constants[node.target]
            if _baked(value):
                self.exprs[node] = ir.Const(float(value.item()))
            else:
                self.exprs[node] = self._load(name, self.infos[node])
            return
        if node.target is operator.getitem:
            src, k = node.args
            self.exprs[node] = self.exprs[src][k]
            return
        call = self._call(node, pass2=True)
        self.exprs[node] = self._handler(node).build(self, call)

    def _load(self, name: str, info: Info) -> ir.Node:
        return ir.Load(name, tuple(self.res.index(v) for v in info.dims if v is not None))

    # helpers for handlers (pass 2)
    def dims(self, call: OpCall) -> tuple[Dim, ...]:
        return self.infos[call.node].dims

    def index(self, v: Dim) -> ir.Node:
        return self.res.index(v)

    def reduce(self, op: str, body: ir.Node, dims: list[Dim]) -> ir.Node:
        axes = [a for v in dims for a in self.res.axes(v)]
        return reduce_expr(op, body, axes, self.length)

    def single_axis(self, v: Dim, what: str) -> str:
        axes = self.res.axes(v)
        if len(axes) != 1:
            raise CaptureError(f"{what} over a dimension that is {len(axes)} program axes is not supported")
        return axes[0]

    @property
    def input_dtypes(self) -> dict[str, torch.dtype]:
        """The dtype of every program input (arguments and captured tensors)."""
        decls = {d.name: d.dtype for d in self.inputs}
        decls.update((name, value.dtype) for name, value in self.constants.values())
        return decls

    @property
    def int_tensors(self) -> set[str]:
        """Program inputs holding integers or booleans."""
        return {name for name, dt in self.input_dtypes.items() if not dt.is_floating_point}

    def check_index(self, c: OpCall, op: str, index: ir.Node, size: int, *, wraps: bool = False,
                    ignore: int | None = None, along: Dim | None = None) -> ir.Node:
        """`index` reads a dimension (`along`) of `size` elements for `op`: where it may leave the valid
        range [0, size) (or [-size, size) with `wraps`; `ignore` allowed too) a check runs on every
        call. Returns the index to read at: with `wraps`, negative values count from the end."""
        refuse_reduced_index(op, index)
        if arg_extreme_axis(index) is not None:  # (in range by construction: read as a one-hot selection)
            return index
        axes = self.res.axes(along) if along is not None else ()
        check = IndexCheck(op, location(c.node), index, size, wraps, ignore,
                           along=axes[0] if len(axes) == 1 else None)
        dtypes = {n: dtype_name(dt) for n, dt in self.input_dtypes.items()}
        at_run_time, negative = analyse(check, self.res.extents, dtypes)
        if not at_run_time and self.symbolic_lengths and not holds_at_every_length(check, self.res.extents, dtypes):
            at_run_time = True  # (proved at these lengths only: a check, so the axes it reads stay static)
        plain = replace(check, along=None)
        same = next((k for k, d in enumerate(self.checks) if replace(d, along=None) == plain), None)
        if at_run_time and same is None:
            self.checks.append(check)
        elif at_run_time and self.checks[same].along != check.along:  # (one index into two dimensions: a
            self.checks[same] = replace(check, along=None)              # size proved with neither moving)
        if wraps and negative:
            # t in [-n, n) (checked): (t + n) mod n is t + n for t < 0, t otherwise; the dividend is
            # never negative, so floor and truncating remainders (torch's, Triton's) agree
            index = call("mod", add(index, const(size)), const(size))
        return index

    def where(self, cond: ir.Node, a: ir.Node, b: ir.Node) -> ir.Node:
        return select(cond, a, b, self.int_tensors)

    def logical_not(self, x: ir.Node) -> ir.Node:
        flipped = negate(x, self.int_tensors)
        return call("not", x) if flipped is None else flipped

    def substitute(self, expr: ir.Node, mapping: dict[str, ir.Node]) -> ir.Node:
        return substitute(expr, mapping, self.res.fresh)

    def dsl(self, expr: ir.Node) -> dsl.Expr:
        """`expr` as a dsl.Expr, for the composites of neptune_eq.library."""
        if self._builder is None:
            self._builder = dsl.program(self.name)
        for a, n in self.res.extents.items():
            if a not in self._declared:
                self._builder.axis(a, n)
                self._declared.add(a)
        return dsl.Expr(self._builder, expr)

    # ---------------------------------------------------------------- assembly
    def _assemble(self, outs: list[fx.Node]) -> Translation:
        specs: dict[str, ir.TensorSpec] = {}

        def declare(name: str, info: Info) -> None:
            axes = tuple(self.res.name(v) for v in info.dims if v is not None)
            specs[name] = ir.TensorSpec(name, axes, dtype_name(info.dtype))

        for node in self.graph.nodes:
            if node.op == "placeholder" and node in self.infos:
                declare(self.inputs[self._placeholder_index(node)].name, self.infos[node])
            elif node.op == "get_attr" and node in self.infos:
                name, value = self.constants[node.target]
                if not _baked(value):
                    declare(name, self.infos[node])
        outputs = []
        for k, node in enumerate(outs):
            info = self.infos[node]
            try:
                axes = tuple(self.res.output_axes(info.dims))
            except CaptureError as e:
                raise located(e, location(node)) from None
            outputs.append(ir.Output(f"out{k}", axes, self.exprs[node], dtype_name(info.dtype)))
        used: set[str] = {a for s in specs.values() for a in s.axes}
        for o in outputs:
            used |= set(o.axes)
            for n in ir.walk(o.expr):
                if isinstance(n, ir.Index | ir.Reduce | ir.Length):
                    used.add(n.axis)
        axes = {a: n for a, n in self.res.extents.items() if a in used}
        program = ir.Program(self.name, axes, specs, outputs).validate().unshadowed()  # (Program.unshadowed)
        checks = tuple(replace(ch, program=index_program(ch.index, self.res.extents, specs)) for ch in self.checks)
        return Translation(program, [self.infos[n].shape for n in outs], [self.infos[n].dtype for n in outs], checks,
                           self.symbolic_extents(set(axes)))


def _baked(value: torch.Tensor) -> bool:
    """A 0-d tensor from fn's environment is a constant of the program (its value guarded), unless it
    requires grad: a learnable temperature or CLIP's logit scale is an input, so it gets its gradient."""
    return value.dim() == 0 and not value.requires_grad


def _tensor_parts(info) -> list[Info]:
    """The tensor values of one node's info (the translatable parts of a multi-output operation)."""
    return [part for part in (info if isinstance(info, tuple) else (info,)) if isinstance(part, Info)]


def _flat_outputs(out_node: fx.Node) -> list[fx.Node]:
    flat: list = []
    fx.node.map_aggregate(out_node.args[0], flat.append)
    for x in flat:
        if not isinstance(x, fx.Node):
            raise CaptureError(f"the function returns a non-tensor value {x!r}; return tensors only")
    return flat
