"""The upstream-test runner itself (test_torch_upstream.py) and its pytest plugin
(torchtpu_upstream_xfail.py): the expected-failure list's format, the line a missing
upstream file produces, and what the plugin reports for listed tests and sub-cases (on a
small test file of our own, written to a temporary folder)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import test_torch_upstream as runner
import torchtpu_upstream_xfail as plugin

HERE = Path(__file__).resolve().parent
ID = "test_x.py::TestXPRIVATEUSE1::test_y_tpu_float32"


def _list(tmp_path, *lines):
    path = tmp_path / "expected_failures.txt"
    path.write_text("# a comment\n\n" + "\n".join(lines) + "\n")
    return path


def test_an_entry_names_its_test_exception_and_reason(tmp_path):
    entries = plugin.load(_list(
        tmp_path, f"{ID}  raises=NotImplementedError  # no lowering",
        f"{ID.replace('y_tpu', 'z_tpu')}[quantized]  raises=torch.OutOfMemoryError  # a"))
    e = entries[ID]
    assert (e.raises, e.reason, e.base_id, e.subcase) == (
        NotImplementedError, "no lowering", ID, None)
    import torch

    sub = entries[ID.replace("y_tpu", "z_tpu") + "[quantized]"]
    assert (sub.raises, sub.subcase) == (torch.OutOfMemoryError, "quantized")
    assert sub.base_id == ID.replace("y_tpu", "z_tpu")


def test_an_entry_without_raises_is_rejected(tmp_path):
    with pytest.raises(plugin.ListError, match=r":3: .* has no raises=<ExceptionType>"):
        plugin.load(_list(tmp_path, f"{ID}  # complex32 unsupported (NotImplementedError)"))


@pytest.mark.parametrize("line, message", [
    (f"{ID}  raises=NotImplementedError", "without a reason"),
    ("test_x.py::TestXPRIVATEUSE1::test_*_tpu_complex32  raises=NotImplementedError  # c",
     "is a pattern; an entry names a single test"),
    (f"{ID}  raises=NoSuchError  # r", "raises=NoSuchError is not an exception type"),
    (f"{ID}  raises=int  # r", "raises=int is not an exception type"),
    (f"{ID}[sparse]  raises=RuntimeError  # r", r"unknown sub-case \[sparse\]"),
    (f"{ID}  raises=RuntimeError  raises=TypeError  # r", "unexpected 'raises=TypeError'"),
    (f"{ID}  raise=RuntimeError  # r", "unexpected 'raise=RuntimeError'"),
    (f"test_y_tpu  raises=RuntimeError  # r", "is not a test id"),
])
def test_malformed_entries_are_rejected(tmp_path, line, message):
    with pytest.raises(plugin.ListError, match=message):
        plugin.load(_list(tmp_path, line))


def test_an_entry_listed_twice_is_rejected(tmp_path):
    with pytest.raises(plugin.ListError, match="listed twice"):
        plugin.load(_list(tmp_path, f"{ID}  raises=RuntimeError  # a",
                          f"{ID}  raises=TypeError  # b"))


def test_the_shipped_list_names_single_tests_with_their_exception():
    entries = plugin.load()
    assert len(entries) > 1000
    assert all(issubclass(e.raises, BaseException) and "*" not in t
               for t, e in entries.items())
    assert ("test_shape_ops.py::TestShapeOpsPRIVATEUSE1::test_flip_tpu_float32[quantized]"
            in entries)
    # the float32 cases of test_flip run: the test itself is not listed
    assert "test_shape_ops.py::TestShapeOpsPRIVATEUSE1::test_flip_tpu_float32" not in entries


def test_a_missing_file_skips_with_one_line_naming_the_variable(tmp_path, monkeypatch):
    clone = tmp_path / "clone"  # a clone with no shared/torch_tests above it
    clone.mkdir()
    monkeypatch.setattr(runner, "REPO", clone)
    monkeypatch.setenv("TORCHTPU_TORCH_TESTS", "fast")
    monkeypatch.setenv("TORCHTPU_TORCH_TESTS_DIR", str(tmp_path))
    with pytest.raises(pytest.skip.Exception) as info:
        runner.test_upstream_file("test_indexing.py")
    assert str(info.value) == (
        f"torchtpu_upstream: test_indexing.py not found in {tmp_path}: ran nothing (set "
        f"TORCHTPU_TORCH_TESTS_DIR=<folder> to a local copy of PyTorch's "
        f"test/test_indexing.py, see docs/conformance/torch-tests.md)")
    monkeypatch.delenv("TORCHTPU_TORCH_TESTS_DIR")
    assert "(TORCHTPU_TORCH_TESTS_DIR unset, no shared/torch_tests beside the clone)" in (
        runner.absent_line("test_indexing.py"))


def test_a_tests_dir_that_does_not_exist_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHTPU_TORCH_TESTS", "fast")
    monkeypatch.setenv("TORCHTPU_TORCH_TESTS_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(BaseException) as info:  # a failure, not a skip
        runner.test_upstream_file("test_indexing.py")
    assert info.type is pytest.fail.Exception, info.value
    assert f"TORCHTPU_TORCH_TESTS_DIR names {tmp_path / 'nowhere'}, not a folder" in str(
        info.value)


def test_pytest_rs_lists_the_missing_file(tmp_path):
    name = next((n for n in runner.FILES
                 if runner.find_file(n, {"TORCHTPU_TORCH_TESTS_DIR": str(tmp_path)}) is None),
                None)
    if name is None:
        pytest.skip("every upstream file is in shared/torch_tests here")
    env = dict(os.environ, TORCHTPU_TORCH_TESTS="fast", TORCHTPU_TORCH_TESTS_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs",
         str(HERE / "test_torch_upstream.py"), "-k", name.removesuffix(".py")],
        env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if f"{name} not found" in ln]
    assert len(lines) == 1, proc.stdout
    assert lines[0].startswith("SKIPPED [1] ")
    expected = runner.absent_line(name, {"TORCHTPU_TORCH_TESTS_DIR": str(tmp_path)})
    assert expected.startswith(f"torchtpu_upstream: {name} not found in {tmp_path}")
    assert lines[0].endswith(": " + expected)


FAKE_UPSTREAM = '''
import torch
import unittest


class TestFakeTPU(unittest.TestCase):
    def test_listed_tpu(self):
        raise NotImplementedError("no lowering")

    def test_listed_with_another_exception_tpu(self):
        raise RuntimeError("not what the list says")

    def test_listed_but_passes_tpu(self):
        pass

    def test_cases_tpu(self):
        # a float case, its quantized copy, the next float case (as upstream test_flip)
        for quantized in (False, True, False):
            x = torch.arange(4.0, device="tpu")
            if quantized:
                torch.quantize_per_tensor(x, 0.1, 5, torch.quint8).flip(0)
            else:
                self.assertEqual(x.flip(0).tolist(), [3.0, 2.0, 1.0, 0.0])

    def test_cases_never_quantized_tpu(self):
        torch.arange(4.0, device="tpu").flip(0)
'''


def test_the_plugin_reports_listed_tests_and_sub_cases(tmp_path):
    folder = tmp_path / "upstream"
    folder.mkdir()
    (folder / "test_fake.py").write_text(textwrap.dedent(FAKE_UPSTREAM))
    t = "test_fake.py::TestFakeTPU::"
    listed = _list(
        tmp_path,
        f"{t}test_listed_tpu  raises=NotImplementedError  # no lowering",
        f"{t}test_listed_with_another_exception_tpu  raises=NotImplementedError  # x",
        f"{t}test_listed_but_passes_tpu  raises=NotImplementedError  # fixed since",
        f"{t}test_cases_tpu[quantized]  raises=NotImplementedError  # quantized unsupported",
        f"{t}test_cases_never_quantized_tpu[quantized]  raises=NotImplementedError  # gone",
        f"{t}test_removed_upstream_tpu  raises=NotImplementedError  # stale")
    rc, out, stale, _ = runner.run_child(
        folder, ["test_fake.py"], extra_env={"TORCHTPU_UPSTREAM_LIST": str(listed)},
        args=["-rA", "-p", "no:randomly"])
    outcomes = {"PASSED", "FAILED", "XFAIL", "XPASS", "SKIPPED", "ERROR"}
    results = {ln.split()[1]: ln.split()[0] for ln in out.splitlines()
               if ln.split(" ")[0] in outcomes and ln.count(" ")}
    assert results == {
        f"{t}test_listed_tpu": "XFAIL",
        f"{t}test_listed_with_another_exception_tpu": "FAILED",   # raises= is checked
        f"{t}test_listed_but_passes_tpu": "FAILED",               # XPASS(strict)
        f"{t}test_cases_tpu": "PASSED",                           # its float cases ran
        f"{t}test_cases_tpu[quantized]": "XFAIL",
        f"{t}test_cases_never_quantized_tpu": "PASSED",
        f"{t}test_cases_never_quantized_tpu[quantized]": "FAILED",  # never reached
    }, out
    assert rc != 0
    assert stale == [f"{t}test_removed_upstream_tpu"]
    assert "never reached its [quantized] sub-case on tpu" in out


def test_named_reasons_resolve_and_must_be_defined(tmp_path):
    ListError, load = plugin.ListError, plugin.load
    good = tmp_path / "good.txt"
    good.write_text("#@c32: complex32 unsupported\n"
                    "test_a.py::TestA::test_x  raises=NotImplementedError  # @c32\n")
    assert load(good)["test_a.py::TestA::test_x"].reason == "complex32 unsupported"
    bad = tmp_path / "bad.txt"
    bad.write_text("test_a.py::TestA::test_x  raises=NotImplementedError  # @c32\n")
    with pytest.raises(ListError, match="not defined"):
        load(bad)
