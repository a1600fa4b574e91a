"""Lightning: ``Trainer(accelerator="auto" | "tpu")`` and ``Fabric(...)`` run on ``tpu``.

Lightning's documented extension point for a new device is an ``Accelerator`` subclass
registered in its accelerator registry (``AcceleratorRegistry.register(name, cls)``;
Fabric has its own ``ACCELERATOR_REGISTRY``).  We register :class:`TPUAccelerator` (and
its Fabric twin) under the name ``"tpu"``, replacing the ``XLAAccelerator`` entry, which
needs ``torch_xla`` (when ``torch_xla`` is installed nothing here is applied).  Three
choices are still hard-wired in Lightning's connectors (``_AcceleratorConnector`` for the
Trainer, ``_Connector`` for Fabric), so each gets one narrow patch:

* ``_choose_auto_accelerator``: Lightning checks XLA, MPS, CUDA, then answers ``"cpu"``;
  when that answer is the CPU and PyTorch's current accelerator is ``tpu``
  (``torch.accelerator``), answer ``"tpu"``.  ``accelerator="cpu"`` keeps its meaning.
* ``_choose_strategy``: the name ``"tpu"`` selects ``SingleDeviceXLAStrategy`` (torch_xla),
  and any other single-device accelerator not CUDA/MPS gets ``SingleDeviceStrategy("cpu")``.
  With our accelerator: ``SingleDeviceStrategy(device=tpu:N)``; several devices or nodes
  get Lightning's own ``"ddp"`` (PyTorch's default process-group backend for ``tpu`` is
  torchtpu's; not covered by tests here).  A strategy the user passes is never changed.
* ``_check_and_init_precision``: ``"16-mixed"``/``"bf16-mixed"`` build
  ``MixedPrecision(device="cuda")`` for any accelerator but CPU/MPS; with ours,
  ``MixedPrecision(device="tpu")`` (``torch.autocast("tpu")``, and for ``16-mixed`` a
  ``torch.amp.GradScaler("tpu")``).  A precision plugin the user passes is never changed.

And ``trainer.setup._log_device_info`` (the Trainer's "GPU available / TPU available" lines)
reports the tpu device in use instead of "TPU available: False, using: 0 TPU cores".

Both the ``lightning`` package (``lightning.pytorch``, ``lightning.fabric``) and the
standalone ``pytorch_lightning`` / ``lightning_fabric`` packages are handled.

Version range tested: lightning 2.6 (the patched connector methods have this shape since
2.0).  Guarded by ``tests/test_integration_lightning.py::test_patches_still_needed_and_in_place``.
"""

from __future__ import annotations

import importlib

LO, HI = (2, 0), (2, 7)

# the connector module hooked -> (fabric package, trainer package or None)
_PACKAGES = {
    "lightning.fabric.connector": ("lightning.fabric", None),
    "lightning.pytorch.trainer.connectors.accelerator_connector":
        ("lightning.fabric", "lightning.pytorch"),
    "lightning_fabric.connector": ("lightning_fabric", None),
    "pytorch_lightning.trainer.connectors.accelerator_connector":
        ("lightning_fabric", "pytorch_lightning"),
}

_classes: dict[str, type] = {}  # package -> its TPUAccelerator class


def _parse_devices(devices, fabric_pkg: str = "lightning.fabric") -> list[int]:
    """Lightning's ``devices=`` for tpu, as ``_parse_gpu_ids`` reads it for CUDA: an int
    ``n`` (``-1``: all) -> ``[0..n-1]``; ``"n"`` likewise; ``"0,2"`` or ``[0, 2]`` -> those
    indices.  Raises that Lightning package's ``MisconfigurationException`` for indices this
    machine lacks."""
    import torch

    n_avail = torch.tpu.device_count()
    if isinstance(devices, str):
        s = devices.strip()
        if s in ("-1", "auto"):
            devices = -1
        elif "," in s:
            devices = [int(x) for x in s.split(",") if x.strip()]
        else:
            devices = int(s)
    if isinstance(devices, int):
        ids = list(range(n_avail)) if devices == -1 else list(range(devices))
    else:
        ids = [int(d) for d in devices]
    bad = [i for i in ids if not 0 <= i < n_avail]
    if bad or not ids:
        exc = importlib.import_module(f"{fabric_pkg}.utilities.exceptions").MisconfigurationException
        raise exc(f"You requested tpu: {ids}\n But your machine only has: {list(range(n_avail))}")
    return ids


def _accelerator_class(fabric_pkg: str, trainer_pkg: str | None) -> type:
    """The Lightning ``Accelerator`` for ``tpu``, built on the given package's base class
    (Fabric's, or the Trainer's, which adds ``get_device_stats``)."""
    key = trainer_pkg or fabric_pkg
    if key in _classes:
        return _classes[key]
    import torch

    if trainer_pkg is None:
        base = importlib.import_module(f"{fabric_pkg}.accelerators").Accelerator
    else:
        base = importlib.import_module(f"{trainer_pkg}.accelerators").Accelerator

    class TPUAccelerator(base):
        """Lightning accelerator for torchtpu's ``tpu`` device (PJRT through JAX; no
        torch_xla).  ``devices``: an int, a list of indices or ``"auto"`` (one device:
        several devices go through Lightning's DDP strategy, which torchtpu's process group
        backend serves, but that path is not tested here)."""

        def setup_device(self, device: torch.device) -> None:
            if device.type != "tpu":
                raise ValueError(f"Device should be tpu, got {device} instead.")
            torch.tpu.set_device(device)

        def teardown(self) -> None:
            pass

        @staticmethod
        def parse_devices(devices):
            return _parse_devices(devices, fabric_pkg)

        @staticmethod
        def get_parallel_devices(devices):
            return [torch.device("tpu", i) for i in _parse_devices(devices, fabric_pkg)]

        @staticmethod
        def auto_device_count() -> int:
            # One, as Lightning does for MPS: one process drives one tpu device here;
            # devices=N asks for N processes explicitly.
            return 1

        @staticmethod
        def is_available() -> bool:
            from torchtpu.integrations import tpu_is_the_accelerator

            return tpu_is_the_accelerator()

        @staticmethod
        def name() -> str:
            return "tpu"

        def get_device_stats(self, device) -> dict:
            """``torch.tpu.memory_stats(device)`` (what ``DeviceStatsMonitor`` logs)."""
            return torch.tpu.memory_stats(device)

    TPUAccelerator.__module__ = __name__
    TPUAccelerator.__qualname__ = "TPUAccelerator"
    _classes[key] = TPUAccelerator
    return TPUAccelerator


def _xla_available(fabric_pkg: str) -> bool:
    xla = importlib.import_module(f"{fabric_pkg}.accelerators.xla")
    return bool(xla.XLAAccelerator.is_available())


def _register(registry, cls) -> None:
    registry.register("tpu", cls, description="torchtpu: tpu device through JAX/PJRT "
                      "(no torch_xla)", override=True)


def _patch_connector(conn_cls, accel_cls, precision_attr: str, plugin_attr: str,
                     strategies_pkg: str, amp_mod: str) -> None:
    if getattr(conn_cls._choose_strategy, "_torchtpu", False):
        return
    SingleDeviceStrategy = importlib.import_module(strategies_pkg).SingleDeviceStrategy
    MixedPrecision = importlib.import_module(amp_mod).MixedPrecision

    orig_auto = conn_cls.__dict__["_choose_auto_accelerator"].__func__
    orig_strategy = conn_cls._choose_strategy
    orig_precision = conn_cls._check_and_init_precision

    def _choose_auto_accelerator():
        name = orig_auto()
        if name == "cpu" and accel_cls.is_available():
            return "tpu"
        return name

    def _choose_strategy(self):
        if isinstance(self.accelerator, accel_cls):
            if self._num_nodes_flag > 1 or len(self._parallel_devices) > 1:
                return "ddp"
            return SingleDeviceStrategy(device=self._parallel_devices[0])
        return orig_strategy(self)

    def _check_and_init_precision(self):
        flag = getattr(self, precision_attr)
        if (isinstance(self.accelerator, accel_cls) and getattr(self, plugin_attr) is None
                and flag in ("16-mixed", "bf16-mixed")):
            return MixedPrecision(precision=flag, device="tpu")
        return orig_precision(self)

    for fn, orig in ((_choose_auto_accelerator, orig_auto), (_choose_strategy, orig_strategy),
                     (_check_and_init_precision, orig_precision)):
        fn.__wrapped__ = orig
        fn._torchtpu = True
        fn.__doc__ = (orig.__doc__ or "") + "\n(torchtpu: tpu-aware, see torchtpu.integrations.lightning)"
        fn.__qualname__ = f"{conn_cls.__name__}.{fn.__name__}"
    conn_cls._choose_auto_accelerator = staticmethod(_choose_auto_accelerator)
    conn_cls._choose_strategy = _choose_strategy
    conn_cls._check_and_init_precision = _check_and_init_precision


def install_setup(module):
    """Post-import hook for the Trainer's ``trainer.setup``: ``_log_device_info`` names the
    tpu device in use (Lightning's own lines say "TPU available: False" for it)."""
    from importlib.metadata import version

    from torchtpu.integrations import check_version

    trainer_pkg = module.__name__.rsplit(".trainer.setup", 1)[0]
    dist = "lightning" if trainer_pkg == "lightning.pytorch" else "pytorch_lightning"
    why = check_version(dist, version(dist), LO, HI)
    if why:
        return why
    orig = getattr(module, "_log_device_info", None)
    if orig is None:
        return "skipped: no _log_device_info"
    if getattr(orig, "_torchtpu", False):
        return None

    def _log_device_info(trainer) -> None:
        cls = _classes.get(trainer_pkg)
        if cls is None or not isinstance(trainer.accelerator, cls):
            return orig(trainer)
        import torch

        module.rank_zero_info(f"TPU available: True (torchtpu, device kind "
                              f"{torch.tpu.get_device_name()!r}), "
                              f"using: {trainer.num_devices} tpu device"
                              f"{'s' if trainer.num_devices > 1 else ''}")

    _log_device_info.__wrapped__ = orig
    _log_device_info._torchtpu = True
    module._log_device_info = _log_device_info
    return None


def install(module):
    """Post-import hook for Lightning's connector modules (Fabric's ``connector`` and the
    Trainer's ``accelerator_connector``): register the tpu accelerator, patch the
    connector."""
    from importlib.metadata import PackageNotFoundError, version

    from torchtpu.integrations import check_version

    fabric_pkg, trainer_pkg = _PACKAGES[module.__name__]
    dist = "lightning" if fabric_pkg == "lightning.fabric" else (
        "pytorch_lightning" if trainer_pkg else "lightning_fabric")
    try:
        v = version(dist)
    except PackageNotFoundError:  # lightning_fabric shipped inside pytorch_lightning
        v = version("pytorch_lightning")
    why = check_version(dist, v, LO, HI)
    if why:
        return why
    if _xla_available(fabric_pkg):
        return "skipped: torch_xla is installed; Lightning's XLAAccelerator keeps 'tpu'"
    accel_cls = _accelerator_class(fabric_pkg, trainer_pkg)
    if trainer_pkg is None:
        registry = importlib.import_module(f"{fabric_pkg}.accelerators").ACCELERATOR_REGISTRY
        conn_cls = module._Connector
        attrs = ("_precision_input", "_precision_instance")
        strategies, amp = f"{fabric_pkg}.strategies", f"{fabric_pkg}.plugins.precision.amp"
    else:
        registry = importlib.import_module(f"{trainer_pkg}.accelerators").AcceleratorRegistry
        conn_cls = module._AcceleratorConnector
        attrs = ("_precision_flag", "_precision_plugin_flag")
        strategies, amp = f"{trainer_pkg}.strategies", f"{trainer_pkg}.plugins.precision.amp"
    for name in ("_choose_auto_accelerator", "_choose_strategy", "_check_and_init_precision"):
        if not callable(getattr(conn_cls, name, None)):
            return f"skipped: {conn_cls.__qualname__}.{name} is gone"
    if not isinstance(conn_cls.__dict__.get("_choose_auto_accelerator"), staticmethod):
        return f"skipped: {conn_cls.__qualname__}._choose_auto_accelerator is not a staticmethod"
    _register(registry, accel_cls)
    _patch_connector(conn_cls, accel_cls, *attrs, strategies, amp)
    return None
