"""Views read and write through executables that take the storage offset at run time.

A loop over rows (``buf[i] = row``, ``cache[:, pos] = k``, ``x[i].sum()``) must compile
once per view geometry, not once per ``i``, and give CPU's values for every geometry:
row, column, strided, bit-cast, conjugate and negative views, and views whose slab runs
past the end of the storage.
"""


import _budget
import pytest
import torch

import torchtpu

# eager_mode tests run in DEFER_AND_FUSE too in the default run (tests/conftest.py)
DEFER_BY_DEFAULT = True


def _misses():
    return torchtpu.metrics()["cache_misses"]


def test_row_loop_compiles_once_per_geometry(eager_mode):
    n = 48 + len(str(eager_mode))  # a shape of its own per mode: caches are shared
    src = torch.randn(n, 16)
    ref = torch.zeros(n, 16)
    x = torch.zeros(n, 16, device="tpu")
    s = src.to("tpu")
    sums_tpu, sums_cpu = [], []
    x[0] = s[0] * 2  # warm up: the executables for this geometry
    sums_tpu.append(x[0].sum())
    ref[0] = src[0] * 2
    sums_cpu.append(ref[0].sum())
    before = _misses()
    for i in range(1, 40):
        x[i] = s[i] * 2
        ref[i] = src[i] * 2
        sums_tpu.append(x[i].sum())
        sums_cpu.append(ref[i].sum())
    assert _misses() - before == 0, "a new executable per row offset"
    torch.testing.assert_close(x.cpu(), ref)
    torch.testing.assert_close(torch.stack(sums_tpu).cpu(), torch.stack(sums_cpu))


def test_column_kv_cache_writes_match_cpu(eager_mode):
    # a hand-written KV cache: cache[:, :, pos] = k, one position per step
    k = torch.randn(2, 3, 10, 4)
    cache_cpu = torch.zeros(2, 3, 10, 4)
    cache = cache_cpu.to("tpu")
    kt = k.to("tpu")
    for pos in range(10):
        cache_cpu[:, :, pos] = k[:, :, pos] + pos
        cache[:, :, pos] = kt[:, :, pos] + pos
        torch.testing.assert_close(cache[:, :, : pos + 1].mean(2).cpu(),
                                   cache_cpu[:, :, : pos + 1].mean(2))
    torch.testing.assert_close(cache.cpu(), cache_cpu)


@pytest.mark.parametrize("geometry", ["row", "col", "strided", "tail", "diag", "expand"])
def test_view_geometries_at_every_offset(geometry, eager_mode):
    def views(x, i):
        if geometry == "row":
            return x[i]
        if geometry == "col":
            return x[:, i]
        if geometry == "strided":
            return x[i, ::3]
        if geometry == "tail":  # slab past the storage's end: x[:, i:] with i > 0
            return x[:, i:]
        if geometry == "diag":  # not a slab: read through gathered indices
            return x[i:].diagonal()
        return x[i, :1].expand(3, 1)

    base = torch.randn(7, 7)
    xc, xt = base.clone(), base.to("tpu")
    for i in range(5):
        vc, vt = views(xc, i), views(xt, i)
        torch.testing.assert_close(vt.cpu(), vc)
        torch.testing.assert_close((vt * 3 - 1).cpu(), vc * 3 - 1)
        if geometry != "expand":  # CPU refuses in-place writes to expanded views
            vc.add_(i + 0.5)
            vt.add_(i + 0.5)
    torch.testing.assert_close(xt.cpu(), xc)


def test_bitcast_conj_and_neg_views_at_every_offset(eager_mode):
    f = torch.randn(6, 4)
    fc, ft = f.clone(), f.to("tpu")
    z = torch.randn(6, 4, dtype=torch.complex64)
    zc, zt = z.clone(), z.to("tpu")
    for i in range(6):
        bc, bt = fc.view(torch.int32)[i], ft.view(torch.int32)[i]
        torch.testing.assert_close(bt.cpu(), bc)
        bc.bitwise_xor_(1 << i)
        bt.bitwise_xor_(1 << i)
        cc, ct = zc.conj()[i], zt.conj()[i]
        torch.testing.assert_close(ct.cpu().resolve_conj(), cc.resolve_conj())
        cc.mul_(1 + 1j)
        ct.mul_(1 + 1j)
        nc, nt = torch._neg_view(fc)[:, i % 4], torch._neg_view(ft)[:, i % 4]
        torch.testing.assert_close(nt.cpu().resolve_neg(), nc.resolve_neg())
        nc.add_(2.0)
        nt.add_(2.0)
    torch.testing.assert_close(ft.cpu(), fc)
    torch.testing.assert_close(zt.cpu(), zc)


def test_reading_a_row_past_a_shrunk_storage_raises():
    # the same view geometry as an in-bounds row that ran before: the offset is checked
    # on the host, not compiled into the executable
    x = torch.ones(4, 2, device="tpu")
    y = torch.ones(4, 2, device="tpu")
    assert torch.equal((y[3] + 1).cpu(), torch.full((2,), 2.0))
    r = x[3]
    x.untyped_storage().resize_(4 * x.element_size())  # rows 0-1 stay
    assert torch.equal((x[1] + 1).cpu(), torch.full((2,), 2.0))
    with pytest.raises(RuntimeError, match="out of bounds for storage of size 16"):
        (r + 1).cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64])
def test_sparse_views_read_and_write_as_cpu(eager_mode, dtype):
    """Views whose few elements span a long stretch of storage (``x[:, i, :]`` of a
    ``(5, 3000, 3)`` tensor: 15 elements over 36,003) read and write by gather/scatter;
    every position, static and runtime offsets, equals CPU."""
    torch.manual_seed(0)
    src = torch.randn(5, 3000, 3).to(dtype)
    ref = torch.zeros(5, 1000, 3, dtype=dtype)
    x = torch.zeros(5, 1000, 3, dtype=dtype, device="tpu")
    s = src.to("tpu")
    for i in (0, 1, 17, 999, 2999, 1234):
        j = i % 1000
        x[:, j, :] = s[:, i, :] * 2
        ref[:, j, :] = src[:, i, :] * 2
        x[:, :, i % 3][:, j] += 1
        ref[:, :, i % 3][:, j] += 1
    torch.testing.assert_close(x.cpu(), ref)
    torch.testing.assert_close(s[:, 2999, :].cpu(), src[:, 2999, :])
    torch.testing.assert_close(s[1:4, ::700, 2].cpu(), src[1:4, ::700, 2])
    a = torch.as_strided(s, (4, 2), (4000, 2001), 7)
    torch.testing.assert_close(a.cpu(), torch.as_strided(src, (4, 2), (4000, 2001), 7))


VIEWS_OF_SMALL_STORAGES = {
    "row": lambda x: x[2],
    "column": lambda x: x[:, 1],
    "element": lambda x: x[3, 2],
    "transposed": lambda x: x.t(),
    "strided": lambda x: x[1::2, ::3],
    "expanded": lambda x: x[1:2].expand(3, 5),
    "empty": lambda x: x[2:2],
    "neg": lambda x: torch._neg_view(x[1:3]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool,
                                   torch.complex64])
def test_host_reads_of_views_of_small_storages_match_cpu(dtype, eager_mode):
    """``.cpu()``, ``.tolist()`` and ``.item()`` of a view of a small storage cut the
    view on the host from one copy of the storage (``host_reads.to_numpy``): no reader
    executable per view geometry, CPU's values, conj/neg bits applied."""
    from torchtpu.eager import host_reads

    torch.manual_seed(0)
    base = torch.randn(6, 5, dtype=torch.complex64 if dtype.is_complex else torch.float32)
    base = (base * 4).to(dtype)
    t = base.to("tpu")
    readers = len(host_reads._READERS)
    views = dict(VIEWS_OF_SMALL_STORAGES)
    if dtype.is_complex:
        views["conj"] = lambda x: x[1:4].conj()
        views["conj_neg"] = lambda x: torch._neg_view(x.conj()[::2])
    for name, view in views.items():
        if name.startswith("neg") and dtype is torch.bool:
            continue  # no neg view of bool on CPU either
        want, got = view(base), view(t)
        assert got.cpu().dtype == want.dtype and torch.equal(got.cpu(), want), name
        assert got.tolist() == want.tolist(), name
        if want.numel() == 1:
            assert got.item() == want.item(), name
    assert len(host_reads._READERS) == readers  # no executable was built to read
    # a write through one view is seen by the next host read of another
    t[2].fill_(1)
    base[2].fill_(1)
    assert torch.equal(t[:, 1].cpu(), base[:, 1])


def _random_view(rng, x):
    """A view of ``x`` made of the slicing a user writes: select, narrow with a step,
    transpose, unsqueeze."""
    v = x
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(["select", "slice", "transpose", "unsqueeze"])
        if kind == "select" and v.dim() > 0 and v.shape[0] > 0:
            d = rng.randrange(v.dim())
            v = v.select(d, rng.randrange(v.shape[d])) if v.shape[d] else v
        elif kind == "slice" and v.dim() > 0:
            d = rng.randrange(v.dim())
            n = v.shape[d]
            start = rng.randrange(n) if n else 0
            stop = rng.randint(start, n)
            idx = [slice(None)] * v.dim()
            idx[d] = slice(start, stop, rng.choice([1, 1, 2, 3]))
            v = v[tuple(idx)]
        elif kind == "transpose" and v.dim() > 1:
            a, b = rng.sample(range(v.dim()), 2)
            v = v.transpose(a, b)
        elif kind == "unsqueeze":
            v = v.unsqueeze(rng.randrange(v.dim() + 1))
    return v


# one seed in the default run (CI's time budget); TORCHTPU_FULL_TESTS=1: four
@pytest.mark.parametrize("seed", range(4 if _budget.FULL else 1))
def test_random_box_views_read_and_write_as_cpu(seed, eager_mode):
    """Random views of 1-3-D storages (including dims of size 1), read and written with
    an in-place op, equal CPU: boxes of the storage array read by ``dynamic_slice`` and
    written by ``dynamic_update_slice`` (``storage._WINDOWS``), the rest through the flat
    storage.  Also ``as_strided`` boxes that wrap past a row's end (not boxes)."""
    import random

    rng = random.Random(seed)
    for _ in range(25):
        shape = tuple(rng.choice([1, 2, 3, 5, 8]) for _ in range(rng.randint(1, 3)))
        base = torch.randn(shape)
        xc, xt = base.clone(), base.to("tpu")
        for _ in range(4):
            state = rng.getstate()
            vc = _random_view(rng, xc)
            rng.setstate(state)
            vt = _random_view(rng, xt)
            assert vt.shape == vc.shape and vt.stride() == vc.stride()
            torch.testing.assert_close((vt * 2 + 1).cpu(), vc * 2 + 1)
            k = rng.random()
            vc.add_(k)
            vt.add_(k)
            torch.testing.assert_close(xt.cpu(), xc)
    # (2, 3) boxes at every offset of a (4, 7) storage: from offset 5 on a row they wrap
    xc = torch.arange(28.0).reshape(4, 7)
    xt = xc.to("tpu")
    for off in range(0, 28 - 10):
        vc = torch.as_strided(xc, (2, 3), (7, 1), off)
        vt = torch.as_strided(xt, (2, 3), (7, 1), off)
        torch.testing.assert_close(vt.cpu(), vc)
        torch.testing.assert_close((vt + 0).cpu(), vc + 0)
        vc.mul_(1.5)
        vt.mul_(1.5)
        torch.testing.assert_close(xt.cpu(), xc)


def test_box_writes_compile_once_per_geometry(eager_mode):
    """``x0[:, j, :] = src[:, i, :]`` (PyTorch's index_copy test) over every ``j``: one
    executable, CPU's values."""
    src = torch.randn(5, 60, 3)
    ref = torch.zeros(5, 20 + len(str(eager_mode)), 3)
    x, s = ref.to("tpu"), src.to("tpu")
    x[:, 0, :] = s[:, 0, :]
    ref[:, 0, :] = src[:, 0, :]
    before = _misses()
    for i in range(1, 60):
        j = (7 * i) % ref.shape[1]
        x[:, j, :] = s[:, i, :]
        ref[:, j, :] = src[:, i, :]
    assert _misses() - before == 0, "a new executable per box position"
    torch.testing.assert_close(x.cpu(), ref)
