"""PEFT (LoRA), TRL (SFTTrainer) and mixture-of-experts transformers models (Mixtral,
Qwen2-MoE) on ``tpu`` give the values of the same code on the CPU: tiny models built from
configs (no download), the same initial weights (``copy.deepcopy`` before ``.to``), the
same data and seeds."""

import copy

import _budget
import pytest
import torch

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("no_cpu_fallback")

RTOL, ATOL = 1e-4, 1e-5  # float32


def _tiny_llama(seed=0):
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


def _ids(batch=2, seq=8, vocab=128, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g)


# ---------------------------------------------------------------------- PEFT


def _lora_model(base):
    peft = pytest.importorskip("peft")
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                          lora_dropout=0.0)
    model = peft.get_peft_model(base, cfg)
    # LoRA's B starts at zero: a nonzero B makes the adapters change the forward from
    # the first step, so a wrong LoRA path shows in the first loss too
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model


def _lora_train(model, device, steps=3):
    model.to(device).train()
    ids = _ids().to(device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses, grads = [], []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grads.append({n for n, p in model.named_parameters() if p.grad is not None})
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().cpu())
    state = {n: p.detach().cpu() for n, p in model.named_parameters()}
    return torch.stack(losses), grads, state


def test_peft_lora_training_matches_cpu():
    model = _lora_model(_tiny_llama())
    ref = copy.deepcopy(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    assert len(trainable) == 2 * 2 * 2  # 2 layers x (q_proj, v_proj) x (A, B)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    losses, grads, state = _lora_train(model, "tpu")
    assert next(model.parameters()).device.type == "tpu"
    exp_losses, exp_grads, exp_state = _lora_train(ref, "cpu")

    torch.testing.assert_close(losses, exp_losses, rtol=RTOL, atol=ATOL)
    assert grads == exp_grads == [trainable] * 3  # only the LoRA parameters get grads
    for n in trainable:
        torch.testing.assert_close(state[n], exp_state[n], rtol=RTOL, atol=ATOL, msg=n)
        assert not torch.equal(state[n], before[n]), n  # the steps moved every adapter
    for n in set(state) - trainable:
        assert torch.equal(state[n], before[n]), n  # frozen base weights stay bit-equal

    # merge_and_unload folds B @ A * scaling into q_proj/v_proj on each device
    merged = model.merge_and_unload()
    exp_merged = ref.merge_and_unload()
    assert type(merged) is transformers.LlamaForCausalLM
    m_state, e_state = merged.state_dict(), exp_merged.state_dict()
    assert m_state.keys() == e_state.keys()
    assert not any("lora" in k for k in m_state)
    for k in m_state:
        assert m_state[k].device.type == "tpu"
        torch.testing.assert_close(m_state[k].cpu(), e_state[k], rtol=RTOL, atol=ATOL, msg=k)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(e_state[q], before["base_model.model." + q.replace(
        "q_proj.weight", "q_proj.base_layer.weight")])
    ids = _ids(seed=3)
    with torch.no_grad():
        out = merged.eval()(input_ids=ids.to("tpu")).logits.cpu()
        exp = exp_merged.eval()(input_ids=ids).logits
    torch.testing.assert_close(out, exp, rtol=RTOL, atol=ATOL)


# ----------------------------------------------------------------------- TRL

_CHARS = "abcdefghijklmnopqrstuvwxyz .,!?'"


def _char_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + list(_CHARS))}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split("", behavior="isolated")
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        unk_token="<unk>")
    return fast


_TEXTS = ["the cat sat on the mat.", "a dog ran far away!", "is it raining today?",
          "we like tiny models.", "hello there, friend.", "torch runs on the tpu.",
          "one two three four.", "good night, moon!"]


def _sft_run(tmp_path, base, use_cpu):
    # adam_epsilon=1e-4, not 1e-8: Adam's first step moves every weight by about
    # lr * g / (|g| + eps), so with eps=1e-8 the weights whose float32 gradient is
    # rounding noise (|g| < 1e-7 here, on both devices) move by +-lr in a random
    # direction: CPU float32 and tpu then both end 2e-2 from a float64 run, and the
    # second loss differs by 1e-4 between them (gradients of the first batch agree with
    # float64 to 7e-7 on both); the larger eps keeps the comparison conditioned
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    tok = _char_tokenizer()
    ds = datasets.Dataset.from_dict({"text": _TEXTS})
    args = trl.SFTConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2,
                         report_to=[], use_cpu=use_cpu, logging_steps=1, learning_rate=1e-2,
                         save_strategy="no", disable_tqdm=True, seed=0, max_length=32,
                         dataloader_num_workers=0, adam_epsilon=1e-4)
    trainer = trl.SFTTrainer(model=base, args=args, train_dataset=ds, processing_class=tok)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return trainer, losses


@pytest.mark.skipif(not _budget.FULL,
                    reason="~35 s on CI's 2 cores (TRL's imports and two Trainer runs): "
                           "TORCHTPU_FULL_TESTS=1; the default run trains through "
                           "transformers' Trainer in tests/test_integration_hf.py")
def test_trl_sft_trainer_picks_tpu_and_matches_cpu(tmp_path):
    base = _tiny_llama()  # the tokenizer's 36 ids fit the vocab of 128
    ref, init = copy.deepcopy(base), copy.deepcopy(base)
    trainer, losses = _sft_run(tmp_path / "tpu", base, use_cpu=False)
    assert trainer.args.device.type == "tpu"
    assert trainer.accelerator.device.type == "tpu"
    assert {p.device.type for p in trainer.model.parameters()} == {"tpu"}
    cpu_trainer, exp = _sft_run(tmp_path / "cpu", ref, use_cpu=True)
    assert cpu_trainer.args.device.type == "cpu"
    assert {p.device.type for p in cpu_trainer.model.parameters()} == {"cpu"}
    assert len(losses) == 2
    torch.testing.assert_close(losses, exp, rtol=RTOL, atol=ATOL)
    # the weights after 2 steps: the steps moved them by up to 2 * lr = 2e-2; CPU float32
    # itself ends up to 6e-3 from a float64 run of the same trainer (Adam divides by
    # sqrt(v) + eps, which magnifies rounding in small gradients), tpu no farther
    moved = 0.0
    for (n, p), (_, q), (_, w) in zip(trainer.model.named_parameters(),
                                      cpu_trainer.model.named_parameters(),
                                      init.named_parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=0, atol=3e-3, msg=n)
        moved = max(moved, (q.detach() - w.detach()).abs().max().item())
    assert moved > 1e-2


# ----------------------------------------------------------------------- MoE


def _mixtral():
    cfg = transformers.MixtralConfig(vocab_size=128, hidden_size=32, intermediate_size=48,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=64,
                                     router_aux_loss_coef=0.02)
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(cfg).eval()


def _qwen2_moe():
    cfg = transformers.Qwen2MoeConfig(vocab_size=128, hidden_size=32, intermediate_size=48,
                                      moe_intermediate_size=24,
                                      shared_expert_intermediate_size=48,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, num_experts=4,
                                      num_experts_per_tok=2, decoder_sparse_step=1,
                                      max_position_embeddings=64, router_aux_loss_coef=0.02)
    torch.manual_seed(0)
    return transformers.Qwen2MoeForCausalLM(cfg).eval()


MOE = {"mixtral": ("MixtralForCausalLM", _mixtral), "qwen2_moe": ("Qwen2MoeForCausalLM", _qwen2_moe)}


def _moe_models(name):
    cls, build = MOE[name]
    if not hasattr(transformers, cls):
        pytest.skip(f"transformers has no {cls}")
    model = build()
    ref = copy.deepcopy(model)
    return model.to("tpu"), ref


# Qwen2-MoE by default (CI's budget: Mixtral took 23 s of the two tests); both with
# TORCHTPU_FULL_TESTS=1
@pytest.mark.parametrize("name", sorted(MOE) if _budget.FULL else ["qwen2_moe"])
def test_moe_forward_aux_loss_and_grads_match_cpu(name):
    model, ref = _moe_models(name)
    ids = _ids(seq=10, seed=4)
    out = model(input_ids=ids.to("tpu"), labels=ids.to("tpu"), output_router_logits=True)
    exp = ref(input_ids=ids, labels=ids, output_router_logits=True)
    torch.testing.assert_close(out.logits.detach().cpu(), exp.logits.detach(),
                               rtol=RTOL, atol=ATOL)
    assert exp.aux_loss is not None and exp.aux_loss.item() > 0
    torch.testing.assert_close(out.aux_loss.detach().cpu(), exp.aux_loss.detach(),
                               rtol=RTOL, atol=ATOL)
    assert len(out.router_logits) == len(exp.router_logits) == 2
    for r, e in zip(out.router_logits, exp.router_logits):
        torch.testing.assert_close(r.detach().cpu(), e.detach(), rtol=RTOL, atol=ATOL)
    # loss includes router_aux_loss_coef * aux_loss, so the router weights get its grads
    torch.testing.assert_close(out.loss.detach().cpu(), exp.loss.detach(), rtol=RTOL, atol=ATOL)
    out.loss.backward()
    exp.loss.backward()
    n_grads = 0
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert (p.grad is None) == (q.grad is None), n
        if q.grad is not None:
            n_grads += 1
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-3, atol=1e-5, msg=n)
    assert n_grads == len(list(ref.parameters()))


# Qwen2-MoE by default (CI's budget: Mixtral took 23 s of the two tests); both with
# TORCHTPU_FULL_TESTS=1
@pytest.mark.parametrize("name", sorted(MOE) if _budget.FULL else ["qwen2_moe"])
def test_moe_greedy_generate_matches_cpu(name):
    model, ref = _moe_models(name)
    ids = _ids(batch=1, seq=5, seed=5)
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        out = model.generate(ids.to("tpu"), **kw)
        exp = ref.generate(ids, **kw)
    assert out.device.type == "tpu" and exp.shape == (1, 13)
    torch.testing.assert_close(out.cpu(), exp, rtol=0, atol=0)
