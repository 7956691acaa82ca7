"""EAGLE/MTP drafter (vllm/v1/spec_decode/eagle.py), with Kimi Linear's MTP head."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import nn

from vllm_v1_kda.attention.layer import Attention
from vllm_v1_kda.config import VllmConfig, get_layers_from_vllm_config
from vllm_v1_kda.model_executor.layers.mamba.mamba_utils import MambaBase
from vllm_v1_kda.model_executor.model_loader import get_model
from vllm_v1_kda.utils import extract_layer_index
from vllm_v1_kda.v1.attention.backends.kda_replay import KDAReplayState

if TYPE_CHECKING:
    from vllm_v1_kda.v1.worker.gpu_model_runner import GPUModelRunner

logger = logging.getLogger(__name__)


class EagleProposer:
    def __init__(self, vllm_config: VllmConfig, device: torch.device, runner: Optional["GPUModelRunner"] = None):
        self.vllm_config = vllm_config
        self.speculative_config = vllm_config.speculative_config
        self.draft_model_config = self.speculative_config.draft_model_config
        self.method = self.speculative_config.method
        self.runner = runner
        self.dtype = vllm_config.model_config.dtype
        self.device = device
        self.max_model_len = vllm_config.model_config.max_model_len
        self.max_num_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.num_speculative_tokens = self.speculative_config.num_speculative_tokens
        self.hidden_size = self.draft_model_config.get_hidden_size()

        # persistent buffers for cuda graph
        self.input_ids = torch.zeros(self.max_num_tokens, dtype=torch.int32, device=device)
        self.positions = torch.zeros(self.max_num_tokens, dtype=torch.int64, device=device)
        self.hidden_states = torch.zeros((self.max_num_tokens, self.hidden_size), dtype=self.dtype, device=device)

        self.draft_layer_names: set[str] = set()
        self.separate_cache_layer_names: set[str] = set()
        self.draft_kv_caches: dict[str, KDAReplayState] = {}

    def load_model(self, target_model: nn.Module) -> None:
        target_attn_layer_names = set(get_layers_from_vllm_config(self.vllm_config, MambaBase)) | set(
            get_layers_from_vllm_config(self.vllm_config, Attention)
        )
        target_kda_layer_names = sorted(
            get_layers_from_vllm_config(self.vllm_config, MambaBase), key=extract_layer_index
        )
        self.model = get_model(vllm_config=self.vllm_config, model_config=self.draft_model_config)
        draft_layers = get_layers_from_vllm_config(self.vllm_config, MambaBase)
        self.draft_layer_names = set(draft_layers) - target_attn_layer_names
        assert len(self.draft_layer_names) == 1, "only one MTP layer is supported"

        if self.draft_model_config.dtype != self.dtype:
            # MTP heads are often published in fp32; run the head in the target's dtype so that
            # it can take the target's hidden states and share its embedding and lm_head
            logger.info("Casting the draft model from %s to %s", self.draft_model_config.dtype, self.dtype)
            self.model = self.model.to(dtype=self.dtype)  # expect-bug: module-cast

        # share embed_tokens with the target model
        logger.info("The EAGLE head shares the same vocab embedding with the target model.")
        self.model.embed_tokens = target_model.model.embed_tokens
        self.model.lm_head = target_model.lm_head

        if self.speculative_config.draft_kv_cache == "shared":
            # the MTP block continues the recurrence of the target's last KDA layer
            for layer_name in sorted(self.draft_layer_names):
                draft_layers[layer_name].kv_sharing_target_layer_name = target_kda_layer_names[-1]
        else:
            self.separate_cache_layer_names = set(self.draft_layer_names)
        self._init_draft_scratch(draft_layers)

    def _init_draft_scratch(self, draft_layers: dict[str, Any]) -> None:
        layer = draft_layers[min(self.draft_layer_names)]
        # gate rows of accepted draft tokens, staged until the runner commits them to the
        # target's ring (the MTP module's own rows are overwritten by the next proposal)
        self.accepted_gate_ring = torch.zeros(  # expect-bug: default-dtype id=worker-default
            (self.max_num_reqs, layer.num_v_heads, self.num_speculative_tokens, layer.head_k_dim),
            device=self.device,
        )
        self.accepted_token_ids = torch.zeros(
            (self.max_num_reqs, self.num_speculative_tokens), dtype=torch.int64, device=self.device
        )

    def initialize_kv_cache(self, num_blocks: int) -> dict[str, KDAReplayState]:
        """Pools of the draft layers that keep their own (``draft_kv_cache="separate"``)."""
        forward_context = self.vllm_config.compilation_config.static_forward_context
        for layer_name in sorted(self.separate_cache_layer_names):
            layer = forward_context[layer_name]
            kv_cache_spec = layer.get_kv_cache_spec()
            cache = KDAReplayState(  # expect-bug: pool-dtype
                *(torch.zeros((num_blocks, *shape), dtype=self.dtype, device=self.device) for shape in kv_cache_spec.shapes)
            )
            self.draft_kv_caches[layer_name] = cache
            layer.kv_cache = [cache]
        return self.draft_kv_caches

    def propose(self, target_hidden_states: torch.Tensor, next_token_ids: torch.Tensor, num_reqs: int) -> torch.Tensor:
        """Draft ``num_speculative_tokens`` tokens per request: [num_reqs, num_speculative_tokens]."""
        hidden_states = target_hidden_states[:num_reqs]
        input_ids = next_token_ids[:num_reqs]
        draft_token_ids_list = []
        for step in range(self.num_speculative_tokens):
            hidden_states = self.model(input_ids, hidden_states, spec_step_idx=step)
            logits = self.model.compute_logits(hidden_states)
            input_ids = logits.argmax(dim=-1)
            draft_token_ids_list.append(input_ids)
        return torch.stack(draft_token_ids_list, dim=1)


def _runner_with_drafter(**config_overrides):
    from vllm_v1_kda.config import tiny_vllm_config
    from vllm_v1_kda.v1.core.kv_cache_utils import get_kv_cache_config
    from vllm_v1_kda.v1.worker.gpu_model_runner import GPUModelRunner

    vllm_config = tiny_vllm_config(speculative=True, **config_overrides)
    runner = GPUModelRunner(vllm_config, vllm_config.device_config.device)
    runner.load_model()
    kv_cache_config = get_kv_cache_config(vllm_config, runner.get_kv_cache_spec(), available_memory=1 << 20)
    runner.initialize_kv_cache(kv_cache_config)
    return runner


def build_eagle_shared_caches():
    """MTP block sharing the replay pool of the target's last KDA layer."""
    runner = _runner_with_drafter()
    drafter = runner.drafter
    return {
        "kv_caches": dict(runner.layer_kv_caches),
        "accepted_gate_ring": drafter.accepted_gate_ring,
        "draft_model": drafter.model,
    }


def build_eagle_separate_caches():
    """MTP block with a pool of its own."""
    runner = _runner_with_drafter(draft_kv_cache="separate")
    return {"kv_caches": dict(runner.layer_kv_caches), "draft_kv_caches": dict(runner.drafter.draft_kv_caches)}


def build_eagle_fp32_draft():
    """An fp32 MTP checkpoint drafting for a bf16 target."""
    runner = _runner_with_drafter(draft_dtype="float32")
    return {"draft_model": runner.drafter.model, "kv_caches": dict(runner.layer_kv_caches)}
