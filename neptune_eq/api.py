"""The public entry points: plain PyTorch in, fused kernels out.

    prog = neptune_eq.compile(fn, *example_inputs, **options)
    out = prog(*inputs)     # same result as fn(*inputs): CUDA tensors run compiled Triton,
                            # CPU tensors run through Triton's interpreter
    prog.kernels            # the generated kernels; each has .source
    prog.alternatives       # ranked alternatives with predicted cost
    prog.explain()          # the chosen plan and why

    out = neptune_eq.attention(q, k, v, score_mod=None, mask_mod=None, enable_gqa=False)
                            # FlexAttention's calling convention; fully masked rows give 0

Calls with the example shapes, dtypes and device reuse the captured program without tracing again;
other shapes or dtypes are captured and compiled once more (each signature is compiled once).
What fn reads besides its arguments (globals, closures, a score_mod's captured values, module
attributes) is guarded: when it changes, the next call captures and compiles again. Shapes with a
zero-size dimension run fn itself (nothing to fuse). See neptune_eq.frontend.capture for the rest.
Inside torch.compile'd code the call becomes a torch.library custom op with a fake implementation,
so dynamo keeps it as one node; a call no eager call has compiled a signature for runs outside the graph
(neptune_eq.signatures). Compiles are cached by the program and options, in memory and on
disk (the cache directory: `cache_dir=` or ~/.cache/neptune_eq).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import torch

from . import ir
from .budget_notes import load_dependent
from .cache import CompileCache, key_of, snapshot
from .custom_ops import custom_op, dynamic_op
from .device import from_torch
from .ir import NeptuneError
from .lower.launch import default_cache_dir
from .pipeline import Options, compile_program
from .runtime import CompiledProgram, with_user_rules
from .signatures import autocast_state, matches, outside_the_graph, signature

_OPTION_FIELDS = {f.name for f in fields(Options)}
# Process-wide caches (not configuration): one compile cache per cache directory, compiled attention
# variants (the custom ops already registered: neptune_eq.custom_ops).
_CACHES: dict[str, CompileCache] = {}


def _cache_for(directory: Path | None) -> CompileCache:
    d = str(directory or default_cache_dir())
    if d not in _CACHES:
        _CACHES[d] = CompileCache(Path(d))
    return _CACHES[d]


def _options(rules, kw) -> Options:
    unknown = set(kw) - _OPTION_FIELDS
    if unknown:
        raise NeptuneError(f"unknown option(s) {sorted(unknown)}; known: {sorted(_OPTION_FIELDS)}")
    return with_user_rules(Options(**kw), rules)


@dataclass
class Stats:
    """What a compiled function has done (Compiled.stats()): a new length or dtype is a new signature,
    captured and compiled again (or found in the compile cache)."""

    captures: int = 0  # traces of fn: a new signature, or its environment changed
    compiles: int = 0  # programs searched and lowered (compile-cache misses), backward programs included
    cache_hits: int = 0  # programs found in the compile cache
    calls: int = 0  # calls from Python (a torch.compile'd graph runs the op without Python: not counted)

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


def compile_cached(program: ir.Program, options: Options, cache: CompileCache,
                   stats: Stats | None = None) -> CompiledProgram:
    """The ranked plans of `program`, from the cache or a fresh compile (which is then cached)."""
    device = options.device or from_torch()
    options = replace(options, device=device, cache_dir=cache.directory)  # kernel modules and tuning go there too
    key = key_of(program, options, device)
    hit = cache.get(key)
    if hit is None:
        c = compile_program(program, options)
        hit = snapshot(c)
        cache.put(key, hit, durable=not load_dependent(c))
        if stats is not None:
            stats.compiles += 1
    elif stats is not None:
        stats.cache_hits += 1
    return CompiledProgram(hit, compile_fn=lambda p: compile_cached(p, options, cache, stats))


@dataclass
class _Variant:
    """One signature of a compiled function: the capture running its program (re-captured when fn's
    environment changes), and the custom op running the same program for calls traced by dynamo."""

    run: object  # frontend.compiled.CompiledFunction
    compile_fn: object = None  # program → CompiledProgram (cached): re-captures and the backward
    op: object = None
    _op_of: object = field(default=None, repr=False)  # the CompiledProgram `op` runs

    @classmethod
    def of(cls, captured, prog: CompiledProgram, options: Options, cache: CompileCache,
           stats: Stats | None = None) -> _Variant:
        from .frontend.compiled import CompiledFunction  # the frontend loads on first use, not at import

        compile_fn = lambda program: compile_cached(program, options, cache, stats)  # noqa: E731
        return cls(CompiledFunction(captured, prog, recompile=compile_fn), compile_fn)._with_op()

    def _with_op(self) -> _Variant:
        if self._op_of is not self.run.compiled:  # (re)built outside dynamo: registering an op cannot be traced
            self.op = custom_op(self.captured.program, self.captured.output_dtypes, self.run.compiled,
                                 self.compile_fn)
            self._op_of = self.run.compiled
        return self

    @property
    def captured(self):
        return self.run.captured

    @property
    def prog(self) -> CompiledProgram:
        return self.run.compiled

    def __call__(self, args):
        if torch.compiler.is_compiling():
            # the same checks as a plain call, the kernels as one custom op
            return self.captured.call_with(self.op, args)
        if self.captured.needs_grad(args):  # through the op, whose autograd runs the derived backward
            self.run.follow_environment(args)
            self._with_op()
            return self.captured.call_with(self.op, args, checks=getattr(self.run, "_run_checks", None))
        out = self.run(*args)
        self._with_op()
        return out


@dataclass
class Compiled:
    """A plain PyTorch function compiled by neptune_eq (see the module docstring)."""

    fn: object
    options: Options
    cache: CompileCache
    variants: dict[tuple, _Variant] = field(default_factory=dict)  # by signature (signatures.signature)
    first: tuple | None = None
    counts: Stats = field(default_factory=Stats)
    dynamic: object = None  # compile(dynamic=...): True or {argument index: [dimensions]}
    family: object = None  # frontend.dynamic.DynamicFunction serving every length of the dynamic axes
    # which dimensions had length 1 in the calls whose capture found no dimension that can change (a
    # later call is captured again for its family only where a dimension of length 1 became longer)
    _static_patterns: set = field(default_factory=set, repr=False)

    def stats(self) -> dict[str, int]:
        """{'captures', 'compiles', 'cache_hits', 'calls', 'signatures'}: e.g. whether a call at a new
        length captured and compiled again (today every new shape does; issue 14)."""
        return self.counts.as_dict() | {"signatures": len(self.variants)}

    # ---- the example signature's program (what the attributes describe)
    def _variant(self, args):
        sig = signature(args)
        got = self.variants.get(sig)
        return got if got is not None else self._new_variant(args, sig)

    # (capturing runs make_fx, compiling runs egglog and registers ops: never in frames dynamo converts.
    # A call dynamo runs eagerly inside a torch.compile'd region, after it gave up on Compiled.__call__,
    # had its capture's frames converted one by one: a functorch internal assert, session 51)
    @torch.compiler.disable
    def _new_variant(self, args, sig):
        from .frontend import capture
        from .frontend.capture import ZeroSizeCapture
        from .frontend.compiled import EagerFunction

        try:
            captured = capture(self.fn, *args)
        except ZeroSizeCapture:
            got = self.variants[sig] = EagerFunction(self.fn)
            return got
        finally:
            self.counts.captures += 1
        prog = compile_cached(captured.program, self.options, self.cache, self.counts)
        got = self.variants[sig] = _Variant.of(captured, prog, self.options, self.cache, self.counts)
        if self.first is None:
            self.first = sig
        return got

    def _family_for(self, args):
        """The dynamic function serving `args`, built (captured, its lengths resolved) on first use."""
        if self.dynamic is None or self.dynamic is False:
            return None
        if self.family is not None:
            return self.family
        pattern = tuple(tuple(n == 1 for n in a.shape) for a in args if isinstance(a, torch.Tensor))
        if pattern in self._static_patterns:  # (captured once: every dimension stays static)
            return None
        return self._new_family(args, pattern)

    @torch.compiler.disable  # (as _new_variant)
    def _new_family(self, args, pattern: tuple):
        from .frontend import capture  # (imported here, not per call: a call's host time counts)
        from .frontend.capture import ZeroSizeCapture
        from .frontend.dynamic import DynamicFunction, example_signature, resolve
        from .frontend.offsets import pad
        from .train_dynamic import register

        try:
            captured = capture(self.fn, *args, merge=False, symbolic_lengths=True)
        except ZeroSizeCapture:
            return None
        finally:
            self.counts.captures += 1
        lengths = resolve(captured, self.dynamic, args, self.counts)
        if not lengths.groups:
            self._static_patterns.add(pattern)
            return None
        captured = pad(captured, lengths.offsets)  # (an axis shorter than a dynamic one by a constant: padded)
        compile_fn = lambda program: compile_cached(program, self.options, self.cache, self.counts)  # noqa: E731
        self.family = DynamicFunction(captured, lengths, compile_fn, example_signature(args),
                                      training_op=lambda program, prog, fn: custom_op(
                                          program, captured.output_dtypes, prog, fn),
                                      autocast=autocast_state(args))
        self.family.op = dynamic_op(self.family)
        register(self.family)
        return self.family

    def _first(self) -> _Variant:
        if self.first is None and self.family is not None:
            return self.family
        if self.first is None:
            raise NeptuneError("nothing was compiled: every signature seen so far has a zero-size dimension "
                               "(the function itself runs for those)")
        return self.variants[self.first]

    @property
    def captured(self):
        return self._first().captured

    @property
    def program(self) -> CompiledProgram:
        return self._first().prog

    @property
    def kernels(self):
        return self.program.kernels

    @property
    def alternatives(self):
        return self.program.alternatives

    @property
    def source(self) -> str:
        return self.program.source

    def explain(self) -> str:
        """The chosen plan, its runners-up and derivation; once a call needed gradients, also which
        backward was chosen (what the forward saves) and the alternative's prediction."""
        from .autograd import training_report

        first = self._first()
        report = training_report(first.trained_op() if self.family is first else first.op.qualname)
        lengths = self.family.describe() if self.family is not None else ""
        return self.program.explain() + "".join(f"\n{t}" for t in (lengths, report) if t)

    def verify(self, **kw):
        return self.program.verify(**kw)

    def library_ops(self) -> dict[str, object]:
        """The torch.library ops the example signature's calls run (for torch.library.opcheck; each
        takes the program's input tensors as one list): 'inference', and 'training' where a backward
        was derived (it returns the outputs, then the statistics its backward may read)."""
        from .autograd import training_op_name

        qualname = self._first().op.qualname
        ns, name = qualname.split("::")
        lib = getattr(torch.ops, ns)
        ops = {"inference": getattr(lib, name).default}
        train = training_op_name(qualname)
        if train is not None:
            ops["training"] = getattr(lib, train.split("::")[1]).default
        return ops

    def tune(self, *args, candidates: int = 3, progress: bool = True) -> Compiled:
        """Measure on the GPU at `args` (CUDA tensors): time the cost model's `candidates` best plans
        and the best-ranked plans of up to six other split-K choices (tune.tuning_candidates), each
        first checked on the stress sets against float64 (a plan over tolerance is never kept); keep
        the fastest, then autotune its kernels' tiles, warps and stages (cached on disk under the cache
        directory). Later calls with this signature run the tuned kernels. With `dynamic=`, the plan
        of the lengths' range of their bucket is tuned and runs for that range (frontend/buckets.py).
        When an argument requires grad, the kernels of training calls are tuned too: the training
        forward and the chosen backward (fed random cotangents). Returns self."""
        from .autograd import tune_training
        from .tune import autotune, cache_path, choose_plan

        if not torch.cuda.is_available() or not all(a.is_cuda for a in args if isinstance(a, torch.Tensor)):
            raise NeptuneError("tune() times kernels on the GPU: it needs CUDA tensors (this call has none, "
                               "or there is no CUDA device)")
        family = self._family_for(args)
        ns = family.serves(args) if family is not None else None
        if ns is not None and family.trains(args):
            # a dynamic compile: the plan of these lengths' range of their bucket, timed at them
            inputs = {n: x.detach() for n, x in family.inputs(args, ns).items()}
            base = family.program_for(ns)
            best = choose_plan(base, inputs, candidates=candidates, progress=progress)
            best = base.pin(base.choice) if best is base else best  # its own schedules, not the bucket's
            autotune(best, inputs, progress=progress, cache_file=cache_path(self.cache.directory))
            family.tuned(ns, best)
            wrt = {n for n, x in family.inputs(args, ns, cached=False).items() if x.requires_grad}
            if wrt:  # the bucket's training forward and chosen backward, at these lengths
                tune_training(family.bucket_training(ns).qualname, inputs, lambda compiled, feed: autotune(
                    compiled, feed, progress=progress, cache_file=cache_path(self.cache.directory)), wrt)
            return self
        variant = self._variant(args)
        if not isinstance(variant, _Variant):
            raise NeptuneError("tune(): these shapes have a zero-size dimension; nothing is compiled for them")
        inputs = {n: x.detach() for n, x in variant.captured.inputs(*args).items()}
        best = choose_plan(variant.prog, inputs, candidates=candidates, progress=progress)
        autotune(best, inputs, progress=progress, cache_file=cache_path(self.cache.directory))
        tuned = self.variants[signature(args)] = _Variant.of(variant.captured, best, self.options, self.cache,
                                                              self.counts)
        wrt = {n for n, x in variant.captured.inputs(*args).items() if x.requires_grad}
        if wrt:
            tune_training(tuned.op.qualname, inputs, lambda compiled, feed: autotune(
                compiled, feed, progress=progress, cache_file=cache_path(self.cache.directory)), wrt)
        return self

    # ---- calling
    def _traced(self, args):
        """A call dynamo traces: tensor reshapes and one custom op built by an eager call (capturing
        and registering an op cannot be traced). The dynamic function's op where it serves the call
        (same dtypes, static values and specialised dimensions; a call needing gradients, its training
        op over every bucket), else the op of the signature an eager call compiled; with neither, the
        call runs outside the graph (an eager call, which compiles its signature). Until session 51
        every traced call took the first signature's op: another shape was refused (CaptureError; under
        fullgraph=True a dynamo crash), a dynamic function's op ran with another static value's
        constants (silently wrong) and crashed in training (its op had no backward)."""
        family = self.family
        if family is not None and family.traceable(args):
            return family.traced(args, family.op)
        for sig, variant in self.variants.items():
            if matches(sig, args):
                return variant(args)
        return outside_the_graph(self, args)

    def _positional(self, args: tuple, kwargs: dict) -> tuple:
        from .frontend.signature import positional_args

        return positional_args(self.fn, args, kwargs)

    def __call__(self, *args, **kwargs):
        if kwargs:
            args = self._positional(args, kwargs)
        if torch.compiler.is_compiling():
            return self._traced(args)
        _plain(args)
        family = self._family_for(args)
        ns = family.serves(args) if family is not None else None
        if ns is not None and family.trains(args):
            from .frontend.capture import StaleCapture
            from .frontend.dynamic import StaticTraining

            self.counts.calls += 1
            try:
                return family(args, ns)
            except StaleCapture:  # fn's environment changed: capture and resolve its lengths again
                self.family = None
                family = self._family_for(args)
                if family is not None and family.serves(args) is not None and family.trains(args):
                    return family(args, ns)
                self.counts.calls -= 1
            except StaticTraining:  # no backward for every length: this call compiles for its own
                self.counts.calls -= 1
        variant = self._variant(args)
        before = getattr(variant, "captured", None)
        out = variant(args)
        if getattr(variant, "captured", None) is not before:  # fn's environment changed: captured again
            self.counts.captures += 1
        self.counts.calls += 1
        return out


def _plain(args) -> None:
    """Refuse tensors a torch.func transform wraps (vmap's batched tensors, grad's and jacrev's tracked
    ones): the kernels read storage those have none of (vmap stopped inside Triton's launcher) and the
    training op has no functorch rule (torch.func.grad raised about setup_context)."""
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    for k, a in enumerate(args):
        if isinstance(a, torch.Tensor) and wrapped(a):
            raise NeptuneError(f"argument {k} is a tensor of a torch.func transform (vmap, grad, jacrev, ...), which "
                               "compiled functions do not support: call it on plain tensors, with torch.autograd "
                               "for gradients and a batch dimension for vmap")


def compile(fn, *example_inputs, rules=(), cache_dir: str | Path | None = None, dynamic=None,
            **options) -> Compiled:
    """Capture `fn` at the example inputs, search its fused plans and return a callable like `fn`.

    `options` are the fields of neptune_eq.pipeline.Options (budget, split_factors, device, ...);
    `rules` adds user rewrite rules (files, Rule objects or egglog rewrites; checked for soundness).
    An ir.Program may be passed instead of a function (then without example inputs).
    `dynamic=True` serves every length of every dimension that can change (one compile per bucket of
    lengths; see neptune_eq.frontend.dynamic), `dynamic={argument index: [dimensions]}` those named.
    """
    opts = _options(rules, options)
    cache = _cache_for(Path(cache_dir) if cache_dir else None)
    if isinstance(fn, ir.Program):
        if example_inputs:
            raise NeptuneError("compile(program) takes no example inputs: the program fixes its shapes")
        return compile_cached(fn, opts, cache)
    if not callable(fn):
        raise NeptuneError(f"compile() needs a function or an ir.Program, got {type(fn).__name__}")
    out = Compiled(fn, opts, cache, dynamic=dynamic)
    if out._family_for(example_inputs) is None:
        out._variant(example_inputs)
    else:
        _ = out.family.prog  # the example's bucket, compiled now
    return out


_ATTENTION: dict[tuple, _Variant] = {}  # (mods, signature, options) → neptune_eq.attention's variant
_ATTENTION_DYNAMIC: dict[tuple, Compiled] = {}  # (mods, head dims, dtype, options) → a dynamic compile


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, score_mod=None, mask_mod=None,
              enable_gqa: bool = False, scale: float | torch.Tensor | None = None, *, return_lse: bool = False,
              cache_dir=None, dynamic=None, **options):
    """FlexAttention-compatible attention: `score_mod(score, b, h, q_idx, kv_idx)` rewrites the
    scaled score, `mask_mod(b, h, q_idx, kv_idx)` keeps a pair when True. q is [B, Hq, L, D], k and v
    [B, Hkv, S, D] (Hkv may divide Hq with enable_gqa=True). A query row with no kept key gives 0.
    With return_lse=True the result is (out, lse), lse [B, Hq, L] float32 the natural log-sum-exp of
    each row's modified, masked scores (-inf for a row with no kept key), computed by the same
    kernels (the e-graph shares the row max and sum between the two outputs). `dynamic=True` (or
    {argument: [dimensions]}, as neptune_eq.compile takes it) serves every length from one compile
    per bucket, gradients included; the head dimensions stay specialised."""
    from .frontend import attention_capture
    from .frontend.capture import ZeroSizeCapture
    from .frontend.compiled import EagerFunction
    from .frontend.flex import attention_function, tensor_scale

    if isinstance(scale, torch.Tensor):  # (read at every call, and learnable: a captured tensor of score_mod)
        score_mod, scale = tensor_scale(score_mod, scale), 1.0
    if dynamic:
        key = (score_mod, mask_mod, enable_gqa, scale, return_lse, repr(dynamic), q.dim(), q.shape[-1], v.shape[-1],
               q.dtype, k.dtype, v.dtype, q.device.type, repr(sorted(options.items())), str(cache_dir))
        got = _ATTENTION_DYNAMIC.get(key)
        if got is None:
            if torch.compiler.is_compiling():
                raise NeptuneError("neptune_eq.attention: call it once outside torch.compile with these modifiers "
                                   "first (capturing cannot run while dynamo traces)")
            fn = attention_function(q, k, v, score_mod, mask_mod, enable_gqa, scale, return_lse)
            got = _ATTENTION_DYNAMIC[key] = compile(fn, q, k, v, cache_dir=cache_dir, dynamic=dynamic, **options)
        return got(q, k, v)
    key = (score_mod, mask_mod, enable_gqa, scale, return_lse, signature((q, k, v)), repr(sorted(options.items())),
           str(cache_dir))
    got = _ATTENTION.get(key)
    if got is None:
        if torch.compiler.is_compiling():
            raise NeptuneError("neptune_eq.attention: call it once outside torch.compile with these shapes, "
                               "dtypes and modifiers first (capturing cannot run while dynamo traces)")
        try:
            captured = attention_capture(q, k, v, score_mod=score_mod, mask_mod=mask_mod, enable_gqa=enable_gqa,
                                         scale=scale, return_lse=return_lse)
        except ZeroSizeCapture:
            got = _ATTENTION[key] = EagerFunction(attention_function(q, k, v, score_mod, mask_mod, enable_gqa,
                                                                     scale, return_lse))
            return got((q, k, v))
        opts, cache = _options((), options), _cache_for(Path(cache_dir) if cache_dir else None)
        got = _ATTENTION[key] = _Variant.of(captured, compile_cached(captured.program, opts, cache), opts, cache)
    return got((q, k, v))
