"""Coverage of PyTorch's Core ATen opset (ops tagged ``torch.Tag.core``).

    python -m torchtpu.conformance.core_aten [--list-missing]

Each Core ATen overload is classified by how the tpu backend runs it: ``lowered`` (an entry
of the lowering table, ``torchtpu.ops``), ``handler`` (allocation/copy/transfer kernels),
``view`` (PyTorch's own view kernel: metadata only), ``composite`` (PyTorch decomposes it
before it reaches a backend), ``decomposed`` (PyTorch decomposition run by the executor),
or ``missing``.  Read straight from the dispatcher and our tables; nothing is run.
"""

from __future__ import annotations

import argparse
import collections

import torch


def core_ops() -> list:
    """Every OpOverload tagged ``torch.Tag.core``, sorted by name."""
    out = []
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        pkt_name, _, ov = name[6:].partition(".")
        pkt = getattr(torch.ops.aten, pkt_name, None)
        if pkt is None:
            continue
        try:
            op = getattr(pkt, ov or "default")
        except AttributeError:
            continue
        if torch.Tag.core in op.tags:
            out.append(op)
    return sorted(set(out), key=str)


def classify(op) -> str:
    import torchtpu  # noqa: F401
    from torchtpu import ops
    from torchtpu.eager import handlers
    from torchtpu.eager import executor

    table = ops.table()
    if op in handlers.HANDLERS:
        return "handler"
    if op in table:
        return "lowered"
    sig = executor.Signature(op)
    if sig.is_view and torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CPU"):
        return "view"
    for key in ("CompositeImplicitAutograd", "CompositeExplicitAutograd"):
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key):
            return "composite"
    if sig.mutated:
        f = executor.functional_variant(op)
        if f is not None and f in table:
            return "lowered"
    if executor._decomposition(op) is not None:
        return "decomposed"
    return "missing"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Core ATen opset coverage of the tpu backend")
    p.add_argument("--list-missing", action="store_true")
    a = p.parse_args(argv)
    ops = core_ops()
    by = collections.defaultdict(list)
    for op in ops:
        by[classify(op)].append(str(op))
    native = sum(len(by[k]) for k in ("lowered", "handler", "view"))
    print(f"Core ATen overloads: {len(ops)}")
    for k in ("lowered", "handler", "view", "composite", "decomposed", "missing"):
        print(f"  {k:10s} {len(by[k]):4d}")
    print(f"run natively (lowered + handler + view): {native}/{len(ops)}; "
          f"reachable: {len(ops) - len(by['missing'])}/{len(ops)}")
    if a.list_missing or by["missing"]:
        print("missing:", ", ".join(by["missing"]) or "none")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
