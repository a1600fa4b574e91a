"""Registration of the ``tpu`` device with PyTorch (PrivateUse1, renamed).

:func:`register` is idempotent and cheap (no JAX import): it renames PrivateUse1 to
``tpu``, generates the ``Tensor.tpu()`` / ``is_tpu`` / ``Module.tpu()`` methods, installs
the Python backend hooks and device guard, registers ``torch.tpu``
(:mod:`torchtpu._device.tpu_module`) and installs the boxed PrivateUse1 fallback kernel
that sends every ATen op to :func:`torchtpu.eager.executor.dispatch`.
"""

from __future__ import annotations

import torch

_registered = False
_libs = []


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    """PrivateUse1 hooks: availability for ``torch.accelerator``."""

    def is_available(self) -> bool:
        from torchtpu._device import runtime

        try:
            return runtime.device_count() > 0
        except RuntimeError:
            return False

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


_PRIVATEUSE1 = torch._C._autograd.DeviceType.PrivateUse1


class _Guard(torch._C._acc.DeviceGuard):
    # called from C++ for every autograd node and device guard: keep it a bare return
    def type_(self):
        return _PRIVATEUSE1


def _dispatch(keyset, op, *args, **kwargs):
    """First call: import the executor (and JAX), then route every op straight to it."""
    global _dispatch
    from torchtpu.eager import executor

    _dispatch = executor.dispatch
    return executor.dispatch(keyset, op, *args, **kwargs)


def _trampoline(keyset, op, *args, **kwargs):
    return _dispatch(keyset, op, *args, **kwargs)


def register() -> None:
    """Make ``tpu`` a PyTorch device (safe to call more than once)."""
    global _registered
    if _registered:
        return
    from torchtpu.eager import modes

    modes.load_from_environment()  # TORCHTPU_EAGER_MODE: before the first op; bad value raises
    _registered = True
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    from torchtpu._device import tpu_module

    if torch._C._get_privateuse1_backend_name() == "privateuseone":
        _setup_privateuseone_for_python_backend(
            rename="tpu", backend_module=tpu_module, hook=_Hooks(), device_guard=_Guard()
        )
    from torchtpu._tensor import native

    mod = native.load_if_built()  # never builds: ~ms when an earlier process built it
    if mod is None or not mod.register_fallback(_runner_named):
        # the Python fallback; a C++ one cannot replace it later in this process
        # (one fallback per dispatch key), the ops' own kernels can
        fallback = torch.library.Library("_", "IMPL")
        fallback.fallback(_trampoline, dispatch_key="PrivateUse1", with_keyset=True)
        _libs.append(fallback)
    _register_direct_kernels()
    from torchtpu._device import autocast, generator, state
    from torchtpu._tensor import native, patches, quantized, sparse

    state.set_guard_installer(native.install_device_guard)

    patches.install()
    quantized.install()
    sparse.install()
    generator.install()
    from torchtpu.eager import autograd as _autograd

    _autograd.install()
    autocast.register()
    from torchtpu.compile import routing

    routing.install()  # torch.compile graphs on tpu tensors -> backend "tpu"
    from torchtpu import integrations

    integrations.install()  # post-import hooks only: no third-party import here
    from torchtpu import distributed

    distributed.register()  # torch.distributed backend "tpu_dist" (no JAX import)


def _kernel_for(op):
    plan = None

    def kernel(keyset, *args, **kwargs):
        nonlocal plan
        if plan is None:
            from torchtpu.eager import executor

            plan = executor.plan_for(op)
        executor_metrics.ops_dispatched += 1
        return plan(args, kwargs)

    return kernel


# (name, OpOverload) of each op with its own PrivateUse1 kernel (_register_direct_kernels);
# the eager executor registers C++ kernels for the same ops once the C++ helper is loaded
DIRECT_KERNELS: list = []


def qualified_name(op) -> str:
    """An ``OpOverload``'s qualified name, ``"aten::add.Tensor"``, ``"aten::sum.default"``
    (how the C++ kernels know an op)."""
    return f"{op._schema.name}.{op._overloadname}"


def runner_for(op):
    """``run(args, kwargs, missed=None)``: ``op``'s executor plan (made at the first call)
    for a call that the C++ kernels (``_native.cpp``, "C++ op kernels") do not finish
    themselves.  ``missed``: the C++ hot path's ``(MISS, vals, hot)``, whose normalized,
    prepared ``vals`` the plan goes on from."""
    plan = None

    def run(args, kwargs, missed=None):
        nonlocal plan
        if plan is None:
            from torchtpu.eager import executor

            plan = executor.plan_for(op)
        if missed is not None and missed[1] is not None:  # only a LoweredPlan misses
            return plan.run_missed(missed[1], missed[2], args, kwargs)
        return plan(args, kwargs)

    return run


def _runner_named(qualified: str):
    """The C++ fallback's runner for an op it meets first (``"aten::add.out"``)."""
    ns, rest = qualified.split("::", 1)
    name, overload = rest.rsplit(".", 1)
    return runner_for(getattr(getattr(getattr(torch.ops, ns), name), overload))


def kernel_name(op) -> str:
    """The name an ATen ``OpOverload`` is registered under in an ``aten`` library
    (``"add.Tensor"``, ``"sum"`` for ``sum.default``)."""
    name = op._schema.name.split("::")[1]
    if op._overloadname != "default":
        name += "." + op._overloadname
    return name


def _register_direct_kernels() -> None:
    """Register each lowered op as its own PrivateUse1 kernel.

    Ops with a ``CompositeExplicitAutogradNonFunctional`` kernel (PyTorch's structured
    ops: add, mul, ...) would otherwise never reach the fallback as themselves: PyTorch
    would allocate an output through ``empty_strided`` and call ``add.out``, two trips
    through Python instead of one.  A direct kernel takes precedence over that path.
    """
    global executor_metrics
    from torchtpu import _metrics, ops

    executor_metrics = _metrics.METRICS
    lib = torch.library.Library("aten", "IMPL")
    _libs.append(lib)
    for op in ops.table():
        if op.namespace != "aten":
            # torchtpu's private ops (torchtpu_nn::*, torchtpu_attn::*) reach the executor
            # through the PrivateUse1 fallback
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(
            op.name(), "CompositeImplicitAutograd"
        ):
            continue  # never reaches a backend kernel
        name = kernel_name(op)
        lib.impl(name, _kernel_for(op), "PrivateUse1", with_keyset=True)
        DIRECT_KERNELS.append((name, op))
        # No direct kernel for its in-place twin (mul_ for mul): PyTorch's structured
        # in-place path (CompositeExplicitAutogradNonFunctional -> mul.out with self as
        # out) checks memory overlap between self and the inputs, as on CPU; a direct
        # kernel would skip that check (x[1:].add_(x[:-1]) must raise).
        # Except the list ops': PyTorch's kernel of ``_foreach_mul_`` for an out-of-tree
        # device loops over the list (one mul_ per tensor); ours is one executable, and
        # the executor runs that per-element kernel itself where the lists alias
        # (ops.foreach, overlap.foreach_in_order).
        if name.startswith("_foreach_"):
            pkt = getattr(torch.ops.aten, op._schema.name.split("::")[1] + "_", None)
            twin = getattr(pkt, op._overloadname, None) if pkt is not None else None
            if twin is not None and not torch._C._dispatch_has_kernel_for_dispatch_key(
                    twin.name(), "CompositeImplicitAutograd"):
                lib.impl(kernel_name(twin), _kernel_for(twin), "PrivateUse1",
                         with_keyset=True)
                DIRECT_KERNELS.append((kernel_name(twin), twin))
    # copy_: PyTorch's composite kernel re-dispatches a copy to an out-of-tree device as
    # `_copy_from(src, dst)`, whose `dst` is not marked as written in its schema, so the
    # Conjugate/Negative fallbacks hand us a resolved *clone* of a conj/neg-view `dst`
    # and the write is lost (`a.conj().add_(x)` writes back through copy_).  Our own
    # copy_ kernel sees the view with its bits and writes through them.
    lib.impl("copy_", _kernel_for(torch.ops.aten.copy_.default), "PrivateUse1",
             with_keyset=True)
    DIRECT_KERNELS.append(("copy_", torch.ops.aten.copy_.default))
    # mode.values (``torch.mode(..., out=)``) has a CompositeExplicitAutograd kernel that
    # refuses devices other than CPU, CUDA and XPU, so the PrivateUse1 fallback never sees
    # it: its own kernel runs the executor's out= plan derived from ``mode`` (a Python
    # kernel: not in DIRECT_KERNELS, which the C++ helper's kernels replace)
    lib.impl("mode.values", _kernel_for(torch.ops.aten.mode.values), "PrivateUse1",
             with_keyset=True)
    # Backward ops that PyTorch implements as CompositeImplicitAutograd (CPU and CUDA have
    # kernels of their own): decomposed, silu_backward allocates ``ones_like`` and writes
    # ``sub.out`` into it, five ops where the lowering is one (and the allocation's exact
    # shape keeps eager.padded's sequences from running it on their capacity).  Below
    # autograd (backward passes) the executor runs the lowering; where autograd must see
    # the op (a double backward) it runs PyTorch's decomposition, as before.
    for op in _IMPLICIT_LOWERED:
        if op in ops.table():
            lib.impl(kernel_name(op), _implicit_kernel(op), "AutogradPrivateUse1")


_IMPLICIT_LOWERED = (torch.ops.aten.silu_backward.default,)


def _implicit_kernel(op):
    """The AutogradPrivateUse1 kernel of a CompositeImplicitAutograd op with a lowering
    (see ``_register_direct_kernels``)."""
    plan = None

    def kernel(*args, **kwargs):
        nonlocal plan
        if torch.is_grad_enabled() and any(
                isinstance(a, torch.Tensor) and a.requires_grad for a in args) \
                or not all(_real_tpu(a) for a in args if isinstance(a, torch.Tensor)):
            # autograd must record it, or torch.compile is tracing (fake/functional
            # tensors): PyTorch's decomposition
            return op.decompose(*args, **kwargs)
        if plan is None:
            from torchtpu.eager import executor

            plan = executor.plan_for(op)
        executor_metrics.ops_dispatched += 1
        return plan(args, kwargs)

    return kernel


def _real_tpu(t) -> bool:
    """Whether ``t`` is a real ``tpu`` tensor (not a fake or functional wrapper)."""
    if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        return False
    try:
        return getattr(t.untyped_storage(), "_tpu", None) is not None
    except (RuntimeError, NotImplementedError):
        return False
