"""vLLM's model runner on ``tpu`` (vLLM 0.33): vLLM's own GPU model runner (input batch,
block tables, sampling) with the device ``tpu``, like vLLM's CPU runner does for ``cpu``:
CUDA streams, events and graphs are not used."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np
import torch
from vllm.logger import init_logger
from vllm.v1.utils import CpuGpuBuffer
from vllm.v1.worker.block_table import BlockTable, SlotMappingMode
from vllm.v1.worker import gpu_input_batch as _input_batch
from vllm.v1.worker import gpu_model_runner as _gmr
from vllm.v1.worker.gpu_model_runner import AsyncGPUModelRunnerOutput, GPUModelRunner
from vllm.v1.worker.utils import allocate_kv_cache as _vllm_allocate_kv_cache

from torchtpu import jax_op
from torchtpu.eager.handlers import upload_changed, upload_into
from torchtpu.integrations.vllm import _host
from torchtpu.integrations.vllm._shapes import bucket, padded_tokens, token_buckets

logger = init_logger(f"vllm.{__name__}")  # (under "vllm": its log configuration)


@contextlib.contextmanager
def _no_cuda_streams():
    """vLLM's runner makes CUDA streams and events at construction; on tpu they are
    placeholders (everything runs in the device's order anyway)."""

    class _Event:
        def __init__(self, *a, **k):
            pass

        def record(self, *a, **k):
            pass

        def synchronize(self):
            pass

        def wait(self, *a, **k):
            pass

    class _Stream:
        def __init__(self, *a, **k):
            self.device = torch.device("tpu")

        def wait_stream(self, *a, **k):
            pass

        def synchronize(self):
            pass

    saved = torch.Event, torch.cuda.Stream, torch.cuda.Event
    torch.Event, torch.cuda.Stream, torch.cuda.Event = _Event, _Stream, _Event
    try:
        yield
    finally:
        torch.Event, torch.cuda.Stream, torch.cuda.Event = saved


def _slot_mapping(self, num_reqs: int, query_start_loc: torch.Tensor,
                  positions: torch.Tensor) -> None:
    """``BlockTable.compute_slot_mapping`` on the host (vLLM's is a Triton kernel over
    device tensors): token ``t`` of request ``r`` at position ``p`` goes to slot
    ``block_table[r, p // block_size] * block_size + p % block_size``; slots past the
    batch's tokens are -1.  Computed with numpy from the runner's host copies (query
    start locations, computed-token counts, the block table) into the buffer's host
    copy, which the attention metadata reads (device ops would meet a new token count
    in every batch); the device copy is not written (``TpuModelRunner._host_only``)."""
    if self.slot_mapping_mode == SlotMappingMode.NONE:
        return
    if getattr(self, "dcp_world_size", 1) > 1:
        raise NotImplementedError("torchtpu's vLLM plugin: decode context parallelism")
    runner = _host.current()
    if runner is None:
        raise RuntimeError("torchtpu's vLLM plugin: compute_slot_mapping called outside "
                           "a step of TpuModelRunner (no host copies to read)")
    n = positions.shape[0]
    bs = self.block_size
    qsl = runner.query_start_loc.np[: num_reqs + 1].astype(np.int64)
    req = np.repeat(np.arange(num_reqs), qsl[1:] - qsl[:-1])
    pos = runner.input_batch.num_computed_tokens_cpu[req].astype(np.int64) \
        + (np.arange(len(req)) - qsl[req])
    out = self.slot_mapping.np
    out[: len(req)] = self.block_table.np[req, pos // bs].astype(np.int64) * bs + pos % bs
    out[len(req):] = -1
    if len(req) != n:
        raise AssertionError(f"slot mapping: {len(req)} tokens on the host, {n} on tpu")
    # (not uploaded: a step reads only this host copy, TpuModelRunner._host_only)


_VLLM_BLOCK_TABLE_TENSOR = BlockTable.get_device_tensor


def _block_table_tensor(self, num_reqs: int) -> torch.Tensor:
    """``BlockTable.get_device_tensor`` in a step of ``TpuModelRunner``: the host copy's
    first ``num_reqs`` rows.  A step never uploads the block table
    (``TpuModelRunner._host_only``) and the attention metadata reads the host copy, so
    vLLM's fill of the padding rows (``[num_reqs:num_reqs_padded].fill_(0)``, empty
    when no row is padding) costs a host write instead of a device program.  Outside a
    step (a dummy run): vLLM's device rows."""
    if _host.current() is not None:
        return self.block_table.cpu[:num_reqs]
    return _VLLM_BLOCK_TABLE_TENSOR(self, num_reqs)


def _allocate_per_layer(kv_cache_config, device, layout, kernel_block_sizes=None):
    """vLLM's ``allocate_kv_cache`` with one tensor per layer instead of typed views into
    one shared int8 buffer.  The layers' shapes, dtypes and sharing are vLLM's (its own
    function run on the ``meta`` device, which allocates nothing); each distinct view
    becomes a zero-filled tensor of its own.  A KV write then updates its own storage
    in place (a donated scatter), where a write through a view of the shared buffer made
    XLA copy the whole buffer (the executor's failed-check select reads the storage):
    16 MiB per layer per step, a 10x slower serving loop at 32 MiB of KV cache."""
    views = _vllm_allocate_kv_cache(kv_cache_config, torch.device("meta"), layout,
                                    kernel_block_sizes)
    made: dict = {}
    out = {}
    for name, v in views.items():
        t = made.get(id(v))
        if t is None:
            if not v.is_contiguous():
                raise NotImplementedError(
                    f"torchtpu's vLLM plugin: KV cache layer {name} is a non-contiguous "
                    f"view {tuple(v.shape)} / {v.stride()} (layout {layout})")
            t = made[id(v)] = torch.zeros(v.shape, dtype=v.dtype, device=device)
        out[name] = t
    return out


def _copy_to_device(self, n: int | None = None) -> torch.Tensor:
    """``CpuGpuBuffer.copy_to_gpu`` as one upload of the whole buffer (returns the
    device buffer's first ``n`` elements, as vLLM's does).  vLLM copies the first ``n``
    elements, a write into a slice of the device buffer whose length is the step's
    exact token or request count: a new program for every new count.  The elements past
    ``n`` take the host buffer's values (what vLLM's device buffers hold there is never
    read: no asynchronous scheduling or speculative decoding on this platform).  In a
    step, a buffer only ever read on the host (``TpuModelRunner._host_only``) is not
    uploaded, nor one whose device copy still holds these values (``upload_changed``)."""
    runner = _host.current()
    if runner is None:
        upload_into(self.gpu, self.cpu)
    elif id(self) not in runner._host_only:
        upload_changed(self.gpu, self.cpu, runner._uploaded)
    return self.gpu if n is None else self.gpu[:n]


def _merge_sampled(packed, prev):
    """The step's input ids under asynchronous scheduling, in JAX: ``packed`` int32
    ``[2, M]`` is the host's input ids (row 0, the whole ``input_ids`` buffer) and, per
    token, the row of ``prev`` (``[Rp, 1]``, the previous step's sampled ids, still on
    the device) whose id it takes, or -1 to keep the host's (row 1).  Returns int32
    ``[M]``.  One program per ``(M, Rp)``: ``Rp`` is a request bucket when the previous
    step's sampling was padded (``TpuModelRunner._sample``)."""
    import jax.numpy as jnp

    host_ids, src = packed[0], packed[1]
    flat = prev.reshape(-1)
    take = flat[jnp.clip(src, 0, flat.shape[0] - 1)].astype(host_ids.dtype)
    return jnp.where(src >= 0, take, host_ids)


_MERGE_SAMPLED = jax_op("torchtpu_vllm::merge_sampled", _merge_sampled)
_MERGE_JIT: list = []  # jax.jit(_merge_sampled), made at the first call


def _merge_into(dst: torch.Tensor, packed: np.ndarray, prev: torch.Tensor) -> None:
    """``dst`` (int32 ``[M]`` on ``tpu``, the runner's ``input_ids`` buffer) takes
    :func:`_merge_sampled` of host array ``packed`` and ``tpu`` tensor ``prev``.  Where
    ``prev`` holds its storage's elements in order (a sampler's ``[R, 1]`` result, a
    view of its ``[R]`` storage) and ``dst`` is its storage's whole array, the jitted
    function is called on those arrays directly and ``dst``'s storage takes the result
    (about 30 us here; the op's dispatch, upload and copy take about 100): ``dst`` stays
    the same tensor, which the compiled model's guards saw at start-up (a new tensor
    made in the step's inference mode would not pass them).  Otherwise through the op
    and ``copy_``."""
    from torchtpu._device import runtime
    from torchtpu._tensor import storage as _st

    sd, dd = _st.data(prev), _st.data(dst)
    arr = sd.arr
    if type(prev) is torch.Tensor and type(dst) is torch.Tensor \
            and hasattr(arr, "copy_to_host_async") and hasattr(dd.arr, "copy_to_host_async") \
            and dst.dtype == torch.int32 and tuple(dst.shape) == (packed.shape[1],) \
            and prev.is_contiguous() and prev.storage_offset() == 0 \
            and sd.dtype == prev.dtype and prev.numel() == math.prod(sd.shape) \
            and len(_st.view_spec(dst, dd)) == 2 and sd.index == dd.index:
        if not _MERGE_JIT:
            _MERGE_JIT.append(runtime.jax().jit(_merge_sampled))
        dd.arr = _MERGE_JIT[0](runtime.put_host(packed, dd.index), arr)
        return
    dst.copy_(_MERGE_SAMPLED(_host.upload(packed, dst.device), prev))


class _CopyDone:
    """The event of :class:`_AsyncOutput`: ``synchronize()`` waits for the device's
    results and writes them into the output's host tensors (once); ``record`` and
    ``wait`` do nothing (one device queue)."""

    def __init__(self, fill):
        self._fill = fill
        self._error = None

    def synchronize(self) -> None:
        """Fill the output's host tensors (the first call); a fill that raised (a
        device-side check of the step failed) raises again at every later call rather
        than leave the host tensors unwritten."""
        if self._error is not None:
            raise self._error
        fill, self._fill = self._fill, None
        if fill is not None:
            try:
                fill()
            except BaseException as e:
                self._error = e
                raise

    def query(self) -> bool:
        return self._fill is None

    def record(self, *args, **kwargs) -> None:
        pass

    def wait(self, *args, **kwargs) -> None:
        pass


def _start_host_copy(t: torch.Tensor) -> None:
    """Start moving the device array behind ``tpu`` tensor ``t`` (its whole storage) to
    the host, without waiting (JAX's ``copy_to_host_async``); a later host read of ``t``
    finds it there."""
    from torchtpu._tensor import storage as _st

    arr = getattr(_st.data(t), "arr", None)
    start = getattr(arr, "copy_to_host_async", None)
    if start is not None:
        start()


# dtypes whose host copy is a plain numpy array (the others are read with .cpu())
_NUMPY_DTYPES = (torch.int32, torch.int64, torch.float32, torch.bool)


class _AsyncOutput(AsyncGPUModelRunnerOutput):
    """vLLM's ``AsyncGPUModelRunnerOutput`` on ``tpu`` (asynchronous scheduling): made
    when a step's sampling has been launched, it starts the sampled ids' (and
    logprobs', NaN counts') transfer to the host; :meth:`get_output`, called by the
    engine after it launched the next step, waits for them (vLLM's CUDA copy stream
    and event become a host copy started now and finished by the event's
    ``synchronize``).  Same arguments as vLLM's (the stream is ignored; expert
    parallelism, whose fault check it would read, is refused by the platform)."""

    def __init__(self, model_runner_output, sampled_token_ids, logprobs_tensors,
                 invalid_req_indices, async_output_copy_stream, vocab_size,
                 check_ep_fault=False, num_nans=None):
        self._model_runner_output = model_runner_output
        self._invalid_req_indices = invalid_req_indices
        self._sampled_token_ids = sampled_token_ids
        self.vocab_size = vocab_size
        self._logprobs_tensors = logprobs_tensors
        self._num_nans = num_nans
        self._has_fault = None
        self._logprobs_tensors_cpu = None
        self._num_nans_cpu = None
        from torchtpu.eager import inflight

        # (the device-side checks of the work dispatched so far: the host read waits for
        # those only, not for the next step's, dispatched before get_output)
        self._mark = inflight.mark()
        for t in (sampled_token_ids, num_nans, *(logprobs_tensors or ())):
            if isinstance(t, torch.Tensor) and t.device.type == "tpu":
                _start_host_copy(t)
        self.sampled_token_ids_cpu = torch.empty(sampled_token_ids.shape,
                                                 dtype=sampled_token_ids.dtype)
        self.async_copy_ready_event = _CopyDone(self._fill)

    def _read(self, t: torch.Tensor) -> torch.Tensor:
        """``t.cpu()``, waiting only for the work dispatched before this output was made
        (``host_reads.to_numpy``'s ``checks_upto``)."""
        if t.device.type != "tpu" or t.dtype not in _NUMPY_DTYPES:
            return t.cpu()
        from torchtpu.eager import host_reads

        return torch.from_numpy(np.array(host_reads.to_numpy(t, "vllm_async_output",
                                                             self._mark)))

    def _fill(self) -> None:
        with torch.inference_mode():  # (its host tensor was made in the step's)
            self.sampled_token_ids_cpu.copy_(self._read(self._sampled_token_ids))
        if self._logprobs_tensors is not None:
            self._logprobs_tensors_cpu = type(self._logprobs_tensors)(
                *(self._read(t) if isinstance(t, torch.Tensor) else t
                  for t in self._logprobs_tensors))
        if self._num_nans is not None:
            self._num_nans_cpu = self._read(self._num_nans)


# engines (compiled models) made in this process: each adds its buckets to Dynamo's limit
_ENGINES = [0]

# vLLM's built-in logits processors and the attribute that is empty while no request
# uses them (then they leave the logits as they are, whatever their rows)
_IDLE_WHEN_EMPTY = {"MinPLogitsProcessor": "min_p_count",
                    "LogitBiasLogitsProcessor": "biases",
                    "MinTokensLogitsProcessor": "min_toks"}


def _copy_slice(from_tensor: torch.Tensor, to_tensor: torch.Tensor,
                length: int) -> torch.Tensor:
    """vLLM's ``copy_slice`` (the first ``length`` rows of a host tensor into a device
    tensor, returning the device tensor's first ``length`` rows) as one upload of the
    whole tensor where it is small (1 MiB or less; what lies past ``length`` on the
    device is never read): a slice write of the batch's request count is a new program
    for every new count.  Larger tensors (an allowed-token mask) copy the slice."""
    if from_tensor.numel() * from_tensor.element_size() <= 1 << 20 \
            and from_tensor.shape == to_tensor.shape and from_tensor.dtype == to_tensor.dtype:
        to_tensor.copy_(from_tensor)
        return to_tensor[:length]
    return to_tensor[:length].copy_(from_tensor[:length], non_blocking=True)


def _executables_made() -> int:
    """XLA executables this process has compiled or loaded: ``metrics()["xla"]`` (XLA's
    compiles and JAX's persistent cache) and torchtpu's own stores, which ``xla`` does
    not count (per-op signatures, compiled graphs' executables)."""
    import torchtpu

    m = torchtpu.metrics()
    x = m["xla"]
    return x["compiled"] + x["loaded"] + m["signature_cache"]["hits"] \
        + m["compile"]["executable_cache_hits"]


def _trace_moe_layers(model: torch.nn.Module) -> None:
    """Make vLLM's MoE layers call their forward directly (``_moe_forward``), as vLLM does
    on its CPU and TPU platforms, instead of through the ``vllm::moe_forward`` custom op,
    which the compiled graph could only run eagerly between compiled stretches (about 16
    eager ops per MoE layer a step): Dynamo then traces the routing and the experts
    (``moe.TpuUnquantizedFusedMoEMethod``) into the model's graph."""
    try:
        from vllm.model_executor.layers.fused_moe.runner import moe_runner
    except ImportError:  # (no MoE runner in this vLLM)
        return
    for m in model.modules():
        if isinstance(m, moe_runner.MoERunner) and hasattr(m, "_forward_entry"):
            m._forward_entry = (moe_runner._moe_forward if m._shared_experts is None
                                else moe_runner._moe_forward_shared)


def _differentiating_guards():
    """PyTorch's ``torch.compiler.set_stance(..., skip_guard_eval_unsafe=True)`` over the
    present stance: Dynamo picks among a frame's compiled graphs by the guards that told
    them apart when they were compiled (here: the token bucket's input shapes) instead
    of evaluating every guard (about 1,200 per bucket graph: about 0.1 ms of a step's
    0.55 ms forward on this host).  Safe for a model that start-up compiled at every shape it will meet and
    that nothing changes afterwards (vLLM's, once loaded; vLLM drops every guard of
    its own compiled models).  A call that matches no graph compiles as usual."""
    from torch._dynamo import eval_frame

    stance = getattr(eval_frame, "_stance", None)
    return torch.compiler.set_stance(getattr(stance, "stance", "default"),
                                     skip_guard_eval_unsafe=True)


def serve_warmed_up(model: torch.nn.Module) -> None:
    """After start-up compiled ``model`` (made by :func:`_launch_alone`) at every token
    bucket: its calls choose their graph by the differentiating guards only
    (:func:`_differentiating_guards`)."""
    model.__dict__["_warmed_up"] = True


def _launch_alone(model: torch.nn.Module) -> None:
    """Make each call of ``model`` (a step's forward, a dummy run's) launch its compiled
    graph's executable by itself (``torchtpu.compile.graph.unstitched``) rather than
    record it into a pending segment: the graph is the whole forward, attention and KV
    cache writes included, and stitched it would copy every layer's cache once a step to
    keep the old values should a device check fail (see ``unstitched``).  (A subclass of
    the model's class with its own ``__call__``, outside what Dynamo compiles: the model
    stays vLLM's object, its other methods untouched.)"""
    from torchtpu.compile.graph import unstitched

    cls = type(model)

    def __call__(self, *args, **kwargs):
        with unstitched():
            if self.__dict__.get("_warmed_up"):
                try:
                    with _differentiating_guards():
                        return super(alone, self).__call__(*args, **kwargs)
                except RuntimeError as e:
                    # (raised by Dynamo's cache lookup, before the forward runs, when
                    # no graph passes the differentiating guards: seen under
                    # pyinstrument's profiler hook, where every guard still passed)
                    if "skip_guard_eval_unsafe" not in str(e):
                        raise
                    logger.warning("tpu: the compiled model met a call its differentiating "
                                   "guards do not match (%s); every guard is evaluated "
                                   "from now on", str(e).splitlines()[0])
                    self.__dict__["_warmed_up"] = False
            return super(alone, self).__call__(*args, **kwargs)

    alone = type(cls.__name__, (cls,), {"__call__": __call__,
                                        "__module__": cls.__module__,
                                        "__qualname__": cls.__qualname__})
    model.__class__ = alone


class TpuModelRunner(GPUModelRunner):
    """vLLM's ``GPUModelRunner`` on a ``tpu`` device, eager (no CUDA graphs)."""

    def __init__(self, vllm_config, device: torch.device):
        with _no_cuda_streams():
            super().__init__(vllm_config, device)
        self.use_cuda_graph = False
        self._uploaded: dict = {}  # the record of upload_changed (the runner's buffers)
        self._padding_masks: dict = {}  # (tokens, padded tokens) -> the mask on tpu
        # (every BlockTable of this process is ours: one platform per process)
        BlockTable.compute_slot_mapping = _slot_mapping
        BlockTable.get_device_tensor = _block_table_tensor
        CpuGpuBuffer.copy_to_gpu = _copy_to_device
        _input_batch.copy_slice = _copy_slice
        _gmr.AsyncGPUModelRunnerOutput = _AsyncOutput
        # (the previous step's sampled ids: as vLLM cut them to the batch's requests,
        # and the request bucket's tensor they are the first rows of)
        self._sampled_rows: tuple | None = None

    @property
    def _host_only(self) -> set:
        """The ids of the ``CpuGpuBuffer`` s a step never reads on the device, so never
        uploads (:func:`_copy_to_device`, :func:`_slot_mapping`): the block tables and slot
        mappings (the attention metadata builder and the slot mapping read their host
        copies) and the discard mask (read on the device by speculative decoding only,
        which the platform refuses).  (Per input batch: vLLM may make a new one when the
        KV cache is set up.)"""
        ib = self.input_batch
        held = self.__dict__.get("_host_only_of")
        if held is None or held[0] is not ib:
            ids = {id(b) for bt in ib.block_table.block_tables
                   for b in (bt.block_table, bt.slot_mapping)}
            ids.add(id(self.discard_request_mask))
            held = self.__dict__["_host_only_of"] = (ib, ids)
        return held[1]

    def initialize_kv_cache_tensors(self, kv_cache_config, kernel_block_sizes,
                                    kv_cache_allocation_context=None):
        """vLLM's, with one KV cache tensor per layer (:func:`_allocate_per_layer`)."""
        saved = _gmr.allocate_kv_cache
        _gmr.allocate_kv_cache = _allocate_per_layer
        try:
            return super().initialize_kv_cache_tensors(
                kv_cache_config, kernel_block_sizes, kv_cache_allocation_context)
        finally:
            _gmr.allocate_kv_cache = saved

    def _determine_batch_execution_and_padding(self, num_tokens: int, *args, **kwargs):
        """vLLM's choice, with the token count padded to a bucket (a power of two, at
        least :data:`MIN_TOKENS`, at most ``max_num_batched_tokens``): the model's ops
        then meet a few token counts instead of one per batch composition, so a new
        batch compiles nothing once each bucket has run (vLLM pads the same way for
        CUDA graphs; padding tokens write to block 0 and are never read)."""
        out = super()._determine_batch_execution_and_padding(num_tokens, *args, **kwargs)
        mode, desc, *rest = out
        padded = padded_tokens(desc.num_tokens, self.max_num_tokens)
        if padded != desc.num_tokens:
            desc = dataclasses.replace(desc, num_tokens=padded)
        return (mode, desc, *rest)

    def load_model(self, *args, **kwargs) -> None:
        """vLLM's, then the model's forward compiled with ``torch.compile(backend="tpu",
        fullgraph=True, dynamic=False)`` unless ``enforce_eager``: one graph per token
        bucket (the token count is padded, :meth:`_determine_batch_execution_and_padding`),
        the attention layers traced into it (``TpuPlatform.opaque_attention_op`` is
        False): each layer's KV cache is a graph input the graph rewrites (donated), and
        the step's attention metadata are inputs whose shapes follow the token bucket
        only, so the request layout (requests, query rows, blocks) never reaches the
        graph's shapes or its guards."""
        super().load_model(*args, **kwargs)
        if self.model_config.enforce_eager:
            return
        buckets = token_buckets(self.max_num_tokens)
        # one Dynamo entry per bucket, per engine of this process (the engines' models
        # share their classes' code objects; Dynamo's default keeps 8 per code object)
        cfg = torch._dynamo.config
        _ENGINES[0] += 1
        cfg.recompile_limit = max(cfg.recompile_limit,
                                  _ENGINES[0] * (len(buckets) + 4))
        cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit,
                                              4 * cfg.recompile_limit)
        _trace_moe_layers(self.model)
        self.model.compile(backend="tpu", fullgraph=True, dynamic=False)
        _launch_alone(self.model)

    @contextlib.contextmanager
    def _bookkeeping_on_host(self, num_tokens: int):
        """Inside: vLLM's per-step bookkeeping tensors (token positions, sequence lengths,
        computed-token counts, and the request indices, query positions, scheduled and
        accepted counts they are made from) are host tensors, so that vLLM's slice arithmetic on
        them (``positions[:T] = ...``, ``seq_lens[R:].fill_(0)``: shapes of the step's
        exact token and request counts) runs on the host; on leaving, each device tensor
        takes its host copy whole (one transfer of a fixed shape each; positions past the
        ``num_tokens`` tokens zero, as vLLM's padding leaves them)."""
        names = ("positions", "seq_lens", "num_computed_tokens")
        shadows = self.__dict__.setdefault("_host_shadows", {})
        device = {}
        for name in names:
            t = getattr(self, name)
            if name not in shadows:
                shadows[name] = torch.zeros(t.shape, dtype=t.dtype)
            device[name] = t
            setattr(self, name, shadows[name])
        bufs = (self.req_indices, self.query_pos, self.num_scheduled_tokens,
                self.query_start_loc, self.num_accepted_tokens)
        saved = [b.gpu for b in bufs]
        for b in bufs:
            b.gpu = b.cpu
        ok = False
        try:
            yield
            ok = True
        finally:
            for name in names:
                setattr(self, name, device[name])
            for b, g in zip(bufs, saved):
                b.gpu = g
        if ok:
            shadows["positions"][num_tokens:] = 0
            upload_into(self.positions, shadows["positions"])
            # (the others are read on the device only inside _prepare_inputs, but the
            # query start locations also by the attention metadata, and the accepted
            # token counts by hybrid models)
            upload_changed(self.query_start_loc.gpu, self.query_start_loc.cpu,
                           self._uploaded)
            upload_changed(self.num_accepted_tokens.gpu, self.num_accepted_tokens.cpu,
                           self._uploaded)
            upload_into(self.seq_lens, shadows["seq_lens"])
            if getattr(self, "use_async_spec_decode", False):  # (its only device reader)
                upload_into(self.num_computed_tokens, shadows["num_computed_tokens"])

    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        """vLLM's, with its bookkeeping arithmetic on the host
        (:meth:`_bookkeeping_on_host`): on the device it made a new program for every
        new token or request count.  The rows whose logits are sampled (each request's
        last token) are padded to a request bucket when the batch's sampling allows it
        (:meth:`_pads_sampling`), so that the logits, the sampler and the logprobs meet
        a few request counts; :meth:`_sample` cuts the padding off."""
        with self._bookkeeping_on_host(scheduler_output.total_num_scheduled_tokens):
            logits_rows, spec, most = super()._prepare_inputs(scheduler_output,
                                                              num_scheduled_tokens)
        R = self.input_batch.num_reqs
        # (computed on the host; uploaded as a [max_num_seqs] buffer, of which a view:
        # one storage shape whatever the count)
        rows = np.zeros(max(self.max_num_reqs, R), np.int32)
        rows[:R] = logits_rows.numpy()
        n = bucket(R, 1, self.max_num_reqs) if self._pads_sampling(scheduler_output) else R
        # (padding rows sample token 0's hidden state; _sample cuts them off)
        return _host.upload(rows, self.device)[:n], spec, most

    def _prepare_input_ids(self, scheduler_output, num_reqs: int,
                           total_num_scheduled_tokens: int, cu_num_tokens) -> None:
        """vLLM's, with asynchronous scheduling's ids of the previous step on the device
        taken in one program of fixed shapes (:func:`_merge_sampled`): vLLM copies them
        into a slice of the step's exact request count, or scatters them at indices of
        that length, a new program for every new count.  The host computes, for every
        slot of the ``input_ids`` buffer, the previous step's row it takes (each
        continuing request's last token) or -1 (the host's id); the buffer's device copy
        takes the merge's result (:func:`_merge_into`).  Without ids on the device
        (synchronous scheduling, a step after an empty one): vLLM's, one upload of the
        whole buffer (:func:`_copy_to_device`)."""
        # (past the step's tokens, the padding tokens': asynchronous scheduling leaves
        # its -1 placeholders of earlier steps' sampled ids there, out of the
        # embedding's range; vLLM's device buffer holds the real ids there)
        self.input_ids.np[total_num_scheduled_tokens:] = 0
        prev = self.input_batch.prev_sampled_token_ids
        if (prev is None or self._pp_recv_work is not None or self.enable_prompt_embeds
                or scheduler_output.scheduled_spec_decode_tokens or prev.dim() != 2
                or prev.shape[1] != 1):
            return super()._prepare_input_ids(scheduler_output, num_reqs,
                                              total_num_scheduled_tokens, cu_num_tokens)
        prev_rows = self.prev_positions.np[:num_reqs].astype(np.int64)
        cur = np.nonzero(prev_rows >= 0)[0]
        held = self._sampled_rows
        full = held[1] if held is not None and held[0] is prev else prev
        ids = self.input_ids.np
        packed = np.empty((2, ids.shape[0]), np.int32)
        packed[0] = ids
        packed[1] = -1
        packed[1, np.asarray(cu_num_tokens, np.int64)[cur] - 1] = prev_rows[cur]
        _merge_into(self.input_ids.gpu, packed, full)

    def _pads_sampling(self, scheduler_output) -> bool:
        """Whether this step's sampling runs on a request bucket: vLLM's sampler on
        padded rows gives the real rows what it gives them unpadded when sampling reads
        no per-request state beyond temperature, top-k, top-p, seeds and logprob counts
        (no penalties, allowed or bad words, token-id logprobs, active logits processors,
        structured output or thinking budgets: those run at the exact request count)."""
        m = self.input_batch.sampling_metadata
        if (not m.no_penalties or m.allowed_token_ids_mask is not None
                or m.bad_words_token_ids or m.logprob_token_ids
                or getattr(scheduler_output, "has_structured_output_requests", False)):
            return False
        h = m.thinking_budget_state_holder
        if h is not None and h.has_tracked_requests():
            return False
        for proc in m.logitsprocs.all:
            state = _IDLE_WHEN_EMPTY.get(type(proc).__name__)
            if state is None or getattr(proc, state):
                return False
        return True

    def _sample(self, logits, spec_decode_metadata):
        """vLLM's, on the request bucket's rows when :meth:`_prepare_inputs` padded them:
        padded temperature, top-k and top-p (neutral values in the padding rows: 1.0,
        the vocabulary, 1.0), then the sampled ids and logprobs cut to the real requests
        (views: reading them compiles nothing)."""
        R = self.input_batch.num_reqs
        self._sampled_rows = None
        if logits is None or spec_decode_metadata is not None or logits.shape[0] == R:
            return super()._sample(logits, spec_decode_metadata)
        ib = self.input_batch
        ib.update_async_output_token_ids()
        m = ib.sampling_metadata
        Rb = logits.shape[0]

        def pad(host, neutral):  # (a [max_num_seqs] upload and a view, as at start-up)
            h = host.clone()
            h[R:] = neutral
            return _host.upload(h, self.device)[:Rb]

        meta = dataclasses.replace(
            m,
            temperature=None if m.temperature is None
            else pad(ib.temperature_cpu_tensor, 1.0),
            top_p=None if m.top_p is None else pad(ib.top_p_cpu_tensor, 1.0),
            top_k=None if m.top_k is None else pad(ib.top_k_cpu_tensor, ib.vocab_size))
        out = self.sampler(logits=logits, sampling_metadata=meta)
        lp = out.logprobs_tensors
        if lp is not None:
            lp = type(lp)(*(t[:R] if isinstance(t, torch.Tensor) and t.dim()
                            and t.shape[0] == Rb else t for t in lp))
        cut = out.sampled_token_ids[:R]
        self._sampled_rows = (cut, out.sampled_token_ids)  # (_prepare_input_ids)
        return dataclasses.replace(out, sampled_token_ids=cut, logprobs_tensors=lp)

    def _preprocess(self, scheduler_output, num_input_tokens, intermediate_tensors=None):
        """vLLM's, without its zeroing of the padding tokens' positions on the device
        (a slice of the step's exact length; :meth:`_bookkeeping_on_host` uploaded them
        zero)."""
        shadow = self.__dict__.get("_host_shadows", {}).get("positions")
        if shadow is None:  # (no step prepared on the host yet)
            return super()._preprocess(scheduler_output, num_input_tokens,
                                       intermediate_tensors)
        saved = self.positions
        self.positions = shadow
        try:
            out = list(super()._preprocess(scheduler_output, num_input_tokens,
                                           intermediate_tensors))
        finally:
            self.positions = saved
        if out[2] is not None and out[2].device.type == "cpu":  # (not M-RoPE positions)
            out[2] = saved[: out[2].shape[0]]
        return tuple(out)

    def _get_slot_mappings(self, num_tokens_padded: int, num_reqs_padded: int,
                           num_tokens_unpadded: int, ubatch_slices=None):
        """vLLM's, without its ``fill_(-1)`` of the padding tokens' slots on the device
        (a slice of the step's exact length; a dummy run fills its whole mapping).  In
        a step the device slot mappings are not even read (:attr:`_host_only`): each KV
        cache group's is its buffer's first ``num_tokens_padded`` slots as they are, and
        every layer of the group gets it (as vLLM's)."""
        groups = getattr(getattr(self, "kv_cache_config", None), "kv_cache_groups", None)
        if _host.current() is not self or ubatch_slices is not None or not groups or any(
                type(g.kv_cache_spec).__name__ == "EncoderOnlyAttentionSpec"
                for g in groups):
            return super()._get_slot_mappings(num_tokens_padded, num_reqs_padded,
                                              num_tokens_padded, ubatch_slices)
        by_gid = {gid: self.input_batch.block_table[gid].slot_mapping.gpu[:num_tokens_padded]
                  for gid in range(len(groups))}
        return by_gid, {name: by_gid[gid] for gid, g in enumerate(groups)
                        for name in g.layer_names}

    def warm_up_sampling(self, hidden_states: torch.Tensor, done: dict) -> None:
        """Run, for a dummy step's ``hidden_states`` (``[Tp, hidden]``), what a step
        samples with at every request bucket ``Rb <= min(Tp, max_num_seqs)``: the rows'
        gather (``[Tp] -> [Rb]``), and per bucket until a pass makes no new XLA executable
        (``done[Rb]`` is True then; in-place ops get their donating variants after a few
        calls) the logits and vLLM's sampler: greedy, and at a temperature (all requests
        or some) with neither, either or both of top-k and top-p, a seeded request, and
        every request seeded (the dtypes of the real batches'), so that serving compiles
        none of them.  Logprobs, penalties and logits processors are not warmed (their
        first use at a request bucket compiles it)."""
        from vllm.v1.sample.logits_processor import LogitsProcessors
        from vllm.v1.sample.metadata import SamplingMetadata

        ib = self.input_batch
        Tp = hidden_states.shape[0]
        Rb = 1
        while True:
            rows = _host.upload(np.zeros(self.max_num_reqs, np.int32), self.device)[:Rb]
            h = hidden_states[rows]
            if done.get(Rb) is not True:  # (until a pass over it makes nothing new)
                made = _executables_made()
                logits = self.model.compute_logits(h)
                full = lambda host, v: _host.upload(  # noqa: E731 (as _sample's)
                    torch.full(host.shape, v, dtype=host.dtype), self.device)[:Rb]
                temp = full(ib.temperature_cpu_tensor, 0.5)
                base = SamplingMetadata(
                    temperature=None, all_greedy=True, all_random=False, top_p=None,
                    top_k=None, generators={}, max_num_logprobs=None,
                    logprob_token_ids=None, no_penalties=True, prompt_token_ids=None,
                    frequency_penalties=temp, presence_penalties=temp,
                    repetition_penalties=temp, output_token_ids=[[] for _ in range(Rb)],
                    spec_token_ids=[[] for _ in range(Rb)], allowed_token_ids_mask=None,
                    bad_words_token_ids={}, logitsprocs=LogitsProcessors())
                greedy = self.sampler(logits=logits, sampling_metadata=base)
                top_p = full(ib.top_p_cpu_tensor, 0.9)
                top_k = full(ib.top_k_cpu_tensor, max(ib.vocab_size - 1, 1))
                for all_random in (True, False):  # (False: some requests greedy)
                    for k, p in ((None, None), (top_k, None), (None, top_p),
                                 (top_k, top_p)):
                        self.sampler(logits=logits, sampling_metadata=dataclasses.replace(
                            base, temperature=temp, all_greedy=False,
                            all_random=all_random, top_k=k, top_p=p))
                # a seeded request draws its row with its own generator; when every row
                # is seeded, the first draw writes the noise tensor still uninitialized
                # (vLLM skips the batch draw): another signature
                gen = torch.Generator(device=self.device).manual_seed(0)
                for seeded in ({0: gen}, dict.fromkeys(range(Rb), gen)):
                    self.sampler(logits=logits, sampling_metadata=dataclasses.replace(
                        base, temperature=temp, all_greedy=False, all_random=True,
                        generators=seeded))
                # asynchronous scheduling's merge of this bucket's sampled ids into
                # the next step's input ids (_prepare_input_ids)
                _merge_into(self.input_ids.gpu,
                            np.zeros((2, self.input_ids.np.shape[0]), np.int32),
                            greedy.sampled_token_ids)
                done[Rb] = _executables_made() == made
            if Rb >= min(Tp, self.max_num_reqs):
                break
            Rb = bucket(Rb + 1, 1, self.max_num_reqs)

    def execute_model(self, *args, **kwargs):
        """vLLM's, with this runner's host copies readable (``_host.current``) by the
        slot mapping and the attention metadata."""
        with _host.stepping(self):
            return super().execute_model(*args, **kwargs)

    def _prepare_padding_mask(self, num_tokens_unpadded: int,
                              num_tokens_padded: int) -> torch.Tensor:
        """vLLM's padding mask (bool ``[num_tokens_padded]``, True past the step's
        tokens) built on the host and uploaded whole: vLLM fills two slices of a device
        buffer at the exact token count, a new program for every new count.  One
        tensor per token count, kept (read only, by the model's MoE routers)."""
        key = (num_tokens_unpadded, num_tokens_padded)
        mask = self._padding_masks.get(key)
        if mask is None:
            if len(self._padding_masks) >= 256:
                self._padding_masks.clear()
            mask = self._padding_masks[key] = _host.upload(
                np.arange(num_tokens_padded) >= num_tokens_unpadded, self.device)
        return mask

    def _sync_device(self) -> None:
        torch.tpu.synchronize(self.device)

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        return sampled_token_ids.tolist()
