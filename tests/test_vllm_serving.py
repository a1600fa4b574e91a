"""vLLM on tpu (``torchtpu.integrations.vllm``), against Hugging Face on the CPU.

Runs in the serving venv (``make test-vllm``: vLLM 0.33 pins torch 2.14.0); skipped where
vLLM is not installed (the main venv).  The model is the tiny Llama of
``examples/vllm_serve.py`` (built from a config, no download); each generated token is
checked teacher-forced against the CPU model (``check_against_cpu``).
"""

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

vllm = pytest.importorskip("vllm")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "vllm_serve_example", os.path.join(ROOT, "examples", "vllm_serve.py"))
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return example.make_tiny_llama(str(tmp_path_factory.mktemp("tiny_llama")))


@pytest.fixture(scope="module")
def llm(model_dir):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # (the engine in this process)
    try:
        # (max_num_batched_tokens 256: 5 token buckets compiled at start-up, 16..256)
        yield vllm.LLM(model=model_dir, dtype="float32", max_model_len=128, max_num_seqs=8,
                       max_num_batched_tokens=256, kv_cache_memory_bytes=16 << 20, seed=0)
    finally:
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)


def test_vllm_picks_the_tpu_platform_by_itself():
    from vllm.platforms import current_platform

    from torchtpu.integrations import vllm as plugin
    from torchtpu.integrations.vllm.platform import TpuPlatform

    assert isinstance(current_platform, TpuPlatform)
    assert current_platform.device_type == "tpu" and current_platform.is_out_of_tree()
    assert plugin.register() == "torchtpu.integrations.vllm.platform.TpuPlatform"
    os.environ["TORCHTPU_VLLM"] = "0"
    try:
        assert plugin.register() is None
    finally:
        del os.environ["TORCHTPU_VLLM"]


@pytest.mark.parametrize("kw,match", [
    ({"tensor_parallel_size": 2}, "tensor and pipeline parallelism"),
    ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype"),
    ({"quantization": "fp8"}, "fp8 quantization is not supported on tpu"),
])
def test_unsupported_configurations_raise_clearly(model_dir, kw, match):
    from vllm.engine.arg_utils import EngineArgs

    with pytest.raises(Exception, match=match):
        EngineArgs(model=model_dir, dtype="float32", max_model_len=128, **kw) \
            .create_engine_config()


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_mixture_of_experts_models_are_served_and_match_cpu(kind, tmp_path):
    # (before: refused; before that an AttributeError "'UnquantizedFusedMoEMethod' object
    # has no attribute 'is_monolithic'" at the first forward: vLLM leaves the MoE
    # kernel and the routing kernels of an out-of-tree platform to it)
    import transformers as tf

    torch.manual_seed(0)
    common = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1,
                  eos_token_id=2)
    if kind == "mixtral":
        model = tf.MixtralForCausalLM(tf.MixtralConfig(
            intermediate_size=128, num_local_experts=4, num_experts_per_tok=2, **common))
    else:  # routed experts and a shared expert
        model = tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(
            intermediate_size=128, moe_intermediate_size=64,
            shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
            **common))
    model.save_pretrained(tmp_path, safe_serialization=True)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        llm = vllm.LLM(model=str(tmp_path), dtype="float32", max_model_len=128,
                       max_num_seqs=4, max_num_batched_tokens=64,
                       kv_cache_memory_bytes=8 << 20, seed=0, skip_tokenizer_init=True)
        prompts = [[1, 5, 9, 33, 70], [1, 100, 42], [1] + list(range(7, 30))]
        sp = vllm.SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=1,
                                 detokenize=False)
        res = llm.generate(_token_ids(prompts), sp)
    finally:
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    outs = [[(t, r.outputs[0].logprobs[i][t].logprob)
             for i, t in enumerate(r.outputs[0].token_ids)] for r in res]
    assert [len(o) for o in outs] == [10, 10, 10]
    assert example.check_against_cpu(str(tmp_path), prompts, outs) == 0


@pytest.mark.parametrize("window", [4096, 64])
def test_sliding_window_longer_than_max_model_len_is_full_attention(window, tmp_path):
    # a window no shorter than max_model_len never binds (Mistral's 4096 at 128): served
    # as full causal attention and equal to CPU; a shorter one is refused by name
    import transformers as tf

    torch.manual_seed(0)
    model = tf.MistralForCausalLM(tf.MistralConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        sliding_window=window, bos_token_id=1, eos_token_id=2))
    model.save_pretrained(tmp_path, safe_serialization=True)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        def serve():
            llm = vllm.LLM(model=str(tmp_path), dtype="float32", max_model_len=128,
                           max_num_seqs=4, max_num_batched_tokens=128, enforce_eager=True,
                           kv_cache_memory_bytes=8 << 20, seed=0, skip_tokenizer_init=True)
            sp = vllm.SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                                     logprobs=1, detokenize=False)
            return llm.generate(_token_ids(prompts), sp)

        prompts = [[1, 5, 9, 33, 70], [1] + list(range(7, 90))]
        if window < 128:
            with pytest.raises(NotImplementedError, match="sliding_window=64"):
                serve()
            return
        res = serve()
    finally:
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    outs = [[(t, r.outputs[0].logprobs[i][t].logprob)
             for i, t in enumerate(r.outputs[0].token_ids)] for r in res]
    assert [len(o) for o in outs] == [8, 8]
    assert example.check_against_cpu(str(tmp_path), prompts, outs) == 0


def test_moe_experts_equal_each_tokens_chosen_experts():
    from torchtpu.integrations.vllm.moe import experts

    g = torch.Generator().manual_seed(0)
    T, H, I, E, k = 7, 16, 8, 5, 2
    x = torch.randn(T, H, generator=g)
    w13 = torch.randn(E, 2 * I, H, generator=g) / 4
    w2 = torch.randn(E, H, I, generator=g) / 4
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int32)
    w = torch.rand(T, k, generator=g)
    ref = torch.zeros(T, H)
    for t in range(T):
        for j in range(k):
            e = int(ids[t, j])
            h = w13[e] @ x[t]
            ref[t] += w[t, j] * (w2[e] @ (torch.nn.functional.silu(h[:I]) * h[I:]))
    got = experts(x.to("tpu"), w13.to("tpu"), w2.to("tpu"), w.to("tpu"), ids.to("tpu"))
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-5)


def test_default_kv_cache_budget_on_the_cpu_platform_is_capped():
    # (before: 0.9 of host memory: 90 million tokens of KV cache, the process killed)
    from types import SimpleNamespace

    from torchtpu._device import runtime
    from torchtpu.integrations.vllm.worker import CPU_KV_CACHE_BYTES, TpuWorker

    me = SimpleNamespace(device=torch.device("tpu:0"), cache_config=SimpleNamespace(
        kv_cache_memory_bytes=None, gpu_memory_utilization=0.9))
    got = TpuWorker.determine_available_memory(me)
    if runtime.platform() == "cpu":
        assert 0 < got <= CPU_KV_CACHE_BYTES
    me.cache_config.kv_cache_memory_bytes = 12345
    assert TpuWorker.determine_available_memory(me) == 12345


def _token_ids(prompts):
    from vllm.inputs import TokensPrompt

    return [TokensPrompt(prompt_token_ids=p) for p in prompts]


def test_greedy_batch_matches_cpu_teacher_forced(llm, model_dir):
    # prompts of different lengths in one batch (prefill and decode tokens mixed in the
    # same steps), requests finishing at different steps (continuous batching), then the
    # same prompts again (prefix-cache hits: queries start past cached blocks)
    prompts = [[1, 5, 9, 33, 70], [1, 100, 42], [1] + list(range(7, 40)), [1, 200]]
    lengths = [16, 9, 12, 16]
    sps = [vllm.SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=1)
           for n in lengths]
    # (vLLM's default, asynchronous scheduling: each step's sampled ids go into the
    # next step's input ids on the device, model_runner._prepare_input_ids)
    assert llm.llm_engine.vllm_config.scheduler_config.async_scheduling
    first = llm.generate(_token_ids(prompts), sps)
    again = llm.generate(_token_ids(prompts), sps)
    outs = []
    for r, r2, n in zip(first, again, lengths):
        ids = list(r.outputs[0].token_ids)
        assert len(ids) == n
        assert ids == list(r2.outputs[0].token_ids)
        outs.append([(t, r.outputs[0].logprobs[i][t].logprob) for i, t in enumerate(ids)])
    assert example.check_against_cpu(model_dir, prompts, outs) == 0


def test_after_start_up_a_new_batch_composition_compiles_nothing(llm, model_dir):
    # start-up compiled the model for every token bucket and the sampling for every
    # request bucket: other prompt lengths, request counts (and so query layouts,
    # context lengths, request buckets) and sampling settings (seeded requests too)
    # compile nothing, neither a Dynamo graph nor an XLA program (per-op executables,
    # their donating variants, fused segments)
    import torch._dynamo.utils as dynamo_utils

    import torchtpu

    def counts():
        m = torchtpu.metrics()
        return (dynamo_utils.counters["stats"]["unique_graphs"],
                dynamo_utils.counters["stats"]["calls_captured"],
                m["compiles"], m["cache_misses"], m["segment_cache_misses"],
                m["xla"]["compiled"] + m["xla"]["loaded"])  # (donating variants too)

    assert torchtpu.metrics()["compile"]["executables"] > 0  # (the compiled model ran)
    before = counts()
    prompts = [[1] + [(5 * i + k) % 250 + 3 for i in range(n)]
               for k, n in enumerate([3, 40, 11, 27, 6, 70, 2])]
    # (no logprobs: their first use at a request bucket compiles it)
    sps = [vllm.SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
           for n in (5, 9, 3, 7, 6, 4, 8)]
    res = llm.generate(_token_ids(prompts), sps)
    sampled = [vllm.SamplingParams(temperature=0.7, top_k=k, top_p=p, max_tokens=5,
                                   ignore_eos=True, seed=seed)
               for k, p, seed in ((20, 1.0, None), (0, 0.8, 3), (30, 0.9, None))]
    llm.generate(_token_ids(prompts[:3]), sampled)
    # every request seeded (vLLM then skips the batch's unseeded draw)
    seeded = [vllm.SamplingParams(temperature=0.7, max_tokens=4, ignore_eos=True, seed=s)
              for s in (5, 6)]
    llm.generate(_token_ids(prompts[3:5]), seeded)
    llm.generate(_token_ids(prompts[5:6]), seeded[:1])
    assert counts() == before
    outs = [[(t, None) for t in r.outputs[0].token_ids] for r in res]
    assert example.check_against_cpu(model_dir, prompts, outs) == 0


_TWO_ENGINES = """
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
import vllm
from vllm.inputs import TokensPrompt
engines = [vllm.LLM(model=sys.argv[1], dtype=dtype, max_model_len=128, max_num_seqs=4,
                    max_num_batched_tokens=256, kv_cache_memory_bytes=8 << 20, seed=0)
           for dtype in ("float32", "bfloat16")]  # (both alive: vLLM's groups are global)
outs = []
for engine in engines:
    res = engine.generate([TokensPrompt(prompt_token_ids=[1, 5, 9, 33])],
                          vllm.SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    outs.append(list(res[0].outputs[0].token_ids))
print("OUTS", json.dumps(outs))
"""


def test_a_second_engine_of_other_graphs_in_the_same_process_starts(model_dir):
    # (before: Dynamo's "hit config.recompile_limit" with fullgraph=True at the second
    # engine's start-up: both engines' models share their classes' code objects; in a
    # process of its own: an in-process engine's teardown ends vLLM's process groups)
    p = subprocess.run([sys.executable, "-c", _TWO_ENGINES, model_dir], capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    outs = json.loads(p.stdout.split("OUTS", 1)[1])
    assert example.check_against_cpu(model_dir, [[1, 5, 9, 33]],
                                     [[(t, None) for t in outs[0]]]) == 0
    assert len(outs[1]) == 4


def test_seeded_sampling_is_reproducible(llm):
    # a per-request seed draws through a tpu generator (exponential_ with generator=:
    # before, an AssertionError that killed the engine)
    def draw(seed):
        sp = vllm.SamplingParams(temperature=1.0, top_k=50, max_tokens=12, ignore_eos=True,
                                 seed=seed)
        return [list(r.outputs[0].token_ids)
                for r in llm.generate(_token_ids([[1, 5, 9], [1, 100, 42, 7]]), sp)]

    a, b, c = draw(7), draw(7), draw(8)
    assert a == b and a != c


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_prompts_longer_than_a_batch_step_are_chunked_and_match_cpu(model_dir,
                                                                    async_scheduling):
    # max_num_batched_tokens 32 < a 70-token prompt: its prefill spans several steps;
    # enforce_eager: the model op by op (no compiled graph), the same values.  With
    # asynchronous scheduling (vLLM's default) the partial steps' sampled ids, discarded,
    # still reach the device merge of the next input ids; synchronous scheduling: the
    # ids come back to the host each step
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        small = vllm.LLM(model=model_dir, dtype="float32", max_model_len=128,
                         max_num_seqs=4, max_num_batched_tokens=32,
                         kv_cache_memory_bytes=8 << 20, seed=0, enable_prefix_caching=False,
                         enforce_eager=True, async_scheduling=async_scheduling)
        assert small.llm_engine.vllm_config.scheduler_config.async_scheduling \
            is async_scheduling
        prompts = [[1] + [(7 * i) % 250 + 3 for i in range(70)], [1, 2, 3]]
        sp = vllm.SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
        res = small.generate(_token_ids(prompts), sp)
        # a seeded request whose prefill spans steps: vLLM rewinds its generator at each
        # partial step (set_offset; before: "CPU Generator does not use offset", the
        # engine died); the same seed gives the same tokens again
        seeded = vllm.SamplingParams(temperature=0.8, max_tokens=6, ignore_eos=True, seed=5)
        draws = [list(small.generate(_token_ids(prompts[:1]), seeded)[0].outputs[0].token_ids)
                 for _ in range(2)]
        assert len(draws[0]) == 6 and draws[0] == draws[1]
    finally:
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    outs = [[(t, r.outputs[0].logprobs[i][t].logprob)
             for i, t in enumerate(r.outputs[0].token_ids)] for r in res]
    assert example.check_against_cpu(model_dir, prompts, outs) == 0


@dataclass
class _Common:  # the fields of vLLM's CommonAttentionMetadata the builder reads
    num_reqs: int
    num_actual_tokens: int
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu_upper_bound: torch.Tensor
    seq_lens: torch.Tensor
    slot_mapping: torch.Tensor
    block_table_tensor: torch.Tensor


@pytest.mark.parametrize("heads,kv_heads,tiles,chunk_keys",
                         [(4, 4, 256, 128), (4, 2, 256, 4), (4, 2, 4, 8)])
def test_paged_attention_equals_causal_attention_per_request(heads, kv_heads, tiles,
                                                             chunk_keys, monkeypatch):
    # (256, 128): a tile per token, one chunk of keys; (256, 4): a chunk per block, the
    # loop runs 4 times; (4, 8): tiles of 2 rows (a request's last tile short), 2 blocks
    # a chunk
    from types import SimpleNamespace

    from torchtpu.integrations.vllm import attention
    from torchtpu.integrations.vllm.attention import (TpuAttentionImpl,
                                                       TpuAttentionMetadataBuilder)

    monkeypatch.setattr(attention, "TILES", tiles)
    monkeypatch.setattr(attention, "CHUNK_KEYS", chunk_keys)

    g = torch.Generator().manual_seed(0)
    D, bs, nblocks = 8, 4, 16
    # three requests: a 6-token prefill, a decode token after 9 cached tokens, a 3-token
    # chunk after 5 cached tokens; blocks scattered over the cache; one padding token
    qlens, ctx = [6, 1, 3], [0, 9, 5]
    tables = [[3, 7], [1, 12, 5], [9, 2]]
    T = sum(qlens) + 1
    seq = [c + q for c, q in zip(ctx, qlens)]
    kcache = torch.randn(nblocks, kv_heads, bs, 2, D, generator=g)  # old contents
    q = torch.randn(T, heads, D, generator=g)
    k = torch.randn(T, kv_heads, D, generator=g)
    v = torch.randn(T, kv_heads, D, generator=g)
    slots = []
    for r, (c, n) in enumerate(zip(ctx, qlens)):
        slots += [tables[r][p // bs] * bs + p % bs for p in range(c, c + n)]
    slots.append(-1)
    # reference on the CPU: each request's full keys (cached ones from the cache, new
    # ones from k/v), causal attention of its queries at positions ctx..ctx+n-1
    ref = torch.zeros(T, heads * D)
    t0 = 0
    full_k = kcache.clone()
    for r, (c, n) in enumerate(zip(ctx, qlens)):
        for i, p in enumerate(range(c, c + n)):
            blk, off = tables[r][p // bs], p % bs
            full_k[blk, :, off, 0] = k[t0 + i]
            full_k[blk, :, off, 1] = v[t0 + i]
        t0 += n
    t0 = 0
    for r, (c, n) in enumerate(zip(ctx, qlens)):
        keys = torch.stack([full_k[tables[r][p // bs], :, p % bs, 0] for p in range(c + n)], 1)
        vals = torch.stack([full_k[tables[r][p // bs], :, p % bs, 1] for p in range(c + n)], 1)
        keys = keys.repeat_interleave(heads // kv_heads, 0)
        vals = vals.repeat_interleave(heads // kv_heads, 0)
        qq = q[t0:t0 + n].transpose(0, 1)  # [H, n, D]
        mask = torch.arange(c + n)[None, :] <= torch.arange(c, c + n)[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(qq, keys, vals, attn_mask=mask,
                                                             scale=0.3)
        ref[t0:t0 + n] = o.transpose(0, 1).reshape(n, heads * D)
        t0 += n
    width = max(len(t) for t in tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    qsl = torch.tensor([0] + list(torch.cumsum(torch.tensor(qlens), 0)), dtype=torch.int32)
    common = _Common(3, T, qsl, torch.tensor(seq, dtype=torch.int32),
                     torch.tensor(seq, dtype=torch.int32).to("tpu"),
                     torch.tensor(slots).to("tpu"), table.to("tpu"))
    builder = TpuAttentionMetadataBuilder(SimpleNamespace(block_size=bs), ["l"], None,
                                          torch.device("tpu"))
    meta = builder.build(0, common)
    assert meta.rows == (2 if tiles == 4 else 1)
    # another composition of as many tokens (three decodes after long contexts and a
    # chunk) has the same shapes: one program per padded token count
    other = _Common(4, T, torch.tensor([0, 1, 2, 3, T], dtype=torch.int32),
                    torch.tensor([13, 10, 12, 7], dtype=torch.int32),
                    torch.tensor([13, 10, 12, 7], dtype=torch.int32).to("tpu"),
                    torch.zeros(T, dtype=torch.int64).to("tpu"),
                    torch.tensor([[1, 2, 3]] * 4, dtype=torch.int32).to("tpu"))
    meta2 = builder.build(0, other)

    def shapes(m):
        return [tuple(t.shape) for t in (m.token_rows, m.block_table, m.slot_block,
                                         *m.tiles)], m.rows, m.chunk_blocks

    assert shapes(meta2) == shapes(meta)
    impl = TpuAttentionImpl(heads, D, 0.3, kv_heads)
    cache = kcache.reshape(nblocks, kv_heads, bs, 2 * D).to("tpu")  # vLLM's shape
    impl.do_kv_cache_update(None, k.to("tpu"), v.to("tpu"), cache, common.slot_mapping)
    out = torch.full((T, heads * D), 7.0, device="tpu")
    impl.forward(None, q.to("tpu"), k.to("tpu"), v.to("tpu"), cache, meta, out)
    torch.testing.assert_close(out[:T - 1].cpu(), ref[:T - 1], rtol=1e-5, atol=1e-5)
    # the cache holds the new keys and values where the slot mapping put them
    written = cache.cpu().reshape(nblocks, kv_heads, bs, 2, D)
    for t, s in enumerate(slots[:-1]):
        torch.testing.assert_close(written[s // bs, :, s % bs, 0], k[t])
        torch.testing.assert_close(written[s // bs, :, s % bs, 1], v[t])


def test_example_serves_offline_and_through_the_openai_server():
    p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "vllm_serve.py"),
                        "--server", "--tokens", "8"], capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "offline greedy outputs match CPU" in p.stdout
    assert "server greedy completion matches CPU" in p.stdout


def test_a_warmed_up_model_picks_its_graph_by_shape_and_compiles_a_new_one():
    # after start-up the plugin's compiled model checks only the guards that told its
    # graphs apart (model_runner.serve_warmed_up); each shape must still run its own
    # graph, and a shape never compiled (which Dynamo refuses under that stance) must
    # compile with every guard instead of failing the request
    from torchtpu.integrations.vllm import model_runner as mr

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 4)

        def forward(self, x):
            return torch.relu(self.lin(x)) * x.shape[0]  # (a per-shape constant)

    torch.manual_seed(0)
    cpu = Net()
    model = Net()
    model.load_state_dict(cpu.state_dict())
    model = model.to("tpu")
    torch._dynamo.reset()
    model.compile(backend="tpu", fullgraph=True, dynamic=False)
    mr._launch_alone(model)
    with torch.no_grad():
        for n in (4, 8):  # (start-up: one graph per shape)
            model(torch.randn(n, 8, device="tpu"))
        mr.serve_warmed_up(model)
        for n, warm in ((8, True), (4, True), (8, True), (16, False), (4, False)):
            x = torch.randn(n, 8)
            torch.testing.assert_close(model(x.to("tpu")).cpu(), cpu(x))
            assert model.__dict__["_warmed_up"] is warm, n


def test_an_async_output_whose_host_read_failed_raises_again():
    # asynchronous scheduling's output event fills the host tensors once; when that read
    # raised (a failed device-side check of the step), a later wait must raise again,
    # not hand back the unwritten host tensors (helper-38's finding)
    from torchtpu.integrations.vllm.model_runner import _CopyDone

    calls = []

    def fill():
        calls.append(1)
        raise IndexError("index out of range in self")

    event = _CopyDone(fill)
    for _ in range(2):
        with pytest.raises(IndexError):
            event.synchronize()
    assert len(calls) == 1
