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


def test_llama_training_step_over_lengths_matches_cpu(checked_substitution):
    tf = pytest.importorskip("transformers")

    def model():
        torch.manual_seed(0)
        cfg = tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=1, max_position_embeddings=64)
        return tf.LlamaForCausalLM(cfg)

    def run(device, compiled):
        m = model().to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)

        def step(ids):
            loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()

        if compiled:
            step = torch.compile(step, backend="tpu", dynamic=True)
        out = []
        for n in (9, 13, 17):
            ids = torch.randint(0, 64, (2, n), generator=torch.Generator().manual_seed(n))
            out.append(float(step(ids.to(device))))
        return out

    got = run(TPU, True)
    want = run("cpu", False)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-5)
    assert checked_substitution, "no call took the substitution"
