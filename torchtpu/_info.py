"""``python -m torchtpu info``: what a user pastes into a bug report.

Platform and devices (with memory), versions of the libraries torchtpu runs on or
integrates with, the eager mode, torchtpu's environment variables, cache locations and
which third-party integrations are active.  :func:`collect` returns it as a dict (``--json``
prints that), :func:`format_info` as text.
"""

from __future__ import annotations

import os
import platform as _platform
import sys

_LIBS = ("torch", "jax", "jaxlib", "numpy", "transformers", "accelerate", "safetensors",
         "lightning", "sentence-transformers", "torchvision", "timm",
         "tokenizers", "huggingface_hub", "psutil")


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def collect() -> dict:
    """Gather the report (opens the PJRT client; never raises: a failing part reports its
    error instead)."""
    import torch

    import torchtpu

    info: dict = {
        "torchtpu": {"version": torchtpu.__version__, "path": os.path.dirname(torchtpu.__file__)},
        "python": sys.version.split()[0],
        "os": f"{_platform.system()} {_platform.release()} ({_platform.machine()})",
        "versions": {name: _version(name) for name in _LIBS},
        "torch_build": {"cuda": torch.version.cuda, "git": torch.version.git_version[:12]},
    }
    try:
        from torchtpu._device import runtime

        info["platform"] = runtime.platform()
        devices = []
        for i, d in enumerate(runtime.devices()):
            free, total = torch.tpu.mem_get_info(i)
            devices.append({
                "index": f"tpu:{i}", "kind": getattr(d, "device_kind", str(d)),
                "pjrt_id": d.id, "memory_total": total, "memory_free": free,
                "memory_allocated": torch.tpu.memory_allocated(i),
            })
        info["devices"] = devices
        info["accelerator"] = str(torch.accelerator.current_accelerator())
    except Exception as e:  # the report must come out even when the runtime does not
        info["platform"] = f"error: {type(e).__name__}: {e}"
        info["devices"] = []
    try:
        info["eager_mode"] = torch.tpu.eager_mode.name
    except Exception as e:
        info["eager_mode"] = f"error: {e}"
    info["cpu_fallback"] = bool(torch.tpu.enable_cpu_fallback)
    from torchtpu._device import persistent_cache

    caches = {"xla_persistent_cache": persistent_cache.directory()}
    try:
        from torch.utils.cpp_extension import get_default_build_root

        caches["torch_extensions"] = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    except Exception:
        pass
    info["caches"] = caches
    info["env"] = {k: v for k, v in sorted(os.environ.items())
                   if k.startswith(("TORCHTPU_", "JAX_", "XLA_", "ACCELERATE_", "PJRT_"))
                   or k in ("TORCH_DEVICE_BACKEND_AUTOLOAD", "TORCH_EXTENSIONS_DIR")}
    from torchtpu import integrations

    info["integrations"] = integrations.status()
    return info


def _mib(n) -> str:
    return f"{n / 2**20:,.0f} MiB"


def format_info(info: dict) -> str:
    """The report as aligned text lines."""
    out = []

    def kv(k, v, indent=0):
        out.append(f"{' ' * indent}{k + ':':<{32 - indent}}{v}")

    kv("torchtpu", f"{info['torchtpu']['version']} ({info['torchtpu']['path']})")
    kv("python", info["python"])
    kv("os", info["os"])
    kv("platform", info.get("platform"))
    kv("accelerator", info.get("accelerator"))
    for d in info.get("devices", []):
        kv(d["index"], f"{d['kind']} (PJRT id {d['pjrt_id']}), memory {_mib(d['memory_free'])} "
           f"free / {_mib(d['memory_total'])} total, {_mib(d['memory_allocated'])} held by tensors")
    kv("eager mode", info.get("eager_mode"))
    kv("cpu fallback", info.get("cpu_fallback"))
    out.append("versions:")
    for k, v in info["versions"].items():
        kv(k, v or "not installed", 2)
    kv("torch build", f"cuda={info['torch_build']['cuda']} git={info['torch_build']['git']}", 2)
    out.append("caches:")
    for k, v in info["caches"].items():
        kv(k, v or "off", 2)
    out.append("environment:" + ("" if info["env"] else " (no TORCHTPU_/JAX_/XLA_/ACCELERATE_ variables)"))
    for k, v in info["env"].items():
        kv(k, v, 2)
    out.append("integrations:")
    for k, v in sorted(info["integrations"].items()):
        kv(k, "armed (not imported in this process)" if v == "pending" else v, 2)
    return "\n".join(out)


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m torchtpu info", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    info = collect()
    if args.json:
        import json

        print(json.dumps(info, indent=2, default=str))
    else:
        print(format_info(info))
    return 0
