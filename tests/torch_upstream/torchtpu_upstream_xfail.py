"""pytest plugin for PyTorch's own test files run on ``tpu`` (see test_torch_upstream.py).

Loaded in the child pytest with ``-p torchtpu_upstream_xfail``.  Every test listed in
``expected_failures.txt`` (beside this file; ``TORCHTPU_UPSTREAM_LIST`` names another) gets
``xfail(strict=True, raises=<its exception type>, reason=...)``: it must fail, and with that
exception type.  A listed test that passes is reported ``XPASS(strict)``, a failure; one
that raises another exception fails as well.  So the list can only shrink, and a test that
starts failing for a new reason is seen.  Listed ids that were not collected (renamed or
removed upstream) are written to the file named by ``TORCHTPU_UPSTREAM_STALE`` for the
parent test to report.

Every entry names one test; patterns are refused.  An entry may name one *sub-case* of a
test, ``<test id>[<sub-case>]``, for a test that loops over cases of which one fails on
tpu and would stop the loop before the others run (``test_flip_tpu_float32`` builds
quantized copies of each float32 case).  The sub-cases are the keys of :data:`SUBCASES`.
While the test runs, the plugin tries the sub-case's call on tpu and records the
exception; the rest of that sub-case runs on the CPU so that the test goes on with its
tpu cases, which must then pass.  Right after the test, a separate item named
``<test id>[<sub-case>]`` reports the sub-case: it raises the recorded exception (an
expected failure), passes when the call worked on tpu (``XPASS(strict)``: take the entry
off the list), and fails when the test never reached the sub-case.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

LIST = Path(__file__).with_name("expected_failures.txt")

_ID = re.compile(r"^(?P<base>[\w.\-/]+\.py::\w+::\w+)(?:\[(?P<subcase>\w+)\])?$")


class ListError(ValueError):
    """A malformed line in the expected-failure list."""


@dataclass(frozen=True)
class Entry:
    """One line of the expected-failure list."""

    test_id: str                  # <file>::<Class>::<test>, or that + [<sub-case>]
    raises: type[BaseException]   # what the test (or sub-case) raises on tpu
    reason: str
    line: int

    @property
    def base_id(self) -> str:
        """The node id of the upstream test (without the sub-case)."""
        return self.test_id.split("[", 1)[0]

    @property
    def subcase(self) -> str | None:
        return self.test_id[len(self.base_id) + 1:-1] if "[" in self.test_id else None


def _exception_type(name: str, where: str) -> type[BaseException]:
    """The exception class ``name`` names: a builtin (``NotImplementedError``) or a dotted
    ``module.Class``."""
    if "." in name:
        module, _, attr = name.rpartition(".")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            obj = None
    else:
        obj = getattr(builtins, name, None)
    if not (isinstance(obj, type) and issubclass(obj, BaseException)):
        raise ListError(f"{where}: raises={name} is not an exception type (a builtin such "
                        f"as NotImplementedError, or module.Class)")
    return obj


def load(path: Path | None = None) -> dict[str, Entry]:
    """``{test id: Entry}`` from the expected-failure list.

    One entry a line::

        <file>::<Class>::<test>  raises=<ExceptionType>  # <reason>

    ``#`` lines and blank lines are comments; ``#@<name>: <text>`` defines a reason that
    entries below it cite as ``# @<name>``.  Every entry names one test (or one
    sub-case of :data:`SUBCASES`: ``<file>::<Class>::<test>[<sub-case>]``), says which
    exception it raises on tpu and why it fails; an entry without ``raises=``, without a
    reason, with a pattern (``*``, ``?``) or listed twice raises :class:`ListError`."""
    if path is None:
        path = Path(os.environ.get("TORCHTPU_UPSTREAM_LIST") or LIST)
    entries: dict[str, Entry] = {}
    named: dict[str, str] = {}  # "#@name: text" lines: a reason many entries share
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if line.startswith("#@"):
            name, sep, text = line[2:].partition(":")
            if not sep or not name.strip() or not text.strip() or name.strip() in named:
                raise ListError(f"{path}:{n}: a named reason is `#@<name>: <text>`, "
                                f"each name once")
            named[name.strip()] = text.strip()
            continue
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{n}"
        head, sep, reason = line.partition(" # ")
        if not sep or not reason.strip():
            raise ListError(f"{where}: entry without a reason "
                            f"(`<id>  raises=<ExceptionType>  # <reason>`)")
        if reason.strip().startswith("@"):
            key = reason.strip()[1:]
            if key not in named:
                raise ListError(f"{where}: reason @{key} is not defined above it "
                                f"(`#@{key}: <text>`)")
            reason = named[key]
        test_id, *fields = head.split()
        if any(c in test_id for c in "*?"):
            raise ListError(f"{where}: {test_id} is a pattern; an entry names a single "
                            f"test (list each test it should match)")
        m = _ID.match(test_id)
        if m is None:
            raise ListError(f"{where}: {test_id} is not a test id "
                            f"(`<file>.py::<Class>::<test>`)")
        if m["subcase"] is not None and m["subcase"] not in SUBCASES:
            raise ListError(f"{where}: unknown sub-case [{m['subcase']}] (known: "
                            f"{', '.join(sorted(SUBCASES))})")
        raises = None
        for f in fields:
            key, eq, value = f.partition("=")
            if key != "raises" or not eq or not value or raises is not None:
                raise ListError(f"{where}: unexpected {f!r} (`<id>  raises=<ExceptionType>"
                                f"  # <reason>`)")
            raises = _exception_type(value, where)
        if raises is None:
            raise ListError(f"{where}: {test_id} has no raises=<ExceptionType>: say which "
                            f"exception the test raises on tpu (`<id>  raises=<Type>  "
                            f"# <reason>`)")
        if test_id in entries:
            raise ListError(f"{where}: {test_id} is listed twice (first on line "
                            f"{entries[test_id].line})")
        entries[test_id] = Entry(test_id, raises, reason.strip(), n)
    return entries


# ---------------------------------------------------------------------------------------
# sub-cases

@dataclass
class SubcaseRecord:
    """What happened to one sub-case while its test ran."""

    ran: bool = False            # the test's call phase started with the sub-case hooked
    calls: int = 0               # tpu calls of the sub-case
    errors: list = field(default_factory=list)   # the exceptions they raised


def _device_type() -> str:
    import torch

    return torch._C._get_privateuse1_backend_name()


@contextlib.contextmanager
def _quantized(record: SubcaseRecord):
    """``torch.quantize_per_tensor`` of a tpu tensor: tried on tpu (recorded); when that
    raises, the quantized tensor is made from a CPU copy, so the test's quantized case
    runs on the CPU and the test goes on with its next (tpu) case."""
    import torch

    real = torch.quantize_per_tensor
    device = _device_type()

    def quantize_per_tensor(input, *args, **kwargs):
        if not (isinstance(input, torch.Tensor) and input.device.type == device):
            return real(input, *args, **kwargs)
        record.calls += 1
        try:
            return real(input, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - recorded, reported by the sub-case item
            record.errors.append(exc)
        with warnings.catch_warnings():  # PyTorch's deprecation notice, on our CPU call
            warnings.simplefilter("ignore", UserWarning)
            return real(input.cpu(), *args, **kwargs)

    torch.quantize_per_tensor = quantize_per_tensor
    record.ran = True
    try:
        yield
    finally:
        torch.quantize_per_tensor = real


#: sub-case name -> context manager (given a :class:`SubcaseRecord`) active while the
#: test runs
SUBCASES = {"quantized": _quantized}


class SubcaseItem(pytest.Item):
    """Reports one sub-case of the test before it (``<test id>[<sub-case>]``)."""

    def __init__(self, *, test_item, entry, record, **kwargs):
        super().__init__(**kwargs)
        self.test_item, self.entry, self.record = test_item, entry, record

    def runtest(self):
        rec, test = self.record, self.test_item.nodeid
        if not rec.ran:
            pytest.skip(f"{test} did not run in this process: its [{self.entry.subcase}] "
                        f"sub-case is reported with it")
        if rec.errors:
            raise rec.errors[0]
        if not rec.calls:
            pytest.fail(f"{test} never reached its [{self.entry.subcase}] sub-case on tpu "
                        f"(see that test's result; if upstream dropped the case, take "
                        f"{self.entry.test_id} off expected_failures.txt)", pytrace=False)
        # every tpu call of the sub-case worked: the item passes (XPASS(strict))

    def reportinfo(self):
        return self.path, None, self.nodeid


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    records = getattr(item, "_torchtpu_subcases", None)
    if not records:
        return (yield)
    with contextlib.ExitStack() as stack:
        for name, record in records.items():
            stack.enter_context(SUBCASES[name](record))
        return (yield)


@pytest.hookimpl(tryfirst=True)  # before -k deselects: ids only missing if gone
def pytest_collection_modifyitems(session, config, items):
    entries = load()
    subcases: dict[str, list[Entry]] = {}
    for e in entries.values():
        if e.subcase is not None:
            subcases.setdefault(e.base_id, []).append(e)
    seen = set()
    out = []
    for item in items:
        out.append(item)
        entry = entries.get(item.nodeid)
        if entry is not None:
            seen.add(entry.test_id)
            item.add_marker(pytest.mark.xfail(strict=True, raises=entry.raises,
                                              reason=entry.reason))
        for sub in subcases.get(item.nodeid, ()):
            seen.add(sub.test_id)
            record = SubcaseRecord()
            if not hasattr(item, "_torchtpu_subcases"):
                item._torchtpu_subcases = {}
            item._torchtpu_subcases[sub.subcase] = record
            probe = SubcaseItem.from_parent(item.parent, name=f"{item.name}[{sub.subcase}]",
                                            test_item=item, entry=sub, record=record)
            probe.add_marker(pytest.mark.xfail(strict=True, raises=sub.raises,
                                               reason=sub.reason))
            out.append(probe)
    items[:] = out
    files = {Path(str(a).split("::")[0]).name for a in config.args}
    # node ids on the command line (the fast subset): only those can be reported stale
    requested = {str(a) for a in config.args if "::" in str(a)}
    stale = sorted(t for t, e in entries.items() if t not in seen and t.split("::")[0] in files
                   and (not requested or e.base_id in requested))
    path = os.environ.get("TORCHTPU_UPSTREAM_STALE")
    if path:
        Path(path).write_text("".join(t + "\n" for t in stale))
