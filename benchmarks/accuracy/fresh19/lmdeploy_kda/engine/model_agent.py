# Copyright (c) OpenMMLab. All rights reserved.
import logging
from typing import Dict, Iterable, List, Optional, Tuple

import torch
from torch import nn

from ..config import BackendConfig, CacheConfig, ModelConfig, SpecDecodeConfig
from ..kernels.replay_decode import next_write_pos
from ..model_inputs import ModelInputs, ReplayCache, StepContextManager
from ..models.kimi_linear import KDAReplayCache
from ..models.patch import get_patched_model
from ..weight_loader.model_weight_loader import dummy_weights
from .state_cache_engine import StateCacheEngine

logger = logging.getLogger('lmdeploy')

WeightsIterator = Iterable[Tuple[str, torch.Tensor]]


class ModelAgent:
    """Single process model agent: builds the patched model and its caches and runs decode steps.

    Args:
        model_config (ModelConfig): the model config.
        cache_config (CacheConfig): the cache config.
        backend_config (BackendConfig): the backend config.
        weights (Iterable): ``(name, tensor)`` pairs of the checkpoint.
        spec_config (SpecDecodeConfig): speculative decoding config, if any.
        draft_weights (Iterable): weights of the draft model.
        device (str): the device.
    """

    def __init__(self,
                 model_config: ModelConfig,
                 cache_config: CacheConfig,
                 backend_config: BackendConfig,
                 weights: WeightsIterator,
                 spec_config: Optional[SpecDecodeConfig] = None,
                 draft_weights: Optional[WeightsIterator] = None,
                 device: str = 'cuda'):
        self.model_config = model_config
        self.cache_config = cache_config
        self.backend_config = backend_config
        self.spec_config = spec_config
        self.device = device
        self.ctx_mgr = StepContextManager()
        self.patched_model = self._build_model(weights)
        self.state_cache_engine: Optional[StateCacheEngine] = None
        if not cache_config.cache_in_model:
            self.state_cache_engine = StateCacheEngine(cache_config, model_config, spec_config, device=device)
        self.draft_model: Optional[nn.Module] = None
        self.draft_prompt_caches: Dict[int, ReplayCache] = dict()
        if spec_config is not None:
            self.draft_model = self._build_draft_model(draft_weights)

    def _build_model(self, weights: WeightsIterator) -> nn.Module:
        """Build the patched model and load its weights."""
        patched_model = get_patched_model(self.model_config,
                                          device=self.device,
                                          cache_config=self.cache_config,
                                          ctx_mgr=self.ctx_mgr)
        patched_model.load_weights(weights)
        return patched_model

    def _build_draft_model(self, weights: WeightsIterator) -> nn.Module:
        """Build the MTP draft model; it keeps its replay caches as buffers."""
        draft_config = self.model_config.draft_config(self.spec_config.num_draft_layers)
        draft_model = get_patched_model(draft_config, device=self.device)
        draft_model.load_weights(weights)
        draft_model.replay_cache = KDAReplayCache(draft_config,
                                                  self.cache_config.num_gpu_slots,
                                                  self.cache_config.ring_len,
                                                  dtype=draft_config.dtype,
                                                  device=self.device)
        if self.spec_config.draft_dtype == 'float16':
            # the draft is built in the model dtype so that the shared weights load without a copy
            draft_model = draft_model.half()  # expect-bug: module-cast
        return draft_model

    @property
    def replay_cache(self) -> Optional[KDAReplayCache]:
        return getattr(self.patched_model, 'replay_cache', None)

    def get_past_key_values(self) -> List[ReplayCache]:
        if self.cache_config.cache_in_model:
            return self.replay_cache.layer_caches()
        return self.state_cache_engine.state_caches

    def _get_write_pos(self) -> torch.Tensor:
        if self.cache_config.cache_in_model:
            return self.replay_cache.write_pos
        return self.state_cache_engine.write_pos

    def ensure_cache_slots(self, num_slots: int):
        """Grow the in-model caches when the scheduler admits more sequences."""
        if self.cache_config.cache_in_model:
            self.replay_cache.resize_slots(num_slots)
        elif num_slots > self.state_cache_engine.num_caches:
            raise RuntimeError(f'{num_slots} slots exceed the {self.state_cache_engine.num_caches} of the engine.')

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, slots: torch.Tensor, force_flush: Optional[torch.Tensor] = None):
        """One decode step; the cursors of ``slots`` are advanced. Returns the logits."""
        cursors = self._get_write_pos()
        write_pos = cursors[slots.clamp(min=0).long()]
        inputs = ModelInputs(input_ids=input_ids, state_offsets=slots, write_pos=write_pos, force_flush=force_flush)
        inputs = inputs.to_device(self.device)
        past_key_values = self.get_past_key_values()
        ctx = self.ctx_mgr.build_context(inputs, self.model_config, past_key_values)
        with self.ctx_mgr.context(ctx):
            hidden_states = self.patched_model(inputs.input_ids, past_key_values, ctx)
            logits = self.patched_model.get_logits(hidden_states)
        valid = slots >= 0
        cursors[slots[valid].long()] = next_write_pos(write_pos, self.cache_config.ring_len, force_flush)[valid]
        return logits

    @torch.no_grad()
    def update_params(self, weights: WeightsIterator):
        """Load new weights (e.g. from a trainer) into the running model."""
        self.patched_model.load_weights(weights)
        # trainers send float32 weights; keep serving in the model dtype
        self.patched_model.to(self.model_config.dtype)  # expect-bug: module-cast

    @torch.no_grad()
    def warm_start_draft(self, prompt_ids: torch.Tensor, slot: int) -> ReplayCache:
        """Fill the draft caches of ``slot`` from a short prompt."""
        draft_model = self.draft_model
        hidden_states = draft_model.model.embed_tokens(prompt_ids)
        cache = draft_model.replay_cache
        for layer_idx, layer in enumerate(draft_model.model.layers):
            prompt_cache, write_pos = layer.self_attn.prefill_ring(layer.input_layernorm(hidden_states), cache.ring_len)
            self.draft_prompt_caches[layer_idx] = prompt_cache
            for dst, src in zip(cache.layer_caches()[layer_idx], prompt_cache):
                dst[slot].copy_(src)
            cache.write_pos[slot] = write_pos
        return self.draft_prompt_caches[0]


def _generate(agent: ModelAgent, slots: List[int], steps: int, flush_step: int = -1):
    slots = torch.tensor(slots, dtype=torch.int32)
    input_ids = torch.arange(slots.size(0)) + 1
    logits = []
    for step in range(steps):
        force_flush = torch.full_like(slots, int(step == flush_step))
        step_logits = agent.forward(input_ids, slots, force_flush)
        input_ids = step_logits.argmax(-1)
        logits.append(step_logits)
    return torch.stack(logits)


def build_model_agent():
    """Agent with a state cache engine: decode, receive new weights, decode again."""
    from ..models.kimi_linear import _tiny_config
    torch.manual_seed(0)
    model_config = _tiny_config()
    cache_config = CacheConfig(max_batches=3, ring_len=4)
    agent = ModelAgent(model_config, cache_config, BackendConfig(device_type='cpu'), dummy_weights(model_config),
                       device='cpu')
    logits = _generate(agent, [0, 2], 3, flush_step=1)
    agent.update_params(dummy_weights(model_config, seed=1))
    logits = [logits, _generate(agent, [2, 0, -1], 2)]
    return {'state_caches': agent.state_cache_engine.state_caches, 'logits': logits}


def build_updated_model_agent():
    """Agent with in-model caches: decode, admit more sequences, receive new weights."""
    from ..models.kimi_linear import _tiny_config
    torch.manual_seed(0)
    model_config = _tiny_config(num_value_heads=2)
    cache_config = CacheConfig(max_batches=2, ring_len=4, cache_in_model=True)
    agent = ModelAgent(model_config, cache_config, BackendConfig(device_type='cpu'), dummy_weights(model_config),
                       device='cpu')
    logits = _generate(agent, [0, 1], 2)
    agent.ensure_cache_slots(3)
    agent.update_params(dummy_weights(model_config, seed=2))
    logits = [logits, _generate(agent, [2, 1, 0], 2)]
    return {'model': agent.patched_model, 'logits': logits}


def build_spec_model_agent():
    """Agent with an fp16 MTP draft model warm started from a prompt."""
    from ..models.kimi_linear import _tiny_config
    torch.manual_seed(0)
    model_config = _tiny_config(num_value_heads=2, lower_bound=-5.0)
    cache_config = CacheConfig(max_batches=2, ring_len=8)
    spec_config = SpecDecodeConfig(num_speculative_tokens=2, draft_dtype='float16')
    draft_config = model_config.draft_config(spec_config.num_draft_layers)
    agent = ModelAgent(model_config, cache_config, BackendConfig(device_type='cpu'), dummy_weights(model_config),
                       spec_config=spec_config, draft_weights=dummy_weights(draft_config, seed=7), device='cpu')
    prompt_cache = agent.warm_start_draft(torch.tensor([3, 5, 7]), slot=1)
    logits = _generate(agent, [1], 2)
    return {'draft_model': agent.draft_model, 'prompt_cache': prompt_cache, 'logits': logits}
