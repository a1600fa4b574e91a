"""``torch.tpu``: the device module, shaped like ``torch.cuda``.

Names and behaviour mirror ``torch.cuda``; differences are documented per function.
Device indices are ``tpu:N`` = the N-th PJRT device of the chosen platform
(see :mod:`torchtpu._device.runtime`).
"""

from __future__ import annotations

import os

import torch

from torchtpu._device import runtime, state
from torchtpu._device.streams import Event, Stream, current_stream, default_stream, stream  # noqa: F401

_initialized = False


def _lazy_init():
    global _initialized
    if not _initialized:
        runtime.devices()
        _initialized = True


def is_initialized() -> bool:
    """Whether the PJRT client has been opened (``torch.cuda.is_initialized``)."""
    return _initialized


def init() -> None:
    """Open the PJRT client now instead of at first use (``torch.cuda.init``)."""
    _lazy_init()


def _is_in_bad_fork() -> bool:
    return False


def is_available() -> bool:
    """True when at least one PJRT device of the chosen platform exists."""
    try:
        return runtime.device_count() > 0
    except RuntimeError:
        return False


def device_count() -> int:
    """Number of ``tpu`` devices (PJRT devices of the chosen platform)."""
    try:
        return runtime.device_count()
    except RuntimeError:
        return 0


def current_device() -> int:
    """Index of the current ``tpu`` device (``torch.cuda.current_device``)."""
    return state.current_device


_to_index = state.to_index


def set_device(device) -> None:
    """Set the current ``tpu`` device (``torch.cuda.set_device``).

    Raises:
        RuntimeError: the index is out of range.
    """
    idx = _to_index(device)
    if idx < 0:
        return
    runtime.jax_device(idx)
    state.set_current_device(idx)


class device:
    """Context manager that changes the current ``tpu`` device (``torch.cuda.device``)."""

    def __init__(self, device):
        self.idx = _to_index(device) if device is not None else -1
        self.prev_idx = -1

    def __enter__(self):
        self.prev_idx = state.current_device
        if self.idx >= 0:
            set_device(self.idx)
        return self

    def __exit__(self, *exc):
        if self.prev_idx >= 0:
            state.set_current_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager making the device of tensor ``obj`` current."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == "tpu" else -1)


def synchronize(device=None) -> None:
    """Wait until every op queued so far has finished (a sync point;
    ``torch.cuda.synchronize``): :func:`torchtpu.eager.sync.synchronize`.  ``device`` is
    accepted for CUDA's signature; PJRT's queues are waited on together."""
    from torchtpu.eager import sync

    sync.synchronize()


def get_device_name(device=None) -> str:
    """Name of the PJRT device, e.g. ``"TPU v5 lite"``, ``"NVIDIA H200"`` or ``"cpu"``."""
    d = runtime.jax_device(_to_index(device))
    return getattr(d, "device_kind", str(d))


class _DeviceProperties:
    """What ``get_device_properties`` returns: ``name``, ``platform``, ``index``,
    ``total_memory`` (bytes: PJRT's ``bytes_limit``; the host's RAM on the CPU platform),
    ``major``/``minor`` (0, as :func:`get_device_capability`), ``is_integrated`` (True on the
    CPU platform, whose device memory is host memory: accelerate then budgets no separate
    CPU memory)."""

    def __init__(self, index):
        d = runtime.jax_device(index)
        self.name = getattr(d, "device_kind", str(d))
        self.platform = runtime.platform()
        self.index = index
        self.total_memory = memory._device_memory(index)[1]
        self.major, self.minor = get_device_capability()
        self.is_integrated = self.platform == "cpu"  # the CPU device's memory is the host's

    def __repr__(self):
        return (
            f"_TpuDeviceProperties(name='{self.name}', platform='{self.platform}', "
            f"total_memory={self.total_memory // (1024 * 1024)}MB)"
        )


def get_device_properties(device=None) -> _DeviceProperties:
    return _DeviceProperties(_to_index(device))


def get_device_capability(device=None) -> tuple:
    """(0, 0): XLA devices have no CUDA compute capability."""
    return (0, 0)


# ----------------------------------------------------------------------- RNG


def manual_seed(seed: int) -> None:
    """Seed the current device's random stream (``torch.cuda.manual_seed``)."""
    state.rng(state.current_device).__init__(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seed every device's random stream; ``torch.manual_seed`` calls this."""
    for i in range(max(device_count(), 1)):
        state.rng(i).__init__(int(seed))


def seed() -> None:
    """Seed the current device with a non-deterministic random number."""
    manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)


def seed_all() -> None:
    s = int.from_bytes(os.urandom(8), "little") >> 1
    manual_seed_all(s)


def initial_seed() -> int:
    """The seed of the current device's stream."""
    return state.rng(state.current_device).seed


def get_rng_state(device="tpu") -> torch.Tensor:
    """RNG state of a device as a CPU ``uint8`` tensor (16 bytes: seed, offset)."""
    raw = state.rng(_to_index(device)).get_state()
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    """Restore a state returned by :func:`get_rng_state`."""
    state.rng(_to_index(device)).set_state(bytes(new_state.cpu().numpy().tobytes()))


def get_rng_state_all() -> list:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for i, s in enumerate(new_states):
        set_rng_state(s, i)


# ----------------------------------------------------------------- dtypes, amp


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 is native on every XLA platform."""
    return True


def get_amp_supported_dtype() -> list:
    """Dtypes ``torch.autocast("tpu", ...)`` accepts."""
    return [torch.bfloat16, torch.float16]


def is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled("tpu")


def get_autocast_dtype():
    return torch.get_autocast_dtype("tpu")


def _get_device_index(device, optional=False) -> int:
    return _to_index(device)


from torchtpu._device import amp  # noqa: E402  (torch.tpu.amp, like torch.cuda.amp)
from torchtpu._device import memory  # noqa: E402  (torch.tpu.memory, like torch.cuda.memory)
from torchtpu._device.memory import (  # noqa: E402,F401
    empty_cache, empty_host_cache, ipc_collect, max_memory_allocated, max_memory_reserved, mem_get_info,
    memory_allocated, memory_reserved, memory_snapshot, memory_stats, memory_summary,
    reset_accumulated_memory_stats, reset_max_memory_allocated, reset_peak_memory_stats,
    utilization,
)


# --------------------------------------------------------- torchtpu settings


# ``torch.tpu.enable_cpu_fallback``: a property of the module (below), stored in
# ``torchtpu.eager.modes.CONFIG.cpu_fallback``


# ------------------------------------------------------------------ JAX interop
from torchtpu._public import from_jax, jax_op, to_jax  # noqa: E402,F401  (torch.tpu.jax_op...)

# ------------------------------------------------------------------ eager modes
from torchtpu.eager.modes import EagerMode, set_eager_mode  # noqa: E402,F401


class _TpuModule(type(os)):
    """``torch.tpu``'s module class: settable ``eager_mode``, ``debug_nans`` and
    ``enable_cpu_fallback``."""

    @property
    def enable_cpu_fallback(self) -> bool:
        """Run ops that have no lowering on the CPU (copying inputs and results), warning
        once per op, instead of raising ``NotImplementedError`` (settable; starts as
        ``TORCHTPU_CPU_FALLBACK=1`` says)."""
        from torchtpu.eager.modes import CONFIG

        return CONFIG.cpu_fallback

    @enable_cpu_fallback.setter
    def enable_cpu_fallback(self, value: bool) -> None:
        from torchtpu.eager.modes import CONFIG

        CONFIG.cpu_fallback = bool(value)

    @property
    def eager_mode(self) -> EagerMode:
        """The current :class:`EagerMode` (settable: ``torch.tpu.eager_mode = ...``)."""
        from torchtpu.eager import modes

        return modes.get_eager_mode()

    @eager_mode.setter
    def eager_mode(self, mode) -> None:
        from torchtpu.eager import modes

        modes.set_eager_mode_now(mode)

    @property
    def debug_nans(self) -> bool:
        """DEBUG mode: raise at the first op producing NaN/Inf (``TORCHTPU_DEBUG_NANS``)."""
        from torchtpu.eager.modes import CONFIG

        return CONFIG.debug_nans

    @debug_nans.setter
    def debug_nans(self, value: bool) -> None:
        from torchtpu.eager.modes import CONFIG

        CONFIG.debug_nans = bool(value)


import sys as _sys  # noqa: E402

_sys.modules[__name__].__class__ = _TpuModule
_sys.modules.setdefault("torch.tpu.amp", amp)  # `from torch.tpu.amp import GradScaler`
_sys.modules.setdefault("torch.tpu.memory", memory)
