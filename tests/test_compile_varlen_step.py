"""A whole training step (forward, backward, AdamW) under ``torch.compile(dynamic=True)``
over changing sequence lengths, against CPU.

Regression (with no stored executables, as in a fresh cache): the optimizer graph's stitched segment meets a new shape each length, so it
runs op by op (``defer._replay``); an op's first call there compiled on a worker
(``eager.async_compile``) and the next op, whose executable was built, got the pending
value instead of an array (``TypeError: ... Lazy ... is not a valid JAX type``)."""

import pytest
import torch

pytestmark = pytest.mark.usefixtures("strict_mode", "no_stored_executables")


def _model():
    import transformers as tf

    cfg = tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=64)
    return tf.LlamaForCausalLM(cfg)


def _train(device, lengths, compiled):
    torch.manual_seed(0)
    m = _model().to(device)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)

    def step(ids):
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    if compiled:
        step = torch.compile(step, backend="tpu", dynamic=True)
    losses = []
    for n in lengths:
        ids = torch.randint(0, 64, (2, n), generator=torch.Generator().manual_seed(n))
        losses.append(step(ids.to(device)))  # (no sync between the steps)
    return [float(x) for x in losses], [p.detach().cpu() for p in m.parameters()]


def test_compiled_varlen_training_matches_cpu():
    torch._dynamo.reset()
    lengths = [9, 13, 17, 22, 27, 9, 30, 35]
    got, got_p = _train("tpu", lengths, compiled=True)
    want, want_p = _train("cpu", lengths, compiled=False)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)
    for g, w in zip(got_p, want_p):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
