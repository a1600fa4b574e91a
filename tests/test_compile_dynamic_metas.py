"""Graphs with symbolic sizes (``torch.compile(dynamic=True)``) take each new concrete
shape's fake values from their symbolic ones by substitution
(``compile.graph._substituted_metas``) instead of re-propagating fake tensors: the
geometry must be exactly what fake-tensor propagation gives, and the results CPU's."""

from __future__ import annotations

import pytest
import torch

from torchtpu.compile import graph as _graph

TPU = "tpu"


def _geometry(v):
    """What a lowering reads of a fake value.  A size-1 dim's stride addresses nothing:
    the symbolic trace and the concrete one may differ there (Inductor's outputs take the
    symbolic one, as the substitution does).  (The substitution's tensors are on the
    meta device.)"""
    if isinstance(v, torch.Tensor):
        stride = tuple(None if d == 1 else st for d, st in zip(v.shape, v.stride()))
        return ("t", tuple(v.shape), stride, int(v.storage_offset()), v.dtype,
                int(v.untyped_storage().nbytes()))
    if isinstance(v, (list, tuple)):
        return tuple(_geometry(x) for x in v)
    if isinstance(v, torch.SymInt):
        return ("symint",)  # (not concrete: fake propagation keeps SymInt outputs)
    return v


@pytest.fixture
def checked_substitution(monkeypatch):
    """Every substitution is compared, node by node, with fake-tensor propagation."""
    used = []
    real = _graph._substituted_metas

    def both(gm, placeholders, args):
        sub = real(gm, placeholders, args)
        if sub is not None:
            prop = _graph._concrete_metas(gm, placeholders, args)
            for n in gm.graph.nodes:
                if n.op == "output":
                    continue  # (read through its argument nodes)
                want = _geometry(prop[n])
                if want == ("symint",) or isinstance(prop[n], torch.SymInt):
                    continue
                assert _geometry(sub[n]) == want, (n.name, n.target)
            used.append(len(sub))
        return sub

    monkeypatch.setattr(_graph, "_substituted_metas", both)
    torch._dynamo.reset()
    yield used
    torch._dynamo.reset()


def test_views_slices_and_cats_of_symbolic_sizes_match_cpu(checked_substitution):
    def f(x, y):
        a = x.transpose(0, 1)[1:].reshape(-1)
        b = torch.cat([x, y], dim=0).narrow(0, 1, x.shape[0])
        c = x.unsqueeze(0).expand(2, -1, -1).sum(0)
        return a * 2, (b + c).t().contiguous(), x[:, 1:2].flatten()

    fc = torch.compile(f, backend="tpu", dynamic=True)
    for n in (5, 7, 11):
        x = torch.randn(n, 6)
        y = torch.randn(n + 2, 6)
        got = fc(x.to(TPU), y.to(TPU))
        for g, w in zip(got, f(x, y)):
            assert g.shape == w.shape and g.stride() == w.stride()
            torch.testing.assert_close(g.cpu(), w)
    assert checked_substitution, "no call took the substitution"


def _tiny_llama():
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=64)
    return tf.LlamaForCausalLM(cfg)


def _train_over_lengths(device, lengths, compiled, optimizer, read_each_step):
    """A tiny Llama trained one step per sequence length (forward, backward, the
    optimizer's step and ``zero_grad`` in one function, compiled with ``dynamic=True`` on
    tpu); ``read_each_step=False``: no host read between the steps.  Returns the losses
    and the final parameters (on the CPU)."""
    m = _tiny_llama().to(device)
    opt = optimizer(m.parameters())

    def step(ids):
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    if compiled:
        step = torch.compile(step, backend="tpu", dynamic=True)
    out = []
    for n in lengths:
        ids = torch.randint(0, 64, (2, n), generator=torch.Generator().manual_seed(n))
        loss = step(ids.to(device))
        out.append(float(loss) if read_each_step else loss)
    return [float(x) for x in out], [p.detach().cpu() for p in m.parameters()]


def test_llama_training_step_over_lengths_matches_cpu(checked_substitution):
    def sgd(params):
        return torch.optim.SGD(params, lr=0.1)

    got, _ = _train_over_lengths(TPU, (9, 13, 17), True, sgd, True)
    want, _ = _train_over_lengths("cpu", (9, 13, 17), False, sgd, True)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-5)
    assert checked_substitution, "no call took the substitution"


@pytest.mark.usefixtures("strict_mode", "no_stored_executables")
def test_adamw_steps_over_lengths_without_reads_match_cpu():
    """Regression (with no stored executables, as in a fresh cache): the optimizer
    graph's stitched segment meets a new shape each length, so it runs op by op
    (``defer._replay``); a first call there compiled on a worker
    (``eager.async_compile``) and the next op, whose executable was built, got the
    pending value instead of an array (``TypeError: ... Lazy ... is not a valid JAX
    type``)."""
    def adamw(params):
        return torch.optim.AdamW(params, lr=1e-2)

    torch._dynamo.reset()
    lengths = (9, 13, 17, 22, 27, 9, 30, 35)
    got, got_p = _train_over_lengths(TPU, lengths, True, adamw, False)
    want, want_p = _train_over_lengths("cpu", lengths, False, adamw, False)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)
    for g, w in zip(got_p, want_p):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
