"""Opt-in CPU fallback (``torch.tpu.enable_cpu_fallback = True`` / ``TORCHTPU_CPU_FALLBACK=1``).

Runs an op that has no lowering on the CPU: tpu inputs are copied to the host (a sync
point), the op runs there, results are copied back to the input's tpu device, and
mutated tpu arguments receive the new values.  Warns once per op and counts
``torchtpu.metrics()["fallbacks"][op]``.
"""

from __future__ import annotations

import warnings

import torch

from torchtpu import _metrics

_warned: set = set()


def _to_cpu(v):
    if isinstance(v, torch.Tensor) and v.device.type == "tpu":
        return v.cpu()
    if isinstance(v, (list, tuple)):
        return type(v)(_to_cpu(x) for x in v)
    if isinstance(v, torch.device) and v.type == "tpu":
        return torch.device("cpu")
    return v


def run(op, args, kwargs):
    name = str(op)
    _metrics.METRICS.fallbacks[name] += 1
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"torchtpu: {name} has no tpu lowering; running it on the CPU", stacklevel=3)
    dev = None
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor) and v.device.type == "tpu":
            dev = v.device
            break
        if isinstance(v, torch.device) and v.type == "tpu":
            dev = v
    dev = dev or torch.device("tpu", 0)
    cargs = [_to_cpu(a) for a in args]
    ckw = {k: _to_cpu(v) for k, v in kwargs.items()}
    out = op(*cargs, **ckw)
    # write back mutated tpu arguments
    sch = op._schema
    for i, a in enumerate(sch.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            orig = args[i] if i < len(args) else kwargs.get(a.name)
            new = cargs[i] if i < len(cargs) else ckw.get(a.name)
            if isinstance(orig, torch.Tensor) and orig.device.type == "tpu":
                if orig.shape != new.shape:
                    orig.resize_(new.shape)
                orig.copy_(new)

    def back(o, k=None):
        if isinstance(o, torch.Tensor):
            # results aliasing a mutated argument are that argument
            for i, a in enumerate(sch.arguments):
                if a.alias_info is not None and a.alias_info.is_write:
                    new = cargs[i] if i < len(cargs) else ckw.get(a.name)
                    if new is o:
                        return args[i] if i < len(args) else kwargs.get(a.name)
            return o.to(dev)
        if isinstance(o, (list, tuple)):
            return type(o)(back(x) for x in o)
        return o

    return back(out)
