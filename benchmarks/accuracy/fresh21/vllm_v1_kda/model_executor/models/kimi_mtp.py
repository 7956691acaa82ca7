"""Kimi Linear multi-token prediction head, used as an MTP drafter (vllm/model_executor/models/deepseek_mtp.py style)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm_v1_kda.config import ModelConfig, VllmConfig, set_current_vllm_config, tiny_vllm_config
from vllm_v1_kda.model_executor.models.kimi_linear import KimiDecoderLayer, KimiRMSNorm
from vllm_v1_kda.model_executor.model_loader.weight_utils import default_weight_loader


class KimiMultiTokenPredictorLayer(nn.Module):
    # GLA-style gate of the draft rows (logsigmoid / normalizer), as in the MTP head's training
    gate_logit_normalizer = 16.0

    def __init__(self, vllm_config: VllmConfig, model_config: ModelConfig, layer_idx: int, prefix: str) -> None:
        super().__init__()
        config = model_config.hf_config
        target_dtype = vllm_config.model_config.dtype
        self.enorm = KimiRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.hnorm = KimiRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        # eh_proj consumes the target's hidden states: keep it in the target dtype even when
        # the draft checkpoint is fp32
        self.eh_proj = nn.Linear(config.hidden_size * 2, config.hidden_size, bias=False).to(dtype=target_dtype)
        self.mtp_block = KimiDecoderLayer(
            config, layer_idx, model_config, vllm_config.cache_config, prefix=f"{prefix}.mtp_block", force_kda=True
        )
        attn = self.mtp_block.self_attn
        spec_config = vllm_config.speculative_config
        num_spec = spec_config.num_speculative_tokens if spec_config is not None else 1
        max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        ring_dtype = attn.get_state_dtype()[1]
        # Draft steps write their ring rows here rather than into the pool: the runner commits
        # the rows of accepted tokens and drops the rest.
        self.register_buffer(
            "draft_d_ring",
            torch.zeros((max_num_reqs, attn.num_v_heads, num_spec, attn.head_v_dim), dtype=ring_dtype),
            persistent=False,
        )
        self.register_buffer(
            "draft_k_ring",
            torch.zeros((max_num_reqs, attn.num_heads, num_spec, attn.head_k_dim), dtype=ring_dtype),
            persistent=False,
        )
        self.register_buffer(
            "draft_gate_ring",
            torch.zeros((max_num_reqs, attn.num_v_heads, num_spec, attn.head_k_dim), dtype=torch.float32),
            persistent=False,
        )

    def compute_draft_gate(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Log-decays of one draft step, [num_reqs, HV, K]."""
        attn = self.mtp_block.self_attn
        gate_logits = attn.f_b_proj(attn.f_a_proj(hidden_states)).view(-1, attn.num_v_heads, attn.head_k_dim)
        return F.logsigmoid(gate_logits) / self.gate_logit_normalizer  # expect-bug: promotion

    def resize_draft_rows(self, max_num_reqs: int) -> None:
        """Regrow the draft rows when max_num_seqs is raised after start-up."""
        self.draft_d_ring = self.draft_d_ring.new_zeros((max_num_reqs, *self.draft_d_ring.shape[1:]))
        self.draft_k_ring = self.draft_k_ring.new_zeros((max_num_reqs, *self.draft_k_ring.shape[1:]))
        self.draft_gate_ring = self.draft_k_ring.new_zeros((max_num_reqs, *self.draft_gate_ring.shape[1:]))  # expect-bug: like

    def forward(
        self, inputs_embeds: torch.Tensor, previous_hidden_states: torch.Tensor, spec_step_idx: int = 0
    ) -> torch.Tensor:
        num_reqs = inputs_embeds.shape[0]
        hidden_states = self.eh_proj(
            torch.cat([self.enorm(inputs_embeds), self.hnorm(previous_hidden_states)], dim=-1)
        )
        # ring row of this draft step (the KDA block's state is advanced at verification)
        self.draft_gate_ring[:num_reqs, :, spec_step_idx] = self.compute_draft_gate(hidden_states)
        return hidden_states


class KimiMTP(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, model_config: Optional[ModelConfig] = None, prefix: str = "") -> None:
        super().__init__()
        model_config = model_config or vllm_config.model_config
        config = model_config.hf_config
        self.config = config
        self.mtp_start_layer_idx = config.num_hidden_layers
        self.num_mtp_layers = config.num_nextn_predict_layers
        self.layers = nn.ModuleDict(
            {
                str(idx): KimiMultiTokenPredictorLayer(vllm_config, model_config, idx, prefix=f"model.layers.{idx}")
                for idx in range(self.mtp_start_layer_idx, self.mtp_start_layer_idx + self.num_mtp_layers)
            }
        )
        # replaced by the target's modules in EagleProposer.load_model
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, previous_hidden_states: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        current_step_idx = spec_step_idx % self.num_mtp_layers
        layer = self.layers[str(self.mtp_start_layer_idx + current_step_idx)]
        return layer(self.embed_tokens(input_ids), previous_hidden_states, spec_step_idx)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params_dict = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, loaded_weight in weights:
            if not name.startswith("model.layers."):
                continue
            idx = int(name.split(".")[2])
            if idx < self.mtp_start_layer_idx:
                continue
            local = name.replace("model.layers.", "layers.", 1)
            if local not in params_dict:
                continue
            param = params_dict[local]
            getattr(param, "weight_loader", default_weight_loader)(param, loaded_weight)
            loaded.add(local)
        return loaded


def build_mtp_draft_model():
    """The MTP head as the drafter loads it: bf16 weights, fp32 A_log/dt_bias and gate rows."""
    from vllm_v1_kda.model_executor.model_loader import get_model

    vllm_config = tiny_vllm_config(speculative=True)
    with set_current_vllm_config(vllm_config):
        model = get_model(vllm_config=vllm_config, model_config=vllm_config.speculative_config.draft_model_config)
    return model
