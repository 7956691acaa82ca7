"""CUDA graph capture of the ReplaySSM decode step (cf. megatron/core/transformer/cuda_graphs.py).

A captured graph replays fixed kernel launches on fixed addresses: the decode step of a KDA layer
reads its activations from static buffers (filled before each replay) and its states from the
buffers of the static context, which therefore must be allocated before capture. Without a GPU
(``torch.cuda.is_available()`` is False) the runner records the same arguments and runs eagerly.
"""

import logging
from typing import Dict, Optional

import torch

from mcore_kda.core.inference.contexts.static_context import KDAInferenceState
from mcore_kda.core.ssm.replay_ops import kda_replay_decode
from mcore_kda.core.transformer.transformer_config import TransformerConfig
from mcore_kda.core.utils import torch_dtype_context

logger = logging.getLogger(__name__)


def is_graph_capturing() -> bool:
    """Query if currently capturing."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class ReplayDecodeGraphRunner:
    """Owns the static inputs and the captured graph of one KDA layer's decode step.

    Args:
        config: model config.
        layer_number: layer whose decode step is captured.
        batch_size: batch size of the graph (one graph per batch size).
    """

    def __init__(self, config: TransformerConfig, layer_number: int, batch_size: int):
        self.config = config
        self.layer_number = layer_number
        self.batch_size = batch_size
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.k_head_dim = config.linear_key_head_dim
        self.v_head_dim = config.linear_value_head_dim
        self.captured_kwargs: Dict[str, object] = {}
        self.graph: Optional[object] = None
        self.replay_count = 0

    def create_static_buffers(self) -> None:
        """Static activations of the graph, and scratch states for the warmup launches."""
        B, H, HV, K, V = self.batch_size, self.num_k_heads, self.num_v_heads, self.k_head_dim, self.v_head_dim
        L = self.config.kda_ring_length
        with torch_dtype_context(self.config.params_dtype):  # expect-bug: default-dtype id=graph-warmup
            self.static_mixed_qkv = torch.zeros(B, 2 * H * K + HV * V)
            self.static_a = torch.zeros(B, HV * K)
            self.static_b = torch.zeros(B, HV)
            self.static_out = torch.zeros(B, 1, HV, V)
            warmup_ssm_state = torch.zeros(B, HV, V, K, dtype=self.config.kda_checkpoint_dtype)
            warmup_delta_ring = torch.zeros(B, HV, L, V)
            warmup_key_ring = torch.zeros(B, H, L, K)
            warmup_gate_ring = torch.zeros(B, HV, L, K)  # expect-bug: default-dtype id=graph-warmup
        self.warmup_state = KDAInferenceState(warmup_ssm_state, warmup_delta_ring, warmup_key_ring, warmup_gate_ring)
        self.static_slots = torch.arange(B, dtype=torch.int32)
        self.static_write_pos = torch.zeros(B, dtype=torch.int32)

    def _kernel_kwargs(self, states: KDAInferenceState, mixer) -> Dict[str, object]:
        kwargs: Dict[str, object] = dict(
            mixed_qkv=self.static_mixed_qkv,
            a=self.static_a,
            b=self.static_b,
            A_log=mixer.A_log,
            dt_bias=mixer.dt_bias,
            scale=mixer.scale,
            out=self.static_out,
            ssm_state_indices=self.static_slots,
            write_pos=self.static_write_pos,
            force_flush=None,
            use_qk_l2norm_in_kernel=mixer.use_qk_l2norm,
            lower_bound=mixer.lower_bound,
        )
        kwargs["initial_state"] = states.ssm_state
        kwargs["d_cache"] = states.delta_ring
        kwargs["k_cache"] = states.key_ring
        kwargs["g_cache"] = states.gate_ring
        return kwargs

    def warmup(self, mixer) -> None:
        """Run the kernel on the scratch states (lazy init and autotuning happen outside capture)."""
        kwargs = self._kernel_kwargs(self.warmup_state, mixer)
        for _ in range(self.config.cuda_graph_warmup_steps):
            kda_replay_decode(**kwargs)
        self.static_out.zero_()

    def capture(self, states: KDAInferenceState, mixer) -> None:
        """Capture the decode step on ``states`` (the context's buffers of this layer)."""
        self.warmup(mixer)
        kwargs = self._kernel_kwargs(states, mixer)
        # the kernel reads the rows of every ring in the activation dtype
        kwargs["g_cache"] = states.gate_ring.to(self.static_a.dtype)  # expect-bug: decode-arg
        self.captured_kwargs = kwargs
        if torch.cuda.is_available() and self.static_a.is_cuda:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                kda_replay_decode(**self.captured_kwargs)

    def replay(self, mixed_qkv, a, b, slots, write_pos) -> torch.Tensor:
        """Copy the step's inputs into the static buffers and replay the captured step."""
        self.static_mixed_qkv.copy_(mixed_qkv)
        self.static_a.copy_(a)
        self.static_b.copy_(b)
        self.static_slots.copy_(slots)
        self.static_write_pos.copy_(write_pos)
        if self.graph is not None:
            self.graph.replay()
        else:
            kda_replay_decode(**self.captured_kwargs)
        self.replay_count += 1
        return self.static_out.clone()
