"""A compiled program: the chosen plan, its kernels per target, and how to call and check it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property

import torch

from . import chunked, ir
from .grad import NoBackward
from .ir import NeptuneError
from .lower.launch import Launcher, check_inputs, input_specs, length_sources, load_module
from .lower.triton import write_module
from .lower.values import KernelSource
from .numeric import compute_dtype
from .pipeline import Alternative, Compilation, Options, compile_program
from .schedule import KernelSchedule
from .verify import VerifyReport, verify


def refuse_grad(program: ir.Program, needs: list[str]) -> None:
    """Raise NoBackward naming the inputs in `needs` (those that require grad while grad mode is on)."""
    if needs:
        raise NoBackward(
            f"{program.name}: input{'s' if len(needs) > 1 else ''} {', '.join(repr(n) for n in needs)} "
            f"require{'' if len(needs) > 1 else 's'} grad, and a compiled program runs its forward alone "
            "(neptune_eq.compile(fn, ...) and neptune_eq.attention derive the backward): the result would be "
            "cut from the autograd graph (a model would train wrongly), so the call is refused. Run it under "
            "torch.no_grad() or torch.inference_mode(), or pass the input .detach()ed if no gradient should "
            "flow to it")


def grad_needed(inputs: dict[str, torch.Tensor]) -> list[str]:
    """The inputs whose gradient autograd would ask for (grad mode on, requires_grad)."""
    if not torch.is_grad_enabled():
        return []
    return [n for n, t in inputs.items() if isinstance(t, torch.Tensor) and t.requires_grad]


@dataclass
class Kernel:
    """One generated kernel: its Triton source and the part of the plan it runs."""

    name: str
    source: str
    plan_kernel: object
    schedule: KernelSchedule

    def __repr__(self) -> str:
        return f"Kernel({self.name}, grid over {', '.join(self.plan_kernel.grid) or 'one program'})"


@dataclass
class CompiledProgram:
    compilation: Compilation
    choice: int = 0  # index into alternatives
    schedules: dict[str, list[KernelSchedule]] = field(default_factory=dict)  # per target, overrides
    _modules: dict = field(default_factory=dict)
    # program → CompiledProgram, for the chunk program (neptune_eq.api passes its cached compile)
    compile_fn: Callable[[ir.Program], CompiledProgram] | None = field(default=None, repr=False)

    # ---- what was chosen
    @property
    def program(self) -> ir.Program:
        return self.compilation.program

    @property
    def alternatives(self) -> list[Alternative]:
        return self.compilation.alternatives

    @property
    def alternative(self) -> Alternative:
        return self.alternatives[self.choice]

    @property
    def plan(self):
        return self.alternative.plan

    def pin(self, i: int) -> CompiledProgram:
        """The same compilation, running alternative i instead of the cost model's choice."""
        if not 0 <= i < len(self.alternatives):
            raise NeptuneError(f"no alternative {i}; there are {len(self.alternatives)}")
        return CompiledProgram(self.compilation, i, compile_fn=self.compile_fn)

    # ---- chunks
    @cached_property
    def chunking(self) -> chunked.Chunking | None:
        """How run() cuts the program into chunks of one axis, where the plan's intermediate buffers
        would pass Options.scratch_limit (None there: the largest input or output), else None."""
        return chunked.choose(self.program, self.plan, self.compilation.options.scratch_limit)

    @cached_property
    def chunk_compiled(self) -> CompiledProgram:
        """The compiled chunk program (compiled at first use)."""
        if self.chunking is None:
            raise NeptuneError(f"{self.program.name} runs whole, not in chunks")
        compile_fn = self.compile_fn or (lambda p: compile_ir(p, self.compilation.options))
        return compile_fn(self.chunking.program)

    def _aliases(self, c: chunked.Chunking) -> dict[str, str]:
        """The summed outputs the chunk plan may write over their accumulators (chunked.aliasable),
        worked out once per chunk plan, not per call."""
        plan = self.chunk_compiled.plan
        key = ("aliases", id(plan))
        if key not in self._modules:
            self._modules[key] = {o: a for o, a in c.accumulators.items() if chunked.aliasable(plan, c.program, o, a)}
        return self._modules[key]

    # ---- lowering
    def _schedules(self, target: str) -> list[KernelSchedule]:
        """The tuned schedules for `target` if any, else the plan's defaults."""
        return self.schedules.get(target) or list(self.alternative.schedules)

    @cached_property
    def _input_specs(self) -> tuple:
        return input_specs(self.program)

    @cached_property
    def _input_order(self) -> list[str]:
        return list(self.program.inputs)

    @cached_property
    def _length_sources(self) -> dict:
        return length_sources(self.program)

    @property
    def _prefix(self) -> str:
        return "nq_" + "".join(ch if ch.isalnum() else "_" for ch in self.program.name)

    def lowered(self, target: str = "cuda") -> tuple[str, list[KernelSource]]:
        key = ("src", target)
        if key not in self._modules:
            self._modules[key] = write_module(self.plan, self.program, self._schedules(target), target, self._prefix)
        return self._modules[key]

    @property
    def source(self) -> str:
        """The whole generated module (for the GPU)."""
        return self.lowered("cuda")[0]

    @property
    def kernels(self) -> list[Kernel]:
        _, ks = self.lowered("cuda")
        return [Kernel(k.name, k.source, pk, k.schedule) for k, pk in zip(ks, self.plan.kernels)]

    def launcher(self, target: str, tma: bool = True, wide: bool = False) -> Launcher:
        """The launcher of this plan's kernels for `target`; with tma=False every kernel reads its
        inputs through pointers (what a launcher falls back to for inputs a descriptor cannot read);
        with wide=True every offset is 64-bit (what it switches to for a view spanning more than 2^31
        elements: its strides are only known at the call)."""
        key = ("launch", target, tma, wide)
        if key not in self._modules:
            if tma and not wide:
                src, ks = self.lowered(target)
            else:
                scheds = [replace(s, tma=tma and s.tma, wide_index=wide or s.wide_index)
                          for s in self._schedules(target)]
                suffix = ("" if tma else "_ptr") + ("_wide" if wide else "")
                src, ks = write_module(self.plan, self.program, scheds, target, self._prefix + suffix)
            mod = load_module(src, self.compilation.options.cache_dir)
            fallback = (lambda: self.launcher(target, False, wide)) if tma and any(k.descriptors for k in ks) else None
            widened = None if all(k.schedule.wide_index for k in ks) else (lambda: self.launcher(target, tma, True))
            self._modules[key] = Launcher(self.program, self.plan, ks, mod, fallback, widened)
        return self._modules[key]

    # ---- running
    def run(self, inputs: dict[str, torch.Tensor], out_dtypes=None, into=None) -> dict[str, torch.Tensor]:
        """The outputs for `inputs` (all on one device: CUDA runs the compiled kernels, CPU Triton's
        interpreter). Raises NeptuneError naming the first input of the wrong dtype, shape or device,
        and NoBackward when an input requires grad (grad mode on): this runs the forward alone.
        `into`: output name → the tensor to write it into where its shape and dtype match (internal:
        a chunk's accumulators, chunked.run_chunked)."""
        refuse_grad(self.program, grad_needed(inputs))
        check_inputs(self.program, inputs, self._input_specs, self._length_sources)
        device = _one_device(inputs)
        if self.chunking is not None:
            c = self.chunking
            return chunked.run_chunked(c, self.chunk_compiled.run, inputs, self.program, out_dtypes,
                                       self._aliases(c))
        target = "cuda" if device.type == "cuda" else "interpreter"
        return self.launcher(target)(inputs, out_dtypes, into=into)

    def __call__(self, *args, **kwargs):
        names = list(self.program.inputs)
        if len(args) > len(names):
            raise NeptuneError(f"{self.program.name} takes {len(names)} inputs ({', '.join(names)}), got {len(args)}")
        inputs = dict(zip(names, args))
        for k, v in kwargs.items():
            if k in inputs:
                raise NeptuneError(f"input '{k}' given twice")
            inputs[k] = v
        outs = self.run(inputs)
        vals = [outs[o.name] for o in self.program.outputs]
        return vals[0] if len(vals) == 1 else tuple(vals)

    def verify(self, *, device: str = "cpu", sets=("normal",), seed: int | None = None,
               tolerance: float | None = None, dtypes: dict[str, str] | None = None) -> VerifyReport:
        """Run on fresh random inputs of each set in `sets` against float64 (see neptune_eq.verify):
        tolerance None holds each output to its dtype-aware default; every set counts in `passed`."""
        other = {k: v for k, v in (dtypes or {}).items() if k in self.program.inputs
                 and v != self.program.inputs[k].dtype}
        if other:  # the kernels take only the dtypes they were compiled for
            raise NeptuneError("verify(dtypes=...): this program was compiled for "
                               + ", ".join(f"{k}: {self.program.inputs[k].dtype}" for k in other)
                               + "; compile program.with_dtypes(...) to verify at "
                               + ", ".join(f"{k}: {v}" for k, v in other.items()))
        return verify(self.run, self.program, device=device, sets=sets, seed=seed, tolerance=tolerance,
                      dtypes=dtypes, compute=compute_dtype(self.program))

    # ---- explaining
    def explain(self) -> str:
        """The chosen plan and why: its structure, cost terms against the runner-up, the corrections used."""
        c = self.compilation
        alt = self.alternative
        lines = [f"program {self.program.name}: {len(self.alternatives)} alternatives, chose #{alt.id}: "
                 f"{alt.structure}", f"device model: {c.device.name}"]
        t = alt.cost.terms()
        lines.append("predicted: " + ", ".join(f"{k}={v:.3g}" for k, v in t.items()))
        if len(self.alternatives) > 1:
            other = self.alternatives[1 if alt.id == 0 else 0]
            ratio = other.cost.time / alt.cost.time if alt.cost.time else float("nan")
            lines.append(f"runner-up #{other.id}: {other.structure} — predicted {other.cost.time * 1e6:.1f} µs "
                         f"({ratio:.2f}× the chosen plan)")
        lines.append("derivation:")
        lines += [f"  {d}" for d in alt.plan.derivation] or ["  (no fusion rule applied)"]
        if self.chunking is not None:
            lines.append(f"memory: {self.chunking.describe()}")
        numerics = getattr(c, "numerics_notes", [])
        if numerics:
            lines.append("numerics (a stable spelling was preferred):")
            lines += [f"  {n}" for n in numerics]
        notes = getattr(c, "budget_notes", [])
        if notes:
            lines.append("budget hit (the search was cut short; the plans below are what it found):")
            lines += [f"  {n}" for n in notes]
        rejected = c.rejected_notes
        if rejected:
            lines.append("fusions not offered:")
            lines += [f"  {r}" for r in rejected[:6]]
        lines += [str(k) for k in alt.cost.kernels]
        return "\n".join(lines)


def _one_device(inputs: dict[str, torch.Tensor]) -> torch.device:
    """The device every input is on: CPU or CUDA (a meta tensor has no data to run on)."""
    names = iter(inputs)
    first = next(names, None)
    if first is None:
        raise NeptuneError("the program reads no tensor input (a function of constants alone): nothing to run "
                           "on a device; call the function itself")
    device = inputs[first].device
    if device.type not in ("cpu", "cuda"):
        raise NeptuneError(f"input '{first}' is on device '{device}'; programs run on CPU or CUDA tensors")
    for name in names:
        if inputs[name].device != device:
            raise NeptuneError(f"input '{name}' is on device '{inputs[name].device}' but input '{first}' is on "
                               f"'{device}'; pass every input on one device")
    return device


def compile_ir(program: ir.Program, options: Options | None = None, *, rules=()) -> CompiledProgram:
    """Compile `program`. `rules`: extra rewrite rules (rules-file paths or shipped names, Rule objects,
    egglog rewrites), checked for soundness first (rules/user.py) and added to options.rules."""
    return CompiledProgram(compile_program(program, with_user_rules(options or Options(), rules)))


def with_user_rules(options: Options, rules) -> Options:
    """`options` with the user `rules` (checked for soundness first: rules/user.py) added; refinements
    warn, or are rejected when options.strict_rules."""
    if rules is None or (isinstance(rules, list | tuple) and not rules):  # (rules=0 or {} is user_rules' error)
        return options
    from .rules.user import user_rules

    return replace(options, rules=(*options.rules, *user_rules(rules, strict=options.strict_rules)))
