"""Graphs with data-dependent nodes (``item()``, ``nonzero``, boolean masks, ``unique``,
``repeat_interleave(tensor)``) captured by Dynamo (``capture_scalar_outputs``,
``capture_dynamic_output_shape_ops``) and cut by the tpu backend into compiled stretches
between eager sync nodes (``torchtpu.compile.staged``), against CPU eager."""

import pytest
import torch

import torchtpu

TPU = "tpu"


pytestmark = pytest.mark.usefixtures("capture_data_dependent_ops")


def _f(x):
    idx = torch.nonzero(x > 0)
    sel = x[x > 0.5]
    n = (x > 0).sum().item()
    head = torch.narrow(x.flatten(), 0, 0, n)
    return idx * 2, sel.sin(), head + 1, sel.sum() + head.sum()


def test_data_dependent_graph_matches_cpu_for_changing_counts(eager_mode):
    g = torch.compile(_f, backend="tpu", fullgraph=True)
    before = torchtpu.metrics()["compile"]
    for seed in (0, 1, 0, 2):  # counts change from call to call; seed 0 comes back
        torch.manual_seed(seed)
        x = torch.randn(4, 5)
        got, want = g(x.to(TPU)), _f(x)
        for a, b in zip(got, want):
            assert a.device.type == TPU
            torch.testing.assert_close(a.cpu(), b)
    after = torchtpu.metrics()["compile"]
    assert after["graphs_compiled"] - before["graphs_compiled"] == 1  # no recompile
    assert after["staged_graphs"] - before["staged_graphs"] == 1
    assert after["eager_stages"] > before["eager_stages"]


def test_data_dependent_training_step_gradients_match_cpu():
    def loss_fn(w, x):
        y = (x @ w).relu()
        picked = y[y > 0.1]  # a boolean mask: the count is read from the values
        k = (y > 0.1).sum().item()
        return picked.square().sum() / max(k, 1) + torch.unique(x.round()).sum() * 0

    torch.manual_seed(0)
    w = torch.randn(6, 3, requires_grad=True)
    x = torch.randn(8, 6)
    wt = w.detach().to(TPU).requires_grad_()
    g = torch.compile(loss_fn, backend="tpu", fullgraph=True)
    for _ in range(2):
        got = g(wt, x.to(TPU))
        want = loss_fn(w, x)
        got.backward()
        want.backward()
        torch.testing.assert_close(got.cpu(), want)
        torch.testing.assert_close(wt.grad.cpu(), w.grad)


@pytest.mark.parametrize("case", ["unique", "unique_consecutive", "repeat_interleave",
                                  "masked_select", "argwhere", "bincount"])
def test_data_dependent_ops_inside_a_compiled_graph(case):
    fns = {
        "unique": lambda x, r: torch.unique(x.round(), return_inverse=True,
                                            return_counts=True),
        "unique_consecutive": lambda x, r: torch.unique_consecutive(
            x.round().sort().values, return_counts=True),
        "repeat_interleave": lambda x, r: torch.repeat_interleave(x * 2, r, dim=0),
        "masked_select": lambda x, r: torch.masked_select(x, x > 0) * 3,
        "argwhere": lambda x, r: torch.argwhere(x > 0) + 1,
        "bincount": lambda x, r: torch.bincount(r, minlength=2) * 2,
    }
    fn = fns[case]
    torch.manual_seed(5)
    x = torch.randn(6) * 3
    r = torch.randint(0, 4, (6,))
    got = torch.compile(fn, backend="tpu", fullgraph=True)(x.to(TPU), r.to(TPU))
    want = fn(x, r)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu(), b)


def test_range_assert_of_an_unbacked_size_raises():
    # PyTorch bounds masked_select's count by the input's numel, even where the mask
    # broadcasts the input to more elements; aot_eager on CPU raises the same assertion
    x = torch.randn(3)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="u0 <= 3"):
        torch.compile(torch.masked_select, backend="aot_eager", fullgraph=True)(x, m)
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="u0 <= 3"):
        torch.compile(torch.masked_select, backend="tpu", fullgraph=True)(x.to(TPU),
                                                                         m.to(TPU))


def test_float_item_in_later_arithmetic():
    # PyTorch turns a float item() used in arithmetic back into a tensor with
    # prims.convert_element_type, which had no lowering
    def fn(x):
        return x * x.max().item() + x.sum().item()

    x = torch.tensor([1.0, 2.0, -0.5])
    got = torch.compile(fn, backend="tpu", fullgraph=True)(x.to(TPU))
    torch.testing.assert_close(got.cpu(), fn(x))


@pytest.mark.parametrize("compiled", [False, True])
def test_bincount_of_an_empty_input_with_weights_is_int64_as_on_cpu(compiled):
    def fn(x, w):
        return torch.bincount(x, w, minlength=3)

    f = torch.compile(fn, backend="tpu", fullgraph=True) if compiled else fn
    for wdt in (torch.float32, torch.float64):
        x, w = torch.tensor([], dtype=torch.long), torch.tensor([], dtype=wdt)
        got, want = f(x.to(TPU), w.to(TPU)), fn(x, w)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want)
        x, w = torch.tensor([0, 2, 2]), torch.tensor([0.5, 1.0, 2.0], dtype=wdt)
        got, want = f(x.to(TPU), w.to(TPU)), fn(x, w)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want)


def test_masked_assignment_checks_the_count_as_cpu():
    # x[mask] = values with the wrong number of values: CPU raises "shape mismatch";
    # the compiled graph wrote the first values silently
    def put(x, v):
        x[x > 0] = v
        return x * 1

    f = torch.compile(put, backend="tpu", fullgraph=True)
    x, bad, good = torch.tensor([1.0, -1.0, 2.0]), torch.tensor([10.0, 20.0, 30.0]), \
        torch.tensor([10.0, 20.0])
    with pytest.raises(RuntimeError) as cpu:
        put(x.clone(), bad)
    with pytest.raises(RuntimeError) as tpu:
        f(x.clone().to(TPU), bad.to(TPU))
    assert str(tpu.value) == str(cpu.value)
    torch.testing.assert_close(f(x.clone().to(TPU), good.to(TPU)).cpu(), put(x.clone(), good))
    # a value that fits any count needs no count: the graph is not cut
    before = torchtpu.metrics()["compile"]["staged_graphs"]

    def zero(x):
        x[x > 0] = 0.0
        return x * 1

    torch.testing.assert_close(torch.compile(zero, backend="tpu", fullgraph=True)(
        x.clone().to(TPU)).cpu(), zero(x.clone()))
    assert torchtpu.metrics()["compile"]["staged_graphs"] == before


LAYOUT_CASES = {  # CPU lays these results out column-major (values as before)
    "nonzero": lambda t: torch.nonzero(t),
    "argwhere": lambda t: torch.argwhere(t),
    "unique_dim1": lambda t: torch.unique(t, dim=1),
    "unique_consecutive_dim2": lambda t: torch.unique_consecutive(t, dim=2),
    "geqrf": lambda t: torch.geqrf(t.double())[0],
}


@pytest.mark.parametrize("name", sorted(LAYOUT_CASES))
def test_results_have_cpus_strides(name, eager_mode):
    fn = LAYOUT_CASES[name]
    for x in (torch.tensor([[[1, 0, 1], [3, 4, 3]], [[1, 0, 1], [3, 4, 3]]]),
              torch.zeros(2, 3, 1, dtype=torch.long)):
        if name == "geqrf":  # a (2, 3) and a batched (2, 3, 1) matrix
            x = x[0] + torch.eye(2, 3, dtype=torch.long) if x.shape[-1] == 3 else x + 1
        want = fn(x)
        got = fn(x.to(TPU))
        assert got.stride() == want.stride() and got.shape == want.shape
        torch.testing.assert_close(got.cpu(), want)
        compiled = torch.compile(fn, backend="tpu", fullgraph=True)(x.to(TPU))
        assert compiled.stride() == want.stride()
        torch.testing.assert_close(compiled.cpu(), want)
        torch._dynamo.reset()
