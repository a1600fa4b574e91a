"""Padded sequences (``torchtpu.eager.padded``): integer sequences moved to ``tpu`` are held
at a bucketed capacity and the ops of a transformer run on that capacity with the length
as a runtime value.  Every value is checked against CPU PyTorch and against the exact path
(padded sequences switched off); the counters show that the padded path ran, that a new
length compiles nothing and that nothing syncs with the host."""


import _budget
import pytest
import torch
import torch.nn.functional as F

import torchtpu
from torchtpu._tensor import storage as _st
from torchtpu.eager import padded

H, V = 16, 40


@pytest.fixture(autouse=True)
def _padded_on(strict_mode):
    padded.set_enabled(True)
    yield
    padded.set_enabled(True)


def _metrics():
    m = torchtpu.metrics()
    return m["padded"], m["compiles"], m["host_syncs_total"]


def _is_padded(t):
    return _st.data(t).arr.__class__ is _st.Grown


def _inputs(L, device, B=2):
    g = torch.Generator().manual_seed(L)
    ids = torch.randint(1, V, (B, L), generator=g)
    weight = torch.randn(V, H, generator=g)
    lin = torch.randn(3 * H, H, generator=g) * 0.3
    bias = torch.randn(3 * H, generator=g)
    ids = ids.to(device)
    return ids, weight.to(device), lin.to(device), bias.to(device)


def _attention(x, lin, bias, causal=True):
    B, L, _ = x.shape
    q, k, v = F.linear(x, lin, bias).view(B, L, 3, 2, H // 2).permute(2, 0, 3, 1, 4)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return o.transpose(1, 2).reshape(B, L, H)


def _rotate_half(x):
    x1, x2 = x[..., : H // 2], x[..., H // 2:]
    return torch.cat((-x2, x1), dim=-1)


CASES = {
    "pointwise": lambda x, ids, lin, b: ((x * 2 + 1).sin() / (x.abs() + 1),),
    "rms_norm": lambda x, ids, lin, b: (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),),
    "layer_norm": lambda x, ids, lin, b: (F.layer_norm(x, (H,)),),
    "linear": lambda x, ids, lin, b: (F.linear(x, lin, b), F.linear(x, lin)),
    "softmax_static": lambda x, ids, lin, b: (x.softmax(-1), x.log_softmax(-1)),
    "softmax_padded_dim": lambda x, ids, lin, b: (x.softmax(1), x.log_softmax(1)),
    "reduce_padded_dim": lambda x, ids, lin, b: (
        x.sum(1), x.amax(1), x.amin(1), (x > 0).all(1), (x > 0).any(1), x.sum(), x.max(),
        x.min(), ids.sum(1), (x * 0.1).prod(1), x.mean(1), (-x.abs()).sum(1)),
    "reduce_integer_extremes": lambda x, ids, lin, b: (
        (ids * 0).to(torch.uint8).amax(1), (ids * 0 + (-2**63)).amax(1),
        (ids * 0 - 128).to(torch.int8).max(), (ids * 0 + 255).to(torch.uint8).amin(1)),
    "multiple_outputs": lambda x, ids, lin, b: torch.frexp(x),
    "cumsum": lambda x, ids, lin, b: (x.cumsum(1), x.cumsum(-1), ids.cumsum(-1)),
    "attention": lambda x, ids, lin, b: (_attention(x, lin, b),
                                         _attention(x, lin, b, causal=False)),
    "rotary_cat": lambda x, ids, lin, b: (_rotate_half(x) * x.cos(),),
    "shifted_views": lambda x, ids, lin, b: (
        x[:, 1:] * 2, x[:, :-1] + 1, F.pad(ids, (0, 1), value=-100)[:, 1:].contiguous()),
    "arange": lambda x, ids, lin, b: (
        torch.arange(ids.shape[1], device=ids.device) * 2 + ids,),
    "inplace": lambda x, ids, lin, b: (_inplace(x),),
    "factories": lambda x, ids, lin, b: (
        torch.ones(ids.shape, dtype=torch.long, device=ids.device).cumsum(-1) + ids,
        torch.full((ids.shape[1], 3), 2.0, device=ids.device) * 3,
        torch.zeros(2, ids.shape[1], device=ids.device) + 1),
    "copies": lambda x, ids, lin, b: (
        torch.isin(ids, torch.tensor([3, 4], device=ids.device)),
        torch.empty_like(x).copy_(x * 2), x.clone().copy_(x.flip(1))),
    "like": lambda x, ids, lin, b: (torch.ones_like(ids) + ids, torch.zeros_like(x) - x,
                                    torch.full_like(x.transpose(1, 2), 3.0) * 2),
    "integer_division": lambda x, ids, lin, b: (ids // (ids + 1), ids % 3, ids.div(2)),
    "cut_ops": lambda x, ids, lin, b: (
        torch.sort(x, dim=1).values, x.flip(1), x @ x.transpose(1, 2), x[:, -1], x[:, -3:]),
}


def _inplace(x):
    y = x.clone()
    y.add_(1)
    y.masked_fill_(y > 1, 0.5)
    return y


def _cross_entropy(x, ids, lin, b):
    logits = F.linear(x, lin, b)  # (B, L, 3H): 3H classes
    labels = F.pad(ids, (0, 1), value=-100)[:, 1:].contiguous()
    flat = logits.view(-1, 3 * H).float()
    return tuple(F.cross_entropy(flat, labels.view(-1), ignore_index=-100, reduction=r)
                 for r in ("mean", "sum", "none"))


CASES["cross_entropy"] = _cross_entropy


def _run(case, L, device):
    ids, weight, lin, b = _inputs(L, device)
    x = F.embedding(ids, weight)
    return [t.cpu() for t in CASES[case](x, ids, lin, b)]


def _close(a, b, tol):
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    if a.dtype.is_floating_point:
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, equal_nan=True)
    else:
        assert torch.equal(a, b)


@pytest.mark.parametrize("case", _budget.every(sorted(CASES), 2))  # (all: TORCHTPU_FULL_TESTS=1)
# a length past a power of two (130: capacity 256) by default; TORCHTPU_FULL_TESTS=1 adds a
# length below the smallest capacity (9) -- CI's time budget
@pytest.mark.parametrize("L", [9, 130] if _budget.FULL else [130])
def test_padded_ops_match_cpu_and_the_exact_path(case, L):
    before, _, _ = _metrics()
    runs = before["runs"]
    got = _run(case, L, "tpu")
    assert _metrics()[0]["runs"] > runs  # the padded path ran
    want = _run(case, L, "cpu")
    for a, b in zip(got, want):
        _close(a, b, 1e-5)
    padded.set_enabled(False)
    exact = _run(case, L, "tpu")
    for a, b in zip(got, exact):
        _close(a, b, 2e-6)


def test_transfers_are_padded_and_read_back_exactly():
    ids = torch.arange(30).reshape(2, 15) * 7
    d = ids.to("tpu")
    assert _is_padded(d) and _st.data(d).arr.arr.shape == (2, 128)
    assert torch.equal(d.cpu(), ids) and d.tolist() == ids.tolist()
    assert d.untyped_storage().nbytes() == ids.untyped_storage().nbytes()
    # a 1-D integer family pads once it has met two lengths (automatic dynamic)
    a, b = torch.arange(5), torch.arange(7)
    assert not _is_padded(a.to("tpu"))
    assert _is_padded(b.to("tpu"))
    assert not _is_padded(torch.randn(2, 15).to("tpu"))  # floats (weights) never


def test_results_keep_logical_shape_and_strides():
    ids, weight, lin, b = _inputs(21, "tpu")
    idc, wc, linc, bc = _inputs(21, "cpu")
    x, xc = F.embedding(ids, weight), F.embedding(idc, wc)
    for f in (lambda t: t.transpose(1, 2) * 2, lambda t: F.linear(t, linc.to(t.device)),
              lambda t: t.permute(2, 0, 1).contiguous()):
        r, rc = f(x), f(xc)
        assert _is_padded(r)
        assert r.shape == rc.shape and r.stride() == rc.stride()
        _close(r.cpu(), rc, 1e-5)



def test_results_with_size_one_dims_keep_cpus_strides():
    # HF generate's position ids of a batch of 1 came out (1, 1)-strided, not (n, 1) as
    # on CPU: torch.compile's stride guards recompiled the model for the same shapes
    def f(ids):
        mask = torch.ones_like(ids)
        pos = mask.long().cumsum(-1) - 1
        x = ids.unsqueeze(-1).float()
        return (pos.masked_fill(mask == 0, 0), ids * 2 + 1, x * 3, (x + 1).transpose(0, 1),
                ids.unsqueeze(1) - 1, ids.t().clone())

    ids = torch.randint(0, 9, (1, 23))
    d = ids.to("tpu")
    assert _is_padded(d)
    for r, rc in zip(f(d), f(ids)):
        assert _is_padded(r)
        assert r.shape == rc.shape and r.stride() == rc.stride(), (r.stride(), rc.stride())
        _close(r.cpu(), rc, 0)

def _step(L, device):
    ids, weight, lin, b = _inputs(L, device)
    x = F.embedding(ids, weight)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    h = _attention(x, lin, b) + x
    return _cross_entropy(h, ids, lin, b)[0]


def test_a_new_length_compiles_nothing_and_syncs_nothing():
    _step(33, "tpu").cpu(), _step(47, "tpu").cpu()  # capacity 128: compiled here
    p0, c0, s0 = _metrics()
    loss = _step(61, "tpu")
    p1, c1, s1 = _metrics()
    assert c1 == c0, "a new length compiled"
    assert s1 == s0, "a padded op synced with the host"
    assert p1["cuts"] == p0["cuts"] and p1["host_cuts"] == p0["host_cuts"]
    assert p1["runs"] > p0["runs"]
    _close(loss.cpu(), _step(61, "cpu"), 1e-5)


def test_backward_through_padded_ops_matches_cpu():
    grads = {}
    for device in ("cpu", "tpu"):
        for L in (12, 29):
            ids, weight, lin, b = _inputs(L, device)
            weight.requires_grad_()
            lin.requires_grad_()
            x = F.embedding(ids, weight)
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            h = F.silu(_attention(x, lin, b)) + _attention(x, lin, b, causal=False)
            loss = _cross_entropy(h, ids, lin, b)[0]
            loss.backward()
            grads[device, L] = (loss.detach().cpu(), weight.grad.cpu(), lin.grad.cpu())
    for L in (12, 29):
        for a, b in zip(grads["tpu", L], grads["cpu", L]):
            _close(a, b, 1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_backward_of_a_sum_runs_padded(causal):
    # dO of ``out.sum()`` is an expand of a 0-d tensor, not a padded tensor
    grads = []
    cut = "torchtpu_attn.flash_bwd.default"
    cuts = _metrics()[0]["cut_ops"].get(cut, 0)
    for device in ("cpu", "tpu"):
        ids, weight, lin, b = _inputs(21, device)
        weight.requires_grad_()
        x = F.embedding(ids, weight).view(2, 21, 2, H // 2).transpose(1, 2)
        F.scaled_dot_product_attention(x, x * 0.5, x + 1, is_causal=causal).sum().backward()
        grads.append(weight.grad.cpu())
    assert _metrics()[0]["cut_ops"].get(cut, 0) == cuts
    _close(grads[1], grads[0], 1e-5)


def test_a_family_cut_every_step_stops_padding():
    # (batch 3, float64 sort: a family and an op no other test here uses)
    off = _metrics()[0]["families_off"]
    padded_steps = []
    for L in range(20, 30):
        ids = torch.randint(0, 9, (3, L), generator=torch.Generator().manual_seed(L))
        d = ids.to("tpu")
        padded_steps.append(_is_padded(d))
        got = torch.sort(d.double() * 2, dim=1).values  # no rule: a device cut per step
        assert torch.equal(got.cpu(), torch.sort(ids.double() * 2, dim=1).values)
    assert padded_steps[:2] == [True, True] and not any(padded_steps[3:])
    assert _metrics()[0]["families_off"] == off + 1


def test_off_switch_gives_exact_storages():
    padded.set_enabled(False)
    d = torch.arange(30).reshape(2, 15).to("tpu")
    assert not _is_padded(d)


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("with_mask", [True, False])
def test_generate_new_prompt_lengths_match_cpu_without_compiles(with_mask):
    m = _tiny_llama()
    md = _tiny_llama().to("tpu")
    compiles = []
    for L in (10, 13, 21):
        ids = torch.randint(0, 64, (1, L), generator=torch.Generator().manual_seed(L))
        kw = dict(max_new_tokens=8, do_sample=False)
        mask = torch.ones_like(ids)
        want = (m.generate(ids, attention_mask=mask, **kw) if with_mask
                else m.generate(ids, min_new_tokens=8, **kw))
        c0 = _metrics()[1]
        if with_mask:  # (without: generate() makes it, torch.ones of the ids' shape)
            got = md.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), **kw)
        else:
            got = md.generate(ids.to("tpu"), min_new_tokens=8, **kw)
        assert torch.equal(got.cpu(), want)
        compiles.append(_metrics()[1] - c0)
    assert compiles[-1] == 0, compiles


@pytest.fixture
def eager_buckets():
    # shape buckets from an op's first new shape (they pad through the host): a padded
    # sequence's capacity calls must never take them
    from torchtpu.eager import buckets

    buckets.set_policy(True, 0, buckets.DEFAULT_RECUR)
    yield
    buckets.set_policy(buckets.DEFAULT_ON, buckets.DEFAULT_AFTER, buckets.DEFAULT_RECUR)


def test_varlen_training_steps_match_cpu_without_compiles(eager_buckets):
    losses = {}
    compiles = []
    syncs0 = dict(torchtpu.metrics()["host_syncs"])
    for device in ("cpu", "tpu"):
        m = _tiny_llama().train().to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        for L in (20, 31, 44):
            ids = torch.randint(0, 64, (2, L), generator=torch.Generator().manual_seed(L))
            c0 = _metrics()[1]
            i = ids.to(device)
            loss = m(input_ids=i, labels=i).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[device, L] = loss.item()
            if device == "tpu":
                compiles.append(_metrics()[1] - c0)
    for L in (20, 31, 44):
        assert losses["tpu", L] == pytest.approx(losses["cpu", L], rel=1e-5)
    assert compiles[-1] == 0, compiles
    syncs = {k: v - syncs0.get(k, 0) for k, v in torchtpu.metrics()["host_syncs"].items()
             if v != syncs0.get(k, 0)}
    assert syncs == {"item": 3}, syncs  # the losses' .item(): nothing else


def test_compiled_graphs_reading_padded_inputs_keep_padding_on():
    # a graph input is cut to its exact array: not an op without a rule, so the family
    # must not back off (compiled generate() went back to exact transfers, and its eager
    # ops compiled per length again, from the third prompt)
    torch._dynamo.reset()
    f = torch.compile(lambda ids, mask: (ids * mask).sum(-1), backend="tpu")
    before = _metrics()[0]["families_off"]
    for L in (9, 11, 13, 15):
        ids = torch.randint(0, 9, (2, L))
        d = ids.to("tpu")
        assert _is_padded(d)
        mask = torch.ones_like(d)  # padded, of the transfer's family
        assert torch.equal(f(d, mask).cpu(), ids.sum(-1))
    assert _metrics()[0]["families_off"] == before
    torch._dynamo.reset()


def test_forget_makes_a_fill_of_a_recent_length_plain_again():
    """A fill whose length recent token ids had is padded at once (position-like
    tensors); ``padded.forget()`` (the test fixture ``fresh_shape_buckets`` calls it)
    forgets those lengths, so the same fill is a plain storage, and values match CPU
    either way."""
    for n in (50, 64):
        torch.ones(2, n, dtype=torch.long).to("tpu")
    t = torch.ones(64, 32, device="tpu")
    assert _is_padded(t)
    torch.testing.assert_close(t.cos().cpu(), torch.ones(64, 32).cos())
    padded.forget()
    u = torch.ones(64, 32, device="tpu")
    assert not _is_padded(u)
    torch.testing.assert_close(u.cos().cpu(), torch.ones(64, 32).cos())
