"""Opt-in CPU fallback (``torch.tpu.enable_cpu_fallback = True`` / ``TORCHTPU_CPU_FALLBACK=1``).

Runs an op that has no lowering on the CPU: tpu inputs are copied to the host (a sync
point), the op runs there, results are copied back to the input's tpu device, and every
mutated tpu argument receives its new value: in-place ops, ``out=`` (single tensors,
several out tensors, ``Tensor[] out``), in-place ops on tensor lists (``_foreach_*_``,
``_amp_*_``, ``_fused_*_``), and arguments that are views (the write goes through the view
into the base).  Arguments that share a tpu storage share one host copy, so aliasing
between arguments (``x.add_(x)``, overlapping views, the same tensor twice in a list)
behaves as on CPU.  A mutated argument the fallback cannot write back raises
``NotImplementedError`` instead of returning.  Warns once per op and counts
``torchtpu.metrics()["fallbacks"][op]``.

:func:`forced` is a test hook: it routes named ops through this fallback even when they
are lowered (or decomposed before reaching the backend).
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from torchtpu import _metrics

_warned: set = set()


def _is_tpu(v) -> bool:
    return isinstance(v, torch.Tensor) and v.device.type == "tpu"


def _tpu_tensors(vals):
    for v in vals:
        if _is_tpu(v):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (x for x in v if _is_tpu(x))


class _HostCopies:
    """Host copies of the tpu tensors of one call, keeping their aliasing.

    A tensor alone on its storage is copied by itself (``t.cpu()``).  Several tensors on
    one storage (views of one base) share one host copy of that storage, viewed with each
    tensor's own size, stride and offset, so the op sees the same overlaps as on CPU.
    """

    def __init__(self, tensors, written):
        groups: dict = {}
        for t in tensors:
            groups.setdefault(t.untyped_storage()._cdata, {})[id(t)] = t
        self.host: dict = {}  # id(tpu tensor) -> host tensor
        self.shared: dict = {}  # storage cdata -> (tpu whole-storage view, host copy of it)
        self.unshareable: set = set()  # storages whose views cannot share one host copy
        for cid, members in groups.items():
            ts = list(members.values())
            # a host copy the op writes must be resizable like a CPU tensor's (out=)
            fresh = (lambda h: h.clone()) if any(id(t) in written for t in ts) else (lambda h: h)
            if len(ts) == 1:
                self.host[id(ts[0])] = fresh(ts[0].cpu())
                continue
            dtype = ts[0].dtype
            if any(t.dtype != dtype or t.is_conj() or t.is_neg() for t in ts):
                self.unshareable.add(cid)
                for t in ts:
                    self.host[id(t)] = fresh(t.cpu())
                continue
            n = ts[0].untyped_storage().nbytes() // ts[0].element_size()
            whole = ts[0].as_strided((n,), (1,), 0)
            host_whole = fresh(whole.cpu())
            self.shared[cid] = (whole, host_whole)
            for t in ts:
                self.host[id(t)] = host_whole.as_strided(t.shape, t.stride(), t.storage_offset())

    def __call__(self, v):
        if _is_tpu(v):
            return self.host[id(v)]
        if isinstance(v, (list, tuple)):
            return type(v)(self(x) for x in v)
        if isinstance(v, torch.device) and v.type == "tpu":
            return torch.device("cpu")
        return v


def _mutated(sch, args, kwargs, cargs, ckw):
    """(name, tpu-side value, host-side value) of every mutated argument."""
    for i, a in enumerate(sch.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            if i < len(args):
                yield a.name, args[i], cargs[i]
            elif a.name in kwargs:
                yield a.name, kwargs[a.name], ckw[a.name]


def _write_back(op, copies, mutated):
    """Copy each mutated argument's new host value into its tpu tensor; raise
    ``NotImplementedError`` for one that cannot be written."""
    pairs = []
    for name, orig, new in mutated:
        if isinstance(orig, (list, tuple)) and isinstance(new, (list, tuple)) \
                and len(orig) == len(new):
            pairs.extend((name, o, h) for o, h in zip(orig, new))
        else:
            pairs.append((name, orig, new))
    storages, singles = set(), []
    for name, orig, new in pairs:
        if orig is None or (isinstance(orig, torch.Tensor) and not _is_tpu(orig)):
            continue  # nothing, or a host tensor the op wrote itself
        if not (_is_tpu(orig) and isinstance(new, torch.Tensor)):
            raise NotImplementedError(
                f"torchtpu: the CPU fallback of {op} cannot write back its mutated "
                f"argument '{name}' ({type(orig).__name__})")
        cid = orig.untyped_storage()._cdata
        if cid in copies.unshareable:
            raise NotImplementedError(
                f"torchtpu: the CPU fallback of {op} cannot write back '{name}': it "
                f"aliases another argument viewed with another dtype or conj/neg bit")
        shared = copies.shared.get(cid)
        if shared is not None and new.untyped_storage()._cdata == \
                shared[1].untyped_storage()._cdata:
            storages.add(cid)  # written once below, whole storage
            continue
        singles.append((orig, new))
    for cid in storages:
        whole, host_whole = copies.shared[cid]
        whole.copy_(host_whole)
    for orig, new in singles:  # after the whole storages: an out= the op moved elsewhere
        if orig.shape != new.shape:  # an out= the op resized
            orig.resize_(new.shape)
        orig.copy_(new)


def _kernel_op_name(op) -> str:
    name = op._schema.name.split("::")[1]
    return name if op._overloadname == "default" else f"{name}.{op._overloadname}"


def run(op, args, kwargs):
    """Run ``op`` on the CPU with host copies of its tpu arguments; write every mutated
    tpu argument back and return the results on the tpu device (results that are a
    mutated argument are that argument)."""
    name = str(op)
    _metrics.METRICS.fallbacks[name] += 1
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"torchtpu: {name} has no tpu lowering for this call; running it on the CPU",
                      stacklevel=3)
    dev = None
    for v in list(args) + list(kwargs.values()):
        if _is_tpu(v):
            dev = v.device
            break
        if isinstance(v, (list, tuple)):
            t = next((x for x in v if _is_tpu(x)), None)
            if t is not None:
                dev = t.device
                break
        if isinstance(v, torch.device) and v.type == "tpu":
            dev = v
    dev = dev or torch.device("tpu", 0)
    sch = op._schema
    written = {id(t) for _, orig, _ in _mutated(sch, args, kwargs, args, kwargs)
               for t in _tpu_tensors([orig])}
    copies = _HostCopies(_tpu_tensors(list(args) + list(kwargs.values())), written)
    cargs = [copies(a) for a in args]
    ckw = {k: copies(v) for k, v in kwargs.items()}
    out = op(*cargs, **ckw)
    mutated = list(_mutated(sch, args, kwargs, cargs, ckw))
    _write_back(op, copies, mutated)

    # results aliasing a mutated argument are that argument
    alias = {}
    for _, orig, new in mutated:
        if isinstance(orig, (list, tuple)) and isinstance(new, (list, tuple)):
            alias.update((id(h), o) for o, h in zip(orig, new))
        else:
            alias[id(new)] = orig

    def back(o):
        if isinstance(o, torch.Tensor):
            a = alias.get(id(o))
            return a if a is not None else o.to(dev)
        if isinstance(o, (list, tuple)):
            return type(o)(back(x) for x in o)
        return o

    return back(out)


def _forced_kernel(op):
    def kernel(keyset, *args, **kwargs):
        return run(op, args, kwargs)

    return kernel


@contextlib.contextmanager
def forced(*ops):
    """Test hook: inside the block, each ``OpOverload`` in ``ops`` runs through the CPU
    fallback on tpu tensors (whether or not ``enable_cpu_fallback`` is set), even when it
    is lowered, decomposed, or has a composite kernel (``_foreach_mul_``): a temporary
    PrivateUse1 kernel takes precedence, and is removed on exit.

    Example::

        with cpu_fallback.forced(torch.ops.aten.max.dim_max):
            torch.max(x, 0, out=(values, indices))
    """
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
            for op in ops:
                lib.impl(_kernel_op_name(op), _forced_kernel(op), "PrivateUse1",
                         with_keyset=True)
        yield
    finally:
        lib._destroy()
