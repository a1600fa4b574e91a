"""JAX (and Pallas) functions as PyTorch operators: ``torchtpu.jax_op``.

``jax_op("mylib::rmsnorm", fn, static_argnames=("eps",))`` defines the ``torch.library``
operator ``mylib::rmsnorm`` and returns a callable that runs it.  The operator is a
first-class ATen-level op:

* **tpu tensors, every eager mode**: it has no backend kernel of its own; it reaches the
  ``tpu`` backend's boxed fallback like any ATen op, and its entry in the lowering table
  (``torchtpu.ops.LOWERINGS``) is ``fn`` itself.  So STRICT compiles it into one cached
  executable per signature (views of the inputs are read inside it), DEBUG waits for it,
  and DEFER_AND_FUSE records it into the pending segment, where XLA fuses it with its
  neighbours.
* **torch.compile**: the fake (meta) implementation comes from ``jax.eval_shape``, so
  Dynamo and AOTAutograd trace it as one graph node (no graph break), and the ``"tpu"``
  backend lowers that node through the same table, inline in the graph's executable.
* **autograd**: the backward is a second operator, ``<name>_jax_vjp``, whose lowering is
  ``jax.vjp`` of ``fn`` (which uses ``fn``'s own ``jax.custom_vjp`` rule when it has
  one).  The backward recomputes ``fn``'s forward inside the same executable (XLA fuses
  it; no residuals are kept between forward and backward).  Double backward works the
  same way, one level deeper.
* **cpu tensors** raise a ``RuntimeError`` naming the op, unless the op was made with
  ``allow_cpu=True``: then it runs ``fn`` on JAX's CPU device (copies in and out).

Operator schema: ``<name>(Tensor a, Tensor? b, ..., str static) -> Tensor[]`` with one
``Tensor`` per array parameter of ``fn`` (``Tensor?`` for a parameter defaulting to
``None``; ``Tensor?[] args`` for ``*args``).  The static (hashable) keyword arguments
travel as one string key ``static`` into a per-op table of their values, so each
distinct set of static values is its own executable signature, exactly as
``jax.jit(static_argnames=...)`` does.
"""

from __future__ import annotations

import inspect
import threading

import torch

from torchtpu._device import runtime
from torchtpu._metrics import METRICS as _M

__all__ = ["jax_op", "JaxOp"]

_LIBS: dict = {}  # namespace -> torch.library.Library (kept alive: it owns the registrations)
_OPS: dict = {}  # qualified name -> JaxOp
_lock = threading.Lock()


def _lib(ns: str):
    lib = _LIBS.get(ns)
    if lib is None:
        lib = _LIBS[ns] = torch.library.Library(ns, "FRAGMENT")
    return lib


def _is_floating(dtype) -> bool:
    import numpy as np

    return bool(runtime.jax().numpy.issubdtype(dtype, np.floating))


def _is_inexact(dtype) -> bool:
    import numpy as np

    jnp = runtime.jax().numpy
    return bool(jnp.issubdtype(dtype, np.inexact))


class _Params:
    """How ``fn``'s parameters map onto the operator's arguments."""

    def __init__(self, fn, static_argnames, list_mode):
        self.static = tuple(static_argnames or ())
        self.names = []  # array parameters, in order
        self.optional = []  # per array parameter: defaults to None
        self.varargs = None  # name of *args (arrays), if any
        self.positional_static = []  # static parameters that may come positionally
        sig = None
        if not list_mode:
            try:
                sig = inspect.signature(fn)
            except (TypeError, ValueError):
                sig = None
        self.list_mode = sig is None
        if sig is None:
            return
        P = inspect.Parameter
        for p in sig.parameters.values():
            if p.name in self.static:
                if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD):
                    self.positional_static.append(p.name)
                continue
            if p.kind is P.VAR_POSITIONAL:
                self.varargs = p.name
            elif p.kind is P.VAR_KEYWORD:
                continue
            elif p.kind is P.KEYWORD_ONLY:
                if p.default is P.empty:
                    raise TypeError(
                        f"torchtpu.jax_op: keyword-only parameter {p.name!r} of {fn!r} must be "
                        f"listed in static_argnames (array arguments are positional)")
            else:
                if self.positional_static:
                    raise TypeError(
                        f"torchtpu.jax_op: array parameter {p.name!r} of {fn!r} comes after "
                        f"static parameter {self.positional_static[-1]!r}; put static "
                        f"parameters last")
                if p.default is not P.empty and p.default is not None:
                    raise TypeError(
                        f"torchtpu.jax_op: parameter {p.name!r} of {fn!r} has default "
                        f"{p.default!r}: list it in static_argnames (a Python value) or give "
                        f"it no default (an array)")
                self.names.append(p.name)
                self.optional.append(p.default is None)
        if self.varargs is not None:
            self.list_mode = True
        unknown = [n for n in self.static if n not in sig.parameters and not any(
            p.kind is P.VAR_KEYWORD for p in sig.parameters.values())]
        if unknown:
            raise TypeError(f"torchtpu.jax_op: static_argnames {unknown} are not parameters "
                            f"of {fn!r}")

    def schema(self, name: str) -> str:
        if self.list_mode:
            args = "Tensor?[] args"
        else:
            args = ", ".join(("Tensor? " if opt else "Tensor ") + n
                             for n, opt in zip(self.names, self.optional))
            if not args:
                raise TypeError("torchtpu.jax_op: the function takes no array argument")
        return f"{name}({args}, str static) -> Tensor[]"


def _key_of(statics: dict) -> str:
    """The string key of a set of static values (their repr, sorted by name)."""
    if not statics:
        return ""
    return repr(sorted(statics.items()))


class JaxOp:
    """A JAX function registered as a ``torch.library`` operator (see :func:`jax_op`).

    Attributes:
        name: the qualified operator name (``"mylib::rmsnorm"``).
        fn: the JAX function.
        op: the ``torch._ops.OpOverload`` (``torch.ops.mylib.rmsnorm.default``).
        static_argnames: the static parameters of ``fn``.
        allow_cpu: cpu tensors run ``fn`` on JAX's CPU device instead of raising.
    """

    def __init__(self, name: str, fn, static_argnames=(), allow_cpu: bool = False,
                 _list_mode: bool = False, _grad_of=None):
        if not isinstance(name, str) or name.count("::") != 1 or not all(name.split("::")):
            raise ValueError(f"torchtpu.jax_op: name must be 'namespace::opname', got {name!r}")
        if not callable(fn):
            raise TypeError(f"torchtpu.jax_op: fn must be callable, got {fn!r}")
        if isinstance(static_argnames, str):
            static_argnames = (static_argnames,)
        ns, opname = name.split("::")
        if ns == "aten" or ns == "prim":
            raise ValueError(f"torchtpu.jax_op: choose your own namespace, not {ns!r}")
        self.name = name
        self.fn = fn
        self.static_argnames = tuple(static_argnames)
        self.allow_cpu = bool(allow_cpu)
        self._params = _Params(fn, self.static_argnames, _list_mode)
        self._statics = {"": {}}  # static key -> the static keyword values
        self._rebuild = {}  # static key -> how to build the result from the output list
        self._treedefs = {}  # static key -> output pytree structure
        self._cpu_fns = {}
        self._grad_of = _grad_of  # (forward JaxOp) when this is a backward op
        self._vjp_op = None
        with _lock:
            if name in _OPS or hasattr(getattr(torch.ops, ns), opname):
                raise RuntimeError(
                    f"torchtpu.jax_op: an operator named {name!r} is already defined in this "
                    f"process; pick another name")
            lib = _lib(ns)
            lib.define(self._params.schema(opname))
            self.op = getattr(getattr(torch.ops, ns), opname).default
            _OPS[name] = self
        torch.library.register_fake(name, self._fake, lib=lib)
        lib.impl(opname, self._cpu_kernel, "CPU")
        torch.library.register_autograd(name, self._backward, setup_context=self._setup_context,
                                        lib=lib)
        from torchtpu import ops as _ops

        _ops.lower(self.op)(self._lowering)  # the same table as ATen ops
        self._nfixed = len(self._params.names)
        self._fast_arity = None if self._params.list_mode else self._nfixed
        from torchtpu.eager import executor

        self._plan = executor.plan_for(self.op)
        if _grad_of is None:
            self._make_vjp_op()  # one level now (visible to tracing); deeper ones on demand

    def __repr__(self):
        return f"<torchtpu.jax_op {self.name} of {getattr(self.fn, '__name__', self.fn)!r}>"

    # ---------------------------------------------------------------- calling
    def __call__(self, *args, **kwargs):
        """Run the operator: ``args`` are tensors (one per array parameter of ``fn``),
        static parameters by keyword (or positionally, after the arrays).  Returns a
        tensor when ``fn`` returns one array, else the same structure with tensors."""
        if len(args) == self._fast_arity and (not kwargs or all(
                k in self.static_argnames for k in kwargs)):
            key = _intern(self, kwargs)
            tensors = args
            call = (*args, key)
        else:
            tensors, statics = self._bind(args, kwargs)
            key = _intern(self, statics)
            call = (tensors, key) if self._params.list_mode else (*tensors, key)
        how = _direct(tensors)
        if how == _PLAN:
            # nothing between the call and the tpu backend would act (no autograd
            # recording, mode, transform, tracer or subclass): the backend's kernel
            # directly, as the dispatcher would reach it, without its Python hops
            _M.ops_dispatched += 1
            out = self._plan(call, _NO_KW)
        elif how == _PLAN_GRAD:
            # the same with autograd recording: one autograd.Function around the
            # backend's kernel (the same setup and backward as the registered autograd
            # kernel, without its per-call pytree flattening of Tensor[] arguments)
            _M.ops_dispatched += 1
            out = _Function.apply(self, key, *(tensors if self._params.list_mode else args))
        else:
            out = self.op(*call)
        rebuild = self._rebuild.get(key)
        return tuple(out) if rebuild is None else rebuild(out)

    def _statics_of(self, key: str) -> dict:
        d = self._statics.get(key)
        if d is None:  # a key made elsewhere (e.g. a saved graph): literal values only
            import ast

            try:
                d = self._statics[key] = dict(ast.literal_eval(key))
            except (ValueError, SyntaxError):
                raise RuntimeError(f"torchtpu.jax_op {self.name}: unknown static key "
                                   f"{key!r}") from None
        return d

    def _intern(self, statics: dict) -> str:
        key = _key_of(statics)
        known = self._statics.get(key)
        if known is not None and known != statics:
            raise TypeError(
                f"torchtpu.jax_op {self.name}: static arguments {statics} and {known} have "
                f"the same repr but are not equal; static values are told apart by repr")
        if known is None:
            for k, v in statics.items():
                try:
                    hash(v)
                except TypeError:
                    raise TypeError(
                        f"torchtpu.jax_op {self.name}: static argument {k}={v!r} is not "
                        f"hashable (static arguments are compiled in, as jax.jit's "
                        f"static_argnames)") from None
            self._statics[key] = dict(statics)
        return key

    def _bind(self, args, kwargs):
        p = self._params
        statics = {}
        args = list(args)
        if p.list_mode and p.varargs is None:  # no signature: every positional is an array
            tensors = args
        else:
            n = p.varargs is None and len(p.names)
            if p.varargs is None and len(args) > n:
                extra = args[n:]
                if len(extra) > len(p.positional_static):
                    raise TypeError(f"{self.name}: takes {n} array argument(s) and "
                                    f"{len(p.positional_static)} static one(s), got "
                                    f"{len(args)} positional arguments")
                statics.update(zip(p.positional_static, extra))
                args = args[:n]
            fixed = list(args[: len(p.names)])
            for name in p.names[len(fixed):]:
                if name in kwargs:
                    fixed.append(kwargs.pop(name))
                elif p.optional[len(fixed)]:
                    fixed.append(None)
                else:
                    raise TypeError(f"{self.name}: missing array argument {name!r}")
            tensors = fixed + list(args[len(p.names):]) if p.varargs else fixed
        for k, v in kwargs.items():
            if k not in self.static_argnames and not (
                    k not in p.names and self._accepts_var_kw()):
                raise TypeError(f"{self.name}: unexpected keyword argument {k!r} (array "
                                f"arguments are positional; static ones are "
                                f"{list(self.static_argnames)})")
            statics[k] = v
        return tensors, statics

    def _accepts_var_kw(self) -> bool:
        try:
            return any(p.kind is inspect.Parameter.VAR_KEYWORD
                       for p in inspect.signature(self.fn).parameters.values())
        except (TypeError, ValueError):
            return False

    # ------------------------------------------------------- JAX-side helpers
    def _split(self, vals):
        """Operator arguments (schema order) -> (arrays, static key)."""
        if self._params.list_mode:
            return list(vals[0]), vals[1]
        return list(vals[:-1]), vals[-1]

    def _flat_call(self, arrays, key):
        """``fn(*arrays, **statics)`` with its outputs flattened; records their structure."""
        jax = runtime.jax()
        out = self.fn(*arrays, **self._statics_of(key))
        leaves, treedef = jax.tree_util.tree_flatten(out)
        for leaf in leaves:
            if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
                raise TypeError(
                    f"torchtpu.jax_op {self.name}: the function returned a "
                    f"{type(leaf).__name__} ({leaf!r}) in its outputs; every output must "
                    f"be a JAX array (wrap constants with jnp.asarray)")
        self._record_structure(key, treedef, len(leaves))
        return leaves

    def _record_structure(self, key, treedef, n):
        old = self._treedefs.get(key)
        if old is not None:
            if old != treedef:
                raise RuntimeError(
                    f"torchtpu.jax_op {self.name}: the function returned {treedef} for "
                    f"static arguments {self._statics[key]} after returning {old}; its "
                    f"output structure may depend only on its static arguments")
            return
        jax = runtime.jax()
        self._treedefs[key] = treedef
        if treedef == jax.tree_util.tree_structure(0):
            self._rebuild[key] = _first
        elif treedef == jax.tree_util.tree_structure((0,) * n):
            self._rebuild[key] = tuple
        elif treedef == jax.tree_util.tree_structure([0] * n):
            self._rebuild[key] = list
        else:
            self._rebuild[key] = lambda out, _t=treedef: jax.tree_util.tree_unflatten(_t, out)

    def _lowering(self, *vals):
        """The lowering-table entry: traced JAX arrays in, one array per output."""
        arrays, key = self._split(vals)
        return tuple(self._flat_call(arrays, key))

    def _fake(self, *vals):
        """Fake/meta implementation: output shapes and dtypes from ``jax.eval_shape``."""
        jax = runtime.jax()
        arrays, key = self._split(vals)
        device = next((t.device for t in arrays if t is not None), None)
        avals = [None if t is None else jax.ShapeDtypeStruct(
            tuple(int(s) for s in t.shape), runtime.to_np_dtype(t.dtype)) for t in arrays]
        outs = jax.eval_shape(lambda *a: self._flat_call(list(a), key), *avals)
        return [torch.empty(tuple(o.shape), dtype=runtime.to_torch_dtype(o.dtype), device=device)
                for o in outs]

    def _cpu_kernel(self, *vals):
        arrays, key = self._split(vals)
        if not self.allow_cpu:
            from torchtpu.eager.executor import describe

            raise RuntimeError(
                f"torchtpu.jax_op {self.name}: got cpu tensors ({describe(arrays)}); a "
                f"jax_op runs on tpu tensors (move them with .to('tpu')), or on JAX's CPU "
                f"device when made with jax_op(..., allow_cpu=True)")
        import numpy as np

        from torchtpu.eager import handlers

        jax = runtime.jax()
        cpu = jax.devices("cpu")[0]
        f = self._cpu_fns.get(key)
        if f is None:
            f = self._cpu_fns[key] = jax.jit(lambda *a: self._flat_call(list(a), key))
        ins = [None if t is None else jax.device_put(handlers.host_array(t), cpu)
               for t in arrays]
        outs = f(*ins)
        res = []
        for o in outs:
            dt = runtime.to_torch_dtype(o.dtype)
            host = np.asarray(o)
            bits = handlers._BITS_AS.get(dt)
            if bits is not None:
                t = torch.from_numpy(np.array(host.view(handlers.npdt_bits[bits]))).view(dt)
            else:
                t = torch.from_numpy(np.array(host, copy=True))
            res.append(t.reshape(o.shape))
        return res

    # ---------------------------------------------------------------- autograd
    def _setup_context(self, ctx, inputs, output):
        arrays, key = self._split(inputs)
        ctx.set_materialize_grads(False)  # unused outputs' gradients stay None
        ctx.key = key
        ctx.n = len(arrays)
        ctx.present = [t is not None for t in arrays]
        ctx.save_for_backward(*[t for t in arrays if t is not None])
        ctx.out_meta = [(o.shape, o.dtype, o.device) for o in output]

    def _backward(self, ctx, *grads):
        """The registered autograd formula (``torch.library.register_autograd``)."""
        out = self._input_grads(ctx, grads[0])  # grads[0]: the one Tensor[] output's
        if self._params.list_mode:
            return out, None
        return (*out, None)

    def _input_grads(self, ctx, grads):
        """One gradient (or None) per array input, from one (or None) per output."""
        saved = iter(ctx.saved_tensors)
        primals = [next(saved) if p else None for p in ctx.present]
        cts = []
        for g, (shape, dtype, device) in zip(grads, ctx.out_meta):
            if dtype.is_complex and g is not None:
                raise NotImplementedError(
                    f"torchtpu.jax_op {self.name}: backward through a complex output is not "
                    f"supported (JAX's and PyTorch's complex gradient conventions differ)")
            if not dtype.is_floating_point:
                continue  # integer/bool (and unused complex) outputs: zero cotangents
            cts.append(g if g is not None else torch.zeros(shape, dtype=dtype, device=device))
        for t in primals:
            if t is not None and t.dtype.is_complex and t.requires_grad:
                raise NotImplementedError(
                    f"torchtpu.jax_op {self.name}: gradients of complex inputs are not "
                    f"supported (JAX's and PyTorch's complex gradient conventions differ)")
        diff = [i for i, t in enumerate(primals) if t is not None and t.dtype.is_floating_point]
        vjp_op = self._make_vjp_op()
        res = vjp_op(*primals, *cts, key=ctx.key, n=ctx.n)
        if isinstance(res, torch.Tensor):
            res = (res,)
        out = [None] * ctx.n
        for i, g in zip(diff, res):
            out[i] = g
        return out

    def _make_vjp_op(self):
        op = self._vjp_op
        if op is None:
            with _lock:
                n = 0
                name = f"{self.name}_jax_vjp"
                ns, opname = name.split("::")
                while name in _OPS or hasattr(getattr(torch.ops, ns), opname):
                    n += 1
                    name = f"{self.name}_jax_vjp{n}"
                    opname = name.split("::")[1]
            fwd = self

            def vjp(*arrays, key, n):
                return fwd._vjp(arrays, key, n)

            vjp.__name__ = f"vjp_of_{getattr(self.fn, '__name__', 'fn')}"
            op = self._vjp_op = JaxOp(name, vjp, static_argnames=("key", "n"),
                                      allow_cpu=self.allow_cpu, _list_mode=True, _grad_of=self)
        return op

    def _vjp(self, arrays, key, n):
        """Traced: the gradients of ``fn``'s real floating inputs, given the primals
        ``arrays[:n]`` and one cotangent per real floating output ``arrays[n:]``."""
        jax = runtime.jax()
        import numpy as np

        primals, cts = list(arrays[:n]), list(arrays[n:])
        diff = [i for i, p in enumerate(primals) if p is not None and _is_floating(p.dtype)]

        def f(*d):
            full = list(primals)
            for i, v in zip(diff, d):
                full[i] = v
            return self._flat_call(full, key)

        outs, pullback = jax.vjp(f, *[primals[i] for i in diff])
        it = iter(cts)
        full_ct = []
        for o in outs:
            if _is_floating(o.dtype):
                full_ct.append(next(it).astype(o.dtype))
            elif _is_inexact(o.dtype):  # complex: no gradient flows from it
                full_ct.append(jax.numpy.zeros(o.shape, o.dtype))
            else:
                full_ct.append(np.zeros(o.shape, dtype=jax.dtypes.float0))
        grads = pullback(full_ct)
        return tuple(g.astype(primals[i].dtype) for i, g in zip(diff, grads))


def _intern(op: JaxOp, statics: dict) -> str:
    """The static key of ``statics`` for ``op`` (kept in its table).  Dynamo runs it at
    trace time and keeps the result as a constant (a side effect it would otherwise
    replay only after the graph, when the fake implementation needs the key already)."""
    return op._intern(statics)


_intern = torch.compiler.assume_constant_result(_intern)


_NO_KW: dict = {}
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_tracing_state = torch._C._get_tracing_state
_functorch_stack = torch._C._functorch.peek_interpreter_stack


_DISPATCHER, _PLAN, _PLAN_GRAD = 0, 1, 2


def _direct(tensors) -> int:
    """How a call with ``tensors`` runs: straight to the tpu backend's plan (``_PLAN``;
    ``_PLAN_GRAD`` when autograd must record it) for plain tpu tensors with no dispatch or
    function mode, functorch transform, JIT tracer or Dynamo trace that must see the
    operator; else through the dispatcher (``_DISPATCHER``)."""
    if _is_compiling() or _dispatch_modes() or _function_modes() or _tracing_state() \
            is not None or _functorch_stack() is not None:
        return _DISPATCHER
    grad = _grad_enabled()
    first = True
    how = _PLAN
    for t in tensors:
        if t is None:
            continue
        tt = type(t)
        if tt is not _Tensor and tt is not _Parameter:
            return _DISPATCHER
        if grad and t.requires_grad:
            how = _PLAN_GRAD
        if first:
            if t.device.type != "tpu":
                return _DISPATCHER
            first = False
    return _DISPATCHER if first else how


class _Function(torch.autograd.Function):
    """Eager autograd around a jax_op's backend kernel (see ``JaxOp.__call__``)."""

    @staticmethod
    def forward(ctx, jaxop, key, *tensors):
        call = (list(tensors), key) if jaxop._params.list_mode else (*tensors, key)
        out = jaxop._plan(call, _NO_KW)
        jaxop._setup_context(ctx, call, out)
        ctx.jaxop = jaxop
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *ctx.jaxop._input_grads(ctx, grads))


def _first(out):
    return out[0]


def jax_op(name: str, fn=None, *, static_argnames=(), allow_cpu: bool = False):
    """Make JAX function ``fn`` a PyTorch operator ``name`` that runs on ``tpu`` tensors.

    Usage::

        def rmsnorm(x, w, *, eps):                       # a JAX function of arrays
            return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + eps) * w

        op = torchtpu.jax_op("mylib::rmsnorm", rmsnorm, static_argnames=("eps",))
        y = op(x_tpu, w_tpu, eps=1e-6)                   # also torch.ops.mylib.rmsnorm

        @torchtpu.jax_op("mylib::gelu")                  # decorator form
        def gelu(x):
            return jax.nn.gelu(x)

    Args:
        name: ``"namespace::opname"``: the ``torch.library`` operator to define (the
            namespace is yours: not ``aten``).  Defining a name twice in one process raises.
        fn: a function of JAX arrays (positional parameters; ``*args`` allowed; a
            parameter defaulting to ``None`` is an optional tensor) and static keyword
            arguments, returning an array or a pytree (tuple, list, dict...) of arrays.
            It may use ``jax.numpy``, ``lax``, ``jax.custom_vjp`` and ``pl.pallas_call``
            (Pallas): anything ``jax.jit`` can trace.  Omit it for the decorator form.
        static_argnames: parameters of ``fn`` that are Python values (hashable, as
            ``jax.jit``'s ``static_argnames``), passed by keyword (or positionally after
            the arrays).  Keyword-only parameters without a default must be listed.
        allow_cpu: cpu tensors run ``fn`` on JAX's CPU device (inputs and outputs are
            copied between PyTorch's and JAX's memory) instead of raising.

    Returns:
        a :class:`JaxOp`: call it like ``fn`` with tensors in place of arrays; it returns a
        tensor for a single array, else ``fn``'s output structure with tensors.  Outputs
        are new contiguous tensors on the inputs' device (``tpu:N``, the index kept) with
        the shapes and dtypes ``jax.eval_shape`` gives (all PyTorch dtypes: ``int64`` /
        ``float64`` stay 64-bit, ``bfloat16``, ``bool``...).  ``op.op`` is the
        ``OpOverload``; ``torch.ops.<namespace>.<opname>`` takes the tensors and the
        string key of the static values and returns a ``list`` of tensors.

    Behaviour:
        * every eager mode (STRICT, DEBUG, DEFER_AND_FUSE, where it fuses into the
          pending segment), and inside ``torch.compile(backend="tpu")`` graphs as one node
          lowered inline (``fullgraph=True`` works);
        * autograd through ``jax.vjp(fn)`` (``fn``'s own ``jax.custom_vjp`` when it has
          one); gradients flow to floating-point inputs only (integer/bool inputs and
          outputs get none); the backward recomputes the forward inside its executable;
        * the output structure may depend only on the static arguments.

    Raises:
        ValueError: ``name`` is not ``"namespace::opname"`` or uses ``aten``.
        TypeError: ``fn``'s signature cannot be mapped (an array parameter with a
            non-``None`` default that is not static, a keyword-only parameter that is not
            static); at call time: a non-hashable static value, unknown keyword arguments.
        RuntimeError: ``name`` already defined; cpu tensors without ``allow_cpu=True``
            (the message names the op); inputs on different devices (PyTorch's message).
        NotImplementedError: backward through complex inputs or outputs (JAX and PyTorch
            differ in their complex gradient conventions).
    """
    if fn is None:
        return lambda f: JaxOp(name, f, static_argnames, allow_cpu)
    return JaxOp(name, fn, static_argnames, allow_cpu)
