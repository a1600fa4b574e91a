"""torch.compile on tpu, as other libraries and tools drive it: transformers' static-cache
``generate()`` (which compiles the forward by itself with the Dynamo backend "tpu"),
``TORCHTPU_DUMP_DIR`` (FX and StableHLO text of each compiled graph) and
``torch._dynamo.explain``.  Each against the same code on CPU."""

import copy

import _budget
import pytest
import torch
import torch.nn as nn

import torchtpu

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    return LlamaForCausalLM(cfg).eval()


def _prompt():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (2, 6), generator=g)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0  # second row left-padded
    return ids, mask


class _CompileSnapshots:
    """A logits processor that records ``torchtpu.metrics()["compile"]`` at each decoding
    step (it runs after the step's forward)."""

    def __init__(self):
        self.steps = []

    def __call__(self, input_ids, scores):
        self.steps.append(dict(torchtpu.metrics()["compile"]))
        return scores


GEN = dict(max_new_tokens=8, do_sample=False, cache_implementation="static",
           output_logits=True, return_dict_in_generate=True)


def test_static_cache_generate_matches_cpu_and_does_not_recompile():
    from transformers import LogitsProcessorList

    model = _tiny_llama()
    ids, mask = _prompt()
    ref = model.generate(ids, attention_mask=mask, **GEN)  # CPU: not compiled

    model = model.to("tpu")
    torchtpu.reset_metrics()
    rec = _CompileSnapshots()
    out = model.generate(ids.to("tpu"), attention_mask=mask.to("tpu"),
                         logits_processor=LogitsProcessorList([rec]), **GEN)

    assert out.sequences.cpu().tolist() == ref.sequences.tolist()
    assert len(out.logits) == len(ref.logits) == 8
    for a, b in zip(out.logits, ref.logits):  # the static KV cache is written back right
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)
    # step 0 is the (eager) prefill; the forward of each later step is the compiled one
    first, last = rec.steps[1], rec.steps[-1]
    assert first["graphs_compiled"] == 1
    assert last["graph_calls"] - first["graph_calls"] == len(rec.steps) - 2
    assert last["graphs_compiled"] == first["graphs_compiled"]
    assert last["executables"] == first["executables"]
    assert last["recompiles"] == 0

    # a second generate() reuses the compiled forward: no graph, no executable
    again = model.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), **GEN)
    assert again.sequences.cpu().tolist() == ref.sequences.tolist()
    end = torchtpu.metrics()["compile"]
    assert end["graphs_compiled"] == first["graphs_compiled"]
    assert end["executables"] == first["executables"]
    assert end["recompiles"] == 0


@_budget.full_only  # (STRICT's test above runs the same graphs; DEFER_AND_FUSE stitching: test_compile_runtime)
def test_static_cache_generate_defer_and_fuse_matches_cpu():
    model = _tiny_llama()
    ids, mask = _prompt()
    ref = model.generate(ids, attention_mask=mask, **GEN)
    model = model.to("tpu")
    with torch.tpu.set_eager_mode("defer_and_fuse"):
        out = model.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), **GEN)
    assert out.sequences.cpu().tolist() == ref.sequences.tolist()
    for a, b in zip(out.logits, ref.logits):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- TORCHTPU_DUMP_DIR
def _files(d):
    return sorted(p.name for p in d.iterdir())


def test_dump_dir_writes_fx_and_stablehlo_per_graph(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHTPU_DUMP_DIR", str(tmp_path))
    (tmp_path / "graph_006.dynamo.fx.txt").write_text("an earlier run")

    def fn(x, w):
        return torch.sin(x) @ w

    x, w = torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)
    ref = fn(x, w)
    ref.sum().backward()
    xt = x.to("tpu")
    wt = w.detach().to("tpu").requires_grad_()
    out = torch.compile(fn, backend="tpu")(xt, wt)
    out.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach())
    torch.testing.assert_close(wt.grad.cpu(), w.grad)

    # numbering continues after the files already there; forward and backward of one
    # Dynamo graph share its number
    assert _files(tmp_path) == [
        "graph_006.dynamo.fx.txt",
        "graph_007.backward.fx.txt", "graph_007.backward.stablehlo.mlir",
        "graph_007.dynamo.fx.txt",
        "graph_007.forward.fx.txt", "graph_007.forward.stablehlo.mlir",
    ]
    assert (tmp_path / "graph_006.dynamo.fx.txt").read_text() == "an earlier run"
    fw = (tmp_path / "graph_007.forward.fx.txt").read_text()
    assert "torch.ops.aten.sin.default" in fw and "torch.ops.aten.mm.default" in fw
    assert "torch.sin" in (tmp_path / "graph_007.dynamo.fx.txt").read_text()
    assert "torch.ops.aten.mm.default" in (tmp_path / "graph_007.backward.fx.txt").read_text()
    fw_hlo = (tmp_path / "graph_007.forward.stablehlo.mlir").read_text()
    assert "stablehlo.sine" in fw_hlo and "stablehlo.dot_general" in fw_hlo
    assert "func.func public @main" in fw_hlo
    assert "stablehlo.dot_general" in (tmp_path / "graph_007.backward.stablehlo.mlir").read_text()


def test_dump_dir_one_stablehlo_file_per_executable(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHTPU_DUMP_DIR", str(tmp_path))

    def fn(x):
        return torch.cos(x) * 2

    f = torch.compile(fn, backend="tpu", dynamic=True)
    with torch.no_grad():
        for n in (3, 5):  # one symbolic graph, one executable per concrete shape
            x = torch.randn(n, 2)
            torch.testing.assert_close(f(x.to("tpu")).cpu(), fn(x))
    assert _files(tmp_path) == [
        "graph_000.dynamo.fx.txt",
        "graph_000.inference.exe1.stablehlo.mlir",
        "graph_000.inference.fx.txt",
        "graph_000.inference.stablehlo.mlir",
    ]
    assert "tensor<5x2xf32>" in (tmp_path / "graph_000.inference.exe1.stablehlo.mlir").read_text()
    assert "stablehlo.cosine" in (tmp_path / "graph_000.inference.stablehlo.mlir").read_text()


# ---------------------------------------------------------------- torch._dynamo.explain
def _breaking(x):
    y = torch.sin(x) + 1
    print("graph break", end="")
    z = y.cos() * 2
    if z.sum() > 0:  # data-dependent branch: a graph break
        z = z + 1
    return z.relu()


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 2)

    def forward(self, x):
        h = torch.relu(self.a(x))
        s = h.sum().item()  # Tensor.item: a graph break
        return self.b(h) * s


def _explain(fn, *args):
    torch._dynamo.reset()
    e = torch._dynamo.explain(fn)(*args)
    return (e.graph_count, e.graph_break_count, e.op_count,
            [type(r.reason).__name__ for r in e.break_reasons])


def test_dynamo_explain_on_tpu_matches_cpu(eager_mode, capsys):
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    net = _Net()
    want_fn = _explain(_breaking, x)
    want_net = _explain(net, x)
    assert want_fn[:2] == (3, 2) and want_net[:2] == (2, 1)
    assert _explain(_breaking, x.to("tpu")) == want_fn
    assert _explain(copy.deepcopy(net).to("tpu"), x.to("tpu")) == want_net
