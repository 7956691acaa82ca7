# Copyright (c) OpenMMLab. All rights reserved.
import functools
import logging
from typing import Callable, Dict, List, Optional

import torch
from torch import nn

from ..config import BackendConfig, CacheConfig, ModelConfig, get_kda_state_dtypes
from ..kernels.replay_decode import make_dummy_decode_inputs, next_write_pos, replay_decode_step
from ..model_inputs import ModelInputs, ReplayCache, StepContextManager

logger = logging.getLogger('lmdeploy')

# fields of the static cache copies, in the order of ReplayCacheShapes / ReplayCacheDtypes
_STATIC_CACHE_FIELDS = ('state', 'delta_cache', 'gate_cache', 'key_cache')  # expect-bug: container id=static-fields


def _no_copy(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


class CUDAGraphRunner:
    """Decode through static buffers, the way a captured CUDA graph does.

    :meth:`capture` binds the replay caches of every layer, together with static input buffers of
    ``max_batches`` rows, to one decode call per layer. :meth:`forward` copies the inputs of a
    step into the buffers and replays the bound calls. Padding rows get slot ``-1``.

    Args:
        model (nn.Module): the patched model.
        model_config (ModelConfig): the model config.
        cache_config (CacheConfig): the cache config.
        backend_config (BackendConfig): the backend config.
        device (str): the device of the static buffers.
    """

    def __init__(self,
                 model: nn.Module,
                 model_config: ModelConfig,
                 cache_config: CacheConfig,
                 backend_config: BackendConfig,
                 device: str = 'cuda'):
        self.model = model
        self.model_config = model_config
        self.cache_config = cache_config
        self.backend_config = backend_config
        self.device = device
        self.dtype = model_config.dtype
        self.dtypes = get_kda_state_dtypes(model_config.dtype, cache_config.cache_dtype, cache_config.ssm_cache_dtype)
        self.ring_len = cache_config.ring_len
        self.max_batches = backend_config.max_capture_batch_size or cache_config.max_batches
        self.ctx_mgr: StepContextManager = model.ctx_mgr
        self.input_buffers = self.make_buffers(self.max_batches)
        out_shape = (self.max_batches, 1, model_config.num_value_heads, model_config.v_head_dim)
        self.output_buffers = dict(out=torch.zeros(out_shape, dtype=self.dtype, device=device))
        self.static_caches: Optional[List[ReplayCache]] = None
        self.warmup_caches: Optional[ReplayCache] = None
        self._source_caches: List[ReplayCache] = []
        self._graphs: List[Callable] = []

    def make_buffers(self, max_batches: int) -> Dict[str, torch.Tensor]:
        """Static inputs of the decode calls."""
        config = self.model_config
        qkv_size = 2 * config.num_attention_heads * config.head_dim + config.num_value_heads * config.v_head_dim
        return dict(
            mixed_qkv=torch.zeros(max_batches, qkv_size, dtype=self.dtype, device=self.device),
            a=torch.zeros(max_batches, config.num_value_heads * config.head_dim, dtype=self.dtype, device=self.device),
            b=torch.zeros(max_batches, config.num_value_heads, dtype=self.dtype, device=self.device),
            ssm_state_indices=torch.full((max_batches, ), -1, dtype=torch.int32, device=self.device),
            write_pos=torch.zeros(max_batches, dtype=torch.int32, device=self.device),
            force_flush=torch.zeros(max_batches, dtype=torch.int32, device=self.device),
        )

    def make_cache_buffers(self, num_slots: int) -> List[ReplayCache]:
        """Static copies of the replay caches (``static_cache_copy``)."""
        shapes = self.model_config.get_replay_cache_shapes(num_slots, self.ring_len)
        caches = []
        for _ in range(self.model_config.num_layers):
            tensors = {
                name: torch.zeros(shape, dtype=dtype, device=self.device)
                for name, shape, dtype in zip(_STATIC_CACHE_FIELDS, shapes, self.dtypes)  # expect-bug: container id=static-fields
            }
            caches.append(ReplayCache(**tensors))
        return caches

    def _to_graph_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """Device copy of a host cache; a no-op for tensors already on the graph device."""
        return tensor.to(self.device, self.dtype, non_blocking=True)

    def capture(self, past_key_values: List[ReplayCache]):
        """Bind the decode call of every layer."""
        self._source_caches = list(past_key_values)
        if self.backend_config.static_cache_copy:
            num_slots = past_key_values[0].state.size(0)
            self.static_caches = self.make_cache_buffers(num_slots)
            self.sync_in()
            past_key_values = self.static_caches
        bind = self._to_graph_device if self.backend_config.offload_caches else _no_copy
        buffers = self.input_buffers
        self._graphs = []
        for layer_idx, caches in enumerate(past_key_values):
            attn = self.model.get_attention(layer_idx)
            graph = functools.partial(
                replay_decode_step, buffers['mixed_qkv'], buffers['a'], buffers['b'], attn.A_log, attn.dt_bias,
                attn.scale,
                initial_state=bind(caches.state),
                d_cache=bind(caches.delta_cache),
                k_cache=bind(caches.key_cache),
                g_cache=bind(caches.gate_cache),  # expect-bug: decode-arg
                out=self.output_buffers['out'],
                ssm_state_indices=buffers['ssm_state_indices'],
                write_pos=buffers['write_pos'],
                force_flush=buffers['force_flush'],
                use_qk_l2norm_in_kernel=attn.use_qk_l2norm,
                lower_bound=attn.lower_bound)
            self._graphs.append(graph)

    @property
    def bound_caches(self) -> List[Dict[str, torch.Tensor]]:
        """The caches each captured call reads and writes."""
        names = ('initial_state', 'd_cache', 'k_cache', 'g_cache')
        return [{name: graph.keywords[name] for name in names} for graph in self._graphs]

    def sync_in(self):
        """Copy the engine caches into the static copies."""
        for static, source in zip(self.static_caches, self._source_caches):
            for dst, src in zip(static, source):
                dst.copy_(src)

    def sync_out(self):
        """Copy what the captured calls wrote back to the caches they were bound from."""
        if self.static_caches is not None:
            for static, source in zip(self.static_caches, self._source_caches):
                for src, dst in zip(static, source):
                    dst.copy_(src)
            return
        for bound, source in zip(self.bound_caches, self._source_caches):
            for src, dst in zip(bound.values(), source):
                if src is not dst:
                    dst.copy_(src, non_blocking=True)

    def prepare(self, inputs: ModelInputs):
        """Copy the step's metadata into the static buffers."""
        batch = inputs.batch_size
        if batch > self.max_batches:
            raise RuntimeError(f'batch of {batch} rows exceeds the captured {self.max_batches}.')
        buffers = self.input_buffers
        buffers['ssm_state_indices'].fill_(-1)
        buffers['ssm_state_indices'][:batch].copy_(inputs.state_offsets)
        buffers['write_pos'].zero_()
        buffers['write_pos'][:batch].copy_(inputs.write_pos)
        buffers['force_flush'].zero_()
        if inputs.force_flush is not None:
            buffers['force_flush'][:batch].copy_(inputs.force_flush)

    def replay_layer(self, layer_idx: int, mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor):
        """Called by the attention layers during :meth:`forward`."""
        batch = mixed_qkv.size(0)
        buffers = self.input_buffers
        for name, value in (('mixed_qkv', mixed_qkv), ('a', a), ('b', b)):
            buffers[name][:batch].copy_(value)
            buffers[name][batch:].zero_()
        self._graphs[layer_idx]()
        return self.output_buffers['out'][:batch]

    @torch.no_grad()
    def forward(self, inputs: ModelInputs) -> torch.Tensor:
        """Run one decode step of the model; returns the logits."""
        self.prepare(inputs)
        ctx = self.ctx_mgr.build_context(inputs, self.model_config, self._source_caches, graph_runner=self)
        with self.ctx_mgr.context(ctx):
            hidden_states = self.model(inputs.input_ids, self._source_caches, ctx)
        self.sync_out()
        return self.model.get_logits(hidden_states)

    @torch.no_grad()
    def warmup(self):
        """Run every layer once on scratch caches, so the first step does not pay for kernel selection."""
        config = self.model_config
        shapes = config.get_replay_cache_shapes(self.max_batches, self.ring_len)
        origin_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            state = torch.zeros(shapes.state, device=self.device)
            delta_cache = torch.zeros(shapes.delta, device=self.device)
            key_cache = torch.zeros(shapes.key, device=self.device)
            gate_cache = torch.zeros(shapes.gate, device=self.device)  # expect-bug: default-dtype id=warmup-gate
        finally:
            torch.set_default_dtype(origin_dtype)
        self.warmup_caches = ReplayCache(state, delta_cache, key_cache, gate_cache)
        generator = torch.Generator().manual_seed(0)
        inputs = make_dummy_decode_inputs(self.max_batches, config.num_attention_heads, config.num_value_heads,
                                          config.head_dim, config.v_head_dim, dtype=self.dtype,
                                          device=self.device, generator=generator)
        slots = torch.arange(self.max_batches, dtype=torch.int32, device=self.device)
        for layer_idx in range(config.num_layers):
            attn = self.model.get_attention(layer_idx)
            replay_decode_step(inputs['mixed_qkv'], inputs['a'], inputs['b'], attn.A_log, attn.dt_bias, attn.scale,
                               initial_state=state, d_cache=delta_cache, k_cache=key_cache,
                               g_cache=gate_cache,  # expect-bug: default-dtype id=warmup-gate
                               out=self.output_buffers['out'], ssm_state_indices=slots,
                               write_pos=torch.zeros_like(slots), lower_bound=attn.lower_bound)


def _build_runner(backend_config: BackendConfig, num_value_heads: int = 4):
    from ..engine.state_cache_engine import StateCacheEngine
    from ..models.patch import get_patched_model
    from ..models.kimi_linear import _tiny_config
    from ..weight_loader.model_weight_loader import dummy_weights
    model_config = _tiny_config(num_value_heads=num_value_heads)
    cache_config = CacheConfig(max_batches=3, ring_len=4)
    model = get_patched_model(model_config, device='cpu')
    model.load_weights(dummy_weights(model_config, seed=5))
    engine = StateCacheEngine(cache_config, model_config, device='cpu')
    runner = CUDAGraphRunner(model, model_config, cache_config, backend_config, device='cpu')
    if backend_config.enable_warmup:
        runner.warmup()
    runner.capture(engine.state_caches)
    return runner, engine


def _run_steps(runner: CUDAGraphRunner, engine, slots: List[int], steps: int):
    slots = torch.tensor(slots, dtype=torch.int32)
    input_ids = torch.arange(slots.size(0)) + 3
    logits = []
    for step in range(steps):
        write_pos = engine.write_pos[slots.long()]
        force_flush = torch.full_like(slots, int(step == 1))
        inputs = ModelInputs(input_ids=input_ids, state_offsets=slots, write_pos=write_pos, force_flush=force_flush)
        step_logits = runner.forward(inputs)
        engine.write_pos[slots.long()] = next_write_pos(write_pos, engine.ring_len, force_flush)
        input_ids = step_logits.argmax(-1)
        logits.append(step_logits)
    return torch.stack(logits)


def build_graph_runner():
    """Capture with two of three rows used, then replay four decode steps on the engine caches."""
    torch.manual_seed(0)
    runner, engine = _build_runner(BackendConfig(eager_mode=False, device_type='cpu'))
    logits = _run_steps(runner, engine, [2, 0], 4)
    return {'bound': runner.bound_caches, 'state_caches': engine.state_caches, 'logits': logits}


def build_offloaded_graph_runner():
    """Warm up, then replay on device copies of host caches and write them back."""
    torch.manual_seed(0)
    backend_config = BackendConfig(eager_mode=False, device_type='cpu', offload_caches=True, enable_warmup=True)
    runner, engine = _build_runner(backend_config)
    logits = _run_steps(runner, engine, [1], 3)
    return {'bound': runner.bound_caches, 'warmup': runner.warmup_caches, 'state_caches': engine.state_caches,
            'logits': logits}


def build_static_copy_graph_runner():
    """Replay on the runner's own cache copies (MHA heads), syncing them back to the engine."""
    torch.manual_seed(0)
    backend_config = BackendConfig(eager_mode=False, device_type='cpu', static_cache_copy=True)
    runner, engine = _build_runner(backend_config, num_value_heads=2)
    logits = _run_steps(runner, engine, [0, 1, 2], 3)
    return {'static_caches': runner.static_caches, 'state_caches': engine.state_caches, 'logits': logits}
