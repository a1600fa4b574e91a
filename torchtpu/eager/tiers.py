"""Two compile tiers for the per-op executables of STRICT and DEBUG modes.

A program that runs each signature once (a test looping over 500 shapes, a model's
first step) pays XLA's full optimizing compile for code that never runs again.  So
the first use of a signature compiles at a *quick* tier (XLA options that compile
faster without changing results), and the second use recompiles it at the default, fully
optimized tier ("tier up"), which every later call uses.  A signature used once costs
one quick compile; a signature in a loop costs one quick and one full compile, and
from its second call on it runs exactly the code it ran before this module existed.

Measured on the CPU PJRT platform (jax 0.10.2, 2 cores, process CPU time per compile):
``abs`` of f64[n] 43 -> 18 ms, ``cumsum`` 206 -> 116 ms, a threefry ``uniform`` 443 ->
290 ms; the quick executables' run time was the same for these small ops.

DeferAndFuse segments are not tiered: they are built for loops that repeat them, where
a quick compile would only add a second compile (and a training loop would reach its
steady state one step later).

The quick options should not change results: on CPU, the legacy (non-MLIR) fusion
emitters gave bitwise-equal results on sampling, transcendental and reduction probes,
while ``xla_backend_optimization_level=0`` did not (FMA contraction), so it is not used.
The every-sample sweep of ``tests/test_elementwise_options.py`` found exceptions since:
``tan`` (float32), ``mvlgamma`` (float64), ``xlogy`` (int32) and complex products may
differ in the last bit, so under the (opt-in) quick tier those ops can give a first call
one ulp away from later calls.

Element-wise options (:func:`elementwise_options`): separately from the tiers, ops made
of exactly rounded operations (arithmetic, comparisons, copies, casts, ``cat``...)
compile at the full tier with the legacy emitters too, which cannot change their results:
about half the compile time for the most frequent executables of a model's first step.

Only platforms with known quick options have a quick tier (today: ``cpu``); elsewhere
every signature compiles once, at the default tier.

The quick tier is **opt-in** (``TORCHTPU_COMPILE_TIERS=1`` or :func:`set_enabled`): a
user's program repeats its signatures (training steps, decoding), where the quick tier
only adds a second compile before the steady state; workloads that run most signatures
once (PyTorch's device-generic test files, shape sweeps) turn it on.

Counters (``torchtpu.metrics()``): ``compiles`` / ``compile_seconds`` count every XLA
compilation of either tier; ``quick_compiles`` / ``quick_compile_seconds`` the
quick-tier ones; ``tier_ups`` / ``tier_up_seconds`` the recompiles at the full tier.
"""

from __future__ import annotations

import contextlib
import os
import time

import torch

from torchtpu import _metrics
from torchtpu._device import persistent_cache, runtime

M = _metrics.METRICS

# XLA options of the quick tier, per PJRT platform.  On CPU, the MLIR fusion emitters
# are about half of a small executable's compile time.
_QUICK_OPTIONS = {
    "cpu": {"xla_cpu_use_fusion_emitters": False},
}

# XLA options for the executables of element-wise ops (``elementwise_options``), per
# PJRT platform.  On CPU, XLA's MLIR fusion emitters cost ~30-60 ms per small program for
# loops the legacy emitters compile in half the time, to code that runs as fast:
# measured (jax 0.10.2, 2 cores, f32[4,L,128] programs, median of 6 shapes) ``mul`` 64 ->
# 31 ms, ``silu`` 46 -> 31 ms, ``pow`` 63 -> 29 ms, ``sin(x)+exp(x)`` 64 -> 35 ms; a
# ``log_softmax`` compiled slower (67 -> 100 ms), so reductions keep the default.
_ELEMENTWISE_OPTIONS = {
    "cpu": {"xla_cpu_use_fusion_emitters": False},
}
# ops whose lowerings are made of operations IEEE 754 rounds exactly (arithmetic, square
# root, comparisons, selections, copies, casts, fills, concatenation): their code cannot
# round differently under other emitters.  Transcendental functions are left out: the
# emitters' approximations differ (measured over every sample of every element-wise
# OpInfo: ``tan`` float32 119 of 400 values, ``mvlgamma`` float64, ``xlogy`` int32)
_ELEMENTWISE_NAMES = frozenset({
    "aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::rsub", "aten::mul",
    "aten::mul_", "aten::div", "aten::div_", "aten::true_divide", "aten::neg",
    "aten::neg_", "aten::abs", "aten::abs_", "aten::reciprocal", "aten::sqrt",
    "aten::maximum", "aten::minimum", "aten::clamp", "aten::clamp_", "aten::clamp_min",
    "aten::clamp_max", "aten::where", "aten::masked_fill", "aten::masked_fill_",
    "aten::eq", "aten::ne", "aten::lt", "aten::le", "aten::gt", "aten::ge",
    "aten::logical_not", "aten::logical_and", "aten::logical_or", "aten::bitwise_not",
    "aten::bitwise_and", "aten::bitwise_or", "aten::bitwise_xor", "aten::floor",
    "aten::ceil", "aten::trunc", "aten::round", "aten::sign", "aten::addcmul",
    "aten::addcmul_", "aten::addcdiv", "aten::addcdiv_",
    "aten::clone", "aten::copy_", "aten::copy", "aten::_to_copy", "aten::fill_",
    "aten::fill", "aten::zeros", "aten::ones", "aten::full", "aten::zeros_like",
    "aten::ones_like", "aten::full_like", "aten::cat", "aten::constant_pad_nd",
    "aten::arange",
})
_elementwise_default = os.environ.get("TORCHTPU_ELEMENTWISE_OPTIONS", "1") not in ("0", "")
_elementwise_on = _elementwise_default
_ELEMENTWISE_OPS: dict = {}  # op -> options or None

_NO_BYPASS = contextlib.nullcontext()
_enabled = os.environ.get("TORCHTPU_COMPILE_TIERS", "0") not in ("0", "")
_options = False  # not looked up yet


def platform_has_quick_tier() -> bool:
    """Whether this process's PJRT platform has known quick-tier options."""
    return runtime.platform() in _QUICK_OPTIONS


def quick_options():
    """The quick tier's XLA compiler options for this process's platform, or None when
    there is no quick tier (switched off, the default, or an unknown platform)."""
    global _options
    if _options is False:
        _options = _QUICK_OPTIONS.get(runtime.platform()) if _enabled else None
    return _options


def set_enabled(enabled: bool) -> None:
    """Switch the quick tier on (where the platform has one) or off, for signatures
    compiled from now on (``TORCHTPU_COMPILE_TIERS`` sets the start-up value)."""
    global _options, _enabled
    _enabled = bool(enabled)
    _options = False


def enabled() -> bool:
    """Whether the quick tier is switched on (it also needs a platform that has one)."""
    return _enabled


def elementwise_options(op) -> dict | None:
    """The XLA compiler options a per-op executable of ATen op ``op`` (an ``OpOverload``,
    or anything else: None) compiles with at the full tier, or None for the platform's
    defaults.

    Element-wise ops made of exactly rounded operations (``_ELEMENTWISE_NAMES``:
    arithmetic, square root, comparisons, selections, copies, casts, fills, ``cat``,
    ``constant_pad_nd``, ``arange``) whose program has no reduction, dot, loop, complex,
    bfloat16 or float8 value (:func:`program_options`) compile with ``_ELEMENTWISE_OPTIONS`` of the
    platform (CPU: the legacy loop emitters, about half the compile time of XLA's
    default; ``tests/test_elementwise_options.py`` checks the results bit for bit against
    the default options, over every sample of PyTorch's element-wise OpInfos with
    ``TORCHTPU_FULL_TESTS=1``).  ``TORCHTPU_ELEMENTWISE_OPTIONS=0`` (or
    :func:`set_elementwise_options`) turns this off."""
    opts = _ELEMENTWISE_OPS.get(op, False)
    if opts is False:
        opts = None
        if _elementwise_on and isinstance(op, torch._ops.OpOverload) \
                and op._schema.name in _ELEMENTWISE_NAMES:
            opts = _ELEMENTWISE_OPTIONS.get(runtime.platform())
        _ELEMENTWISE_OPS[op] = opts
    return opts


# StableHLO constructs whose code the element-wise options may compile with other
# rounding: reductions and dots (summation order), loops, and complex arithmetic (the
# emitters contract complex products into FMAs differently: ``mul``/``addcmul``/``ldexp``
# of complex64 differed in the every-sample sweep; neither equals CPU bit for bit)
# (likewise bfloat16, where the legacy emitters canonicalize NaN payloads in copies and
# selects, and float8, whose conversions they round differently: a helper's break attempt
# and tests/test_dtypes_extra.py found both)
_NOT_ELEMENTWISE = ("stablehlo.reduce", "dot_general", "stablehlo.while", "stablehlo.sort",
                    "stablehlo.scatter", "stablehlo.convolution", "stablehlo.custom_call",
                    "stablehlo.case", "stablehlo.if", "complex<", "bf16", "f8E")


def program_options(options, lowered):
    """``options`` (from :func:`elementwise_options`) for the program ``lowered`` (a
    ``jax.stages.Lowered``), or None when it has a reduction, a dot, a loop, a sort, a
    scatter, complex numbers, bfloat16 or float8 values."""
    if options is None:
        return None
    text = lowered.as_text()
    return None if any(w in text for w in _NOT_ELEMENTWISE) else options


def set_elementwise_options(enabled: bool) -> None:
    """Compile element-wise ops' executables with the platform's element-wise options
    (:func:`elementwise_options`) or with its defaults, from the next new signature on
    (``TORCHTPU_ELEMENTWISE_OPTIONS`` sets the start-up value)."""
    global _elementwise_on
    _elementwise_on = bool(enabled)
    _ELEMENTWISE_OPS.clear()


def first_call(jitted, args, on_tier_up, entry=None, check_info=None, options=None):
    """:func:`_first_call`, its executables counted under kind ``"op"``
    (``metrics()["xla"]["by_kind"]``)."""
    with _metrics.compile_kind("op"):
        return _first_call(jitted, args, on_tier_up, entry, check_info, options)


def _first_call(jitted, args, on_tier_up, entry=None, check_info=None, options=None):
    """Run ``jitted(*args)`` for the first time: a quick-tier compile where there is
    one, else the default compile (both counted in ``compiles``).

    ``options``: the full tier's XLA compiler options (:func:`elementwise_options`),
    None for the platform's defaults.  Where they equal the quick tier's, the first
    compile is the full one (no tier-up).

    Returns ``(outputs, caller)``: ``caller`` is what to call next time.  Under the
    quick tier it is a one-shot callable that recompiles ``jitted`` at the full tier,
    counts a tier-up, calls ``on_tier_up(full)`` (so the owner calls the full-tier
    executable directly from then on) and runs it; otherwise it is the executable.

    ``entry`` (a :class:`torchtpu.eager.signature_cache.Entry`, or None): executables
    stored by an earlier process are loaded from it instead of compiled, and the ones
    compiled here are stored in it, with ``check_info`` (the list the trace fills with
    the executable's device-side checks; refilled from the entry on a load).
    Exceptions from tracing propagate unchanged.
    """
    opts = quick_options()
    if opts is not None and opts == options:
        opts = None  # the quick tier would compile the same program again
    if entry is not None:
        for tier in (("full", "quick") if opts is not None else ("full",)):
            rec = entry.load(tier)
            if rec is not None:
                compiled, checks = rec
                check_info[:] = checks
                outs = compiled(*args)
                if tier == "full":
                    return outs, direct(compiled)
                return outs, _tier_up(jitted, on_tier_up, entry, check_info)
    t0 = time.perf_counter()
    if opts is None:
        outs, caller = _full_tier(jitted, args, entry, check_info, options)
        dt = time.perf_counter() - t0
        M.compiles += 1
        M.compile_seconds += dt
        return outs, caller
    pc = M.persistent_cache["hits"]
    lowered = jitted.lower(*args)
    with persistent_cache.bypassed() if entry is not None else _NO_BYPASS:
        compiled = lowered.compile(compiler_options=opts)
    dt = time.perf_counter() - t0
    M.compiles += 1
    M.compile_seconds += dt
    M.quick_compiles += 1
    M.quick_compile_seconds += dt
    outs = compiled(*args)
    if entry is not None:
        entry.save("quick", compiled, check_info, pc)
    return outs, _tier_up(jitted, on_tier_up, entry, check_info, options)


def _full_tier(jitted, args, entry, check_info, options=None):
    """``(outputs, executable)``: ``jitted`` compiled at the full tier (with XLA
    compiler ``options``, None: the defaults) and run on ``args``; with an ``entry``,
    compiled explicitly so the executable can be stored."""
    if entry is None:
        if options is None:
            return jitted(*args), jitted
        lowered = jitted.lower(*args)
        options = program_options(options, lowered)
        full = lowered.compile(compiler_options=options)
        return full(*args), direct(full)
    pc = M.persistent_cache["hits"]
    lowered = jitted.lower(*args)
    options = program_options(options, lowered)
    with persistent_cache.bypassed():  # stored in ``entry``, not in JAX's cache
        full = lowered.compile(compiler_options=options)
    outs = full(*args)
    entry.save("full", full, check_info, pc)
    return outs, direct(full)


def direct(compiled):
    """What to call instead of a ``jax.stages.Compiled`` that has run once: its C++ call
    (``Compiled.__call__`` is a Python frame around it, ~0.4 us of a strict op's ~13 us;
    the same arguments, results and ``TypeError`` on another input structure).  Anything
    else, or a ``Compiled`` without one, is returned as it is."""
    fn = getattr(compiled, "_call", None)
    return compiled if fn is None else fn


def _tier_up(jitted, on_tier_up, entry, check_info, options=None):
    """The one-shot caller that recompiles ``jitted`` at the full tier (with
    ``options``; stored in ``entry`` when there is one), hands it to ``on_tier_up`` and
    runs it."""

    def tier_up(*a):
        t1 = time.perf_counter()
        with _metrics.compile_kind("op_tier_up"):
            res, full = _full_tier(jitted, a, entry, check_info, options)
        d = time.perf_counter() - t1
        M.compiles += 1
        M.compile_seconds += d
        M.tier_ups += 1
        M.tier_up_seconds += d
        on_tier_up(full)
        return res

    return tier_up
