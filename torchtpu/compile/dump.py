"""``TORCHTPU_DUMP_DIR``: write each compiled graph's FX and StableHLO text to a directory.

With ``TORCHTPU_DUMP_DIR=<dir>`` set (read at each graph compile, so it can be set while
the process runs; it costs nothing when unset), the ``"tpu"`` backend writes, for the
N-th Dynamo graph of the process (numbered from the highest number already in
``<dir>`` plus one, so a second run does not overwrite the first):

* ``graph_NNN.dynamo.fx.txt``: the graph Dynamo captured (torch-level ops);
* ``graph_NNN.<kind>.fx.txt``: each ATen graph AOTAutograd made of it, ``<kind>`` one
  of ``forward``, ``backward`` (training) or ``inference`` (no autograd), as
  ``GraphModule.print_readable`` prints it (shapes and dtypes annotated);
* ``graph_NNN.<kind>.stablehlo.mlir``: the StableHLO of that graph's ``jax.jit``
  (``jitted.lower(...).as_text()``), written when the executable is built (at the
  graph's first call); a graph compiled again for another input layout or concrete
  shape adds ``graph_NNN.<kind>.exeK.stablehlo.mlir`` (K = 1, 2...).

Mirrors the role of PyTorch's ``TORCH_COMPILE_DEBUG`` / torch_xla's ``XLA_SAVE_TENSORS_FILE``
for our pipeline; nothing here is on a hot path.
"""

from __future__ import annotations

import os
import warnings
import re
import threading

ENV = "TORCHTPU_DUMP_DIR"
_unusable: set = set()  # dump directories already warned about
_lock = threading.Lock()
_next: dict = {}  # directory -> next graph number
_NUM = re.compile(r"graph_(\d+)\.")


def dump_dir() -> str | None:
    """The dump directory (``$TORCHTPU_DUMP_DIR``), or None when dumping is off."""
    d = os.environ.get(ENV)
    return d or None


def new_prefix() -> str | None:
    """Path prefix ``<dir>/graph_NNN`` for the next Dynamo graph, creating ``<dir>``;
    None when dumping is off, or (with a warning, once) when ``<dir>`` cannot be
    created or read: dumping is a debugging aid and never fails a compilation."""
    d = dump_dir()
    if d is None:
        return None
    d = os.path.abspath(d)
    with _lock:
        n = _next.get(d)
        if n is None:
            try:
                os.makedirs(d, exist_ok=True)
                names = os.listdir(d)
            except OSError as e:
                if d not in _unusable:
                    _unusable.add(d)
                    warnings.warn(f"torchtpu: TORCHTPU_DUMP_DIR={d!r} is not usable ({e}); "
                                  f"graphs are not dumped")
                return None
            nums = [int(m.group(1)) for f in names if (m := _NUM.match(f))]
            n = max(nums) + 1 if nums else 0
        _next[d] = n + 1
    return os.path.join(d, f"graph_{n:03d}")


def fx_text(gm) -> str:
    """Readable text of FX graph ``gm`` (``print_readable``, else its Python code)."""
    try:
        return gm.print_readable(print_output=False)
    except Exception:  # a GraphModule subclass without print_readable
        return gm.code


def write(path: str, text: str) -> None:
    """Write ``text`` to ``path`` (UTF-8); an OSError (disk full, permissions) warns
    instead of failing the compilation."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        warnings.warn(f"torchtpu: could not write the graph dump {path!r} ({e})")
