"""The model runner (vllm/v1/worker/gpu_model_runner.py), reduced to decode of Kimi Linear."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from vllm_v1_kda.attention.layer import Attention
from vllm_v1_kda.config import VllmConfig, get_layers_from_vllm_config, tiny_vllm_config
from vllm_v1_kda.forward_context import set_forward_context
from vllm_v1_kda.model_executor.layers.fla.ops.kda_replay import advance_write_pos
from vllm_v1_kda.model_executor.layers.mamba.mamba_utils import MambaBase
from vllm_v1_kda.model_executor.model_loader import get_model
from vllm_v1_kda.model_executor.model_loader.utils import set_default_torch_dtype
from vllm_v1_kda.utils import STR_DTYPE_TO_TORCH_DTYPE, cdiv, get_dtype_size, is_pin_memory_available
from vllm_v1_kda.v1.attention.backends.kda_replay import KDAReplayMetadata, KDAReplayState
from vllm_v1_kda.v1.attention.backends.torch_sdpa import TorchSDPAMetadata
from vllm_v1_kda.v1.attention.backends.utils import PAD_SLOT_ID, CommonAttentionMetadata
from vllm_v1_kda.v1.core.kv_cache_utils import get_kv_cache_config
from vllm_v1_kda.v1.kv_cache_interface import (
    AttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
)
from vllm_v1_kda.v1.spec_decode.eagle import EagleProposer

from .utils import bind_kv_cache, initialize_kv_cache_for_kv_sharing

logger = logging.getLogger(__name__)


@dataclass
class CachedRequestState:
    req_id: str
    block_ids: list[int]
    num_computed_tokens: int = 0
    replay_write_pos: int = 0


@dataclass
class SchedulerOutput:
    req_ids: list[str]
    token_ids: list[int]
    force_flush_req_ids: set[str] = field(default_factory=set)


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    sampled_token_ids: list[int]
    logits: torch.Tensor
    hidden_states: torch.Tensor


@dataclass
class AttentionGroup:
    backend: type
    metadata_builder: Any
    layer_names: list[str]
    kv_cache_spec: KVCacheSpec


class GPUModelRunner:
    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        self.compilation_config = vllm_config.compilation_config
        self.scheduler_config = vllm_config.scheduler_config
        self.speculative_config = vllm_config.speculative_config
        self.device = torch.device(device)
        self.pin_memory = is_pin_memory_available()
        self.dtype = self.model_config.dtype
        if self.cache_config.cache_dtype == "auto":
            self.kv_cache_dtype = self.dtype
        else:
            self.kv_cache_dtype = STR_DTYPE_TO_TORCH_DTYPE[self.cache_config.cache_dtype]

        self.max_model_len = self.model_config.max_model_len
        self.max_num_tokens = self.scheduler_config.max_num_batched_tokens
        self.max_num_reqs = self.scheduler_config.max_num_seqs
        self.block_size = self.cache_config.block_size
        self.max_num_blocks_per_req = cdiv(self.max_model_len, self.block_size)

        # Lazy initializations
        # self.model: nn.Module  # Set after load_model
        self.kv_caches: list[Any] = []
        self.layer_kv_caches: dict[str, Any] = {}
        self.attn_groups: list[AttentionGroup] = []
        self.kv_cache_config: Optional[KVCacheConfig] = None
        # layer name -> name of the layer whose cache it reuses
        self.shared_kv_cache_layers: dict[str, str] = {}
        self.requests: dict[str, CachedRequestState] = {}
        self.replay_rollback: Optional[dict[str, KDAReplayState]] = None
        self.cudagraphs: dict[int, Any] = {}

        self.drafter: Optional[EagleProposer] = None
        if self.speculative_config is not None:
            self.drafter = EagleProposer(self.vllm_config, self.device, self)

        # Persistent buffers for CUDA graphs.
        self.input_ids = torch.zeros(self.max_num_tokens, dtype=torch.int32, device=self.device)
        self.positions = torch.zeros(self.max_num_tokens, dtype=torch.int64, device=self.device)
        self.seq_lens = torch.zeros(self.max_num_reqs, dtype=torch.int32, device=self.device)
        self.slot_mapping = torch.zeros(self.max_num_tokens, dtype=torch.int64, device=self.device)
        self.block_table = torch.zeros(
            (self.max_num_reqs, self.max_num_blocks_per_req), dtype=torch.int32, device=self.device
        )
        self.replay_write_pos = torch.zeros(self.max_num_reqs, dtype=torch.int32, device=self.device)
        self.replay_force_flush = torch.zeros(self.max_num_reqs, dtype=torch.int32, device=self.device)
        self.cudagraph_batch_sizes = sorted(self.compilation_config.cudagraph_capture_sizes, reverse=True)

    # --- model ---------------------------------------------------------------------------

    def load_model(self) -> None:
        logger.info("Starting to load model %s...", self.model_config.model)
        self.model = get_model(vllm_config=self.vllm_config)
        if self.drafter is not None:
            self.drafter.load_model(self.model)

    def get_model(self) -> nn.Module:
        return self.model

    # --- KV cache ------------------------------------------------------------------------

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        """
        Generates the KVCacheSpec by parsing the kv cache format from each
        Attention module in the static forward context.
        Returns:
            KVCacheSpec: A dictionary mapping layer names to their KV cache
            format. Layers that do not need KV cache are not included.
        """
        block_size = self.cache_config.block_size
        kv_cache_spec: dict[str, KVCacheSpec] = {}
        skipped = self.drafter.separate_cache_layer_names if self.drafter is not None else set()
        layers = self.compilation_config.static_forward_context
        for layer_name, attn_module in layers.items():
            if (kv_tgt_layer := getattr(attn_module, "kv_sharing_target_layer_name", None)) is not None:
                # The layer doesn't need its own KV cache and will use that of the target layer.
                self.shared_kv_cache_layers[layer_name] = kv_tgt_layer
                continue
            if layer_name in skipped:
                continue
            if isinstance(attn_module, Attention):
                kv_cache_spec[layer_name] = FullAttentionSpec(
                    block_size=block_size,
                    num_kv_heads=attn_module.num_kv_heads,
                    head_size=attn_module.head_size,
                    dtype=self.kv_cache_dtype,
                )
            elif isinstance(attn_module, MambaBase):
                mamba_spec = attn_module.get_kv_cache_spec()
                if self.cache_config.cache_dtype != "auto":
                    # --kv-cache-dtype is the cache dtype of the whole model
                    mamba_spec = dataclasses.replace(mamba_spec, dtypes=tuple(self.kv_cache_dtype for _ in mamba_spec.dtypes))  # expect-bug: imported-policy
                kv_cache_spec[layer_name] = dataclasses.replace(mamba_spec, block_size=block_size)
        return kv_cache_spec

    def initialize_attn_backend(self, kv_cache_config: KVCacheConfig) -> None:
        forward_context = self.compilation_config.static_forward_context
        self.attn_groups = []
        for group in kv_cache_config.kv_cache_groups:
            backend = forward_context[group.layer_names[0]].get_attn_backend()
            builder = backend.get_builder_cls()(group.kv_cache_spec, group.layer_names, self.vllm_config, self.device)
            self.attn_groups.append(AttentionGroup(backend, builder, group.layer_names, group.kv_cache_spec))

    def _allocate_kv_cache_tensors(self, kv_cache_config: KVCacheConfig) -> dict[str, torch.Tensor]:
        """
        Initializes the KV cache buffer with the correct size. The buffer needs
        to be reshaped to the desired shape before being used by the models.
        Returns:
            dict[str, torch.Tensor]: A map between layer names to their
            corresponding memory buffer for KV cache.
        """
        kv_cache_raw_tensors: dict[str, torch.Tensor] = {}
        for kv_cache_tensor in kv_cache_config.kv_cache_tensors:
            tensor = torch.zeros(kv_cache_tensor.size, dtype=torch.int8, device=self.device)
            for layer_name in kv_cache_tensor.shared_by:
                kv_cache_raw_tensors[layer_name] = tensor
        layer_names = {name for group in kv_cache_config.kv_cache_groups for name in group.layer_names}
        assert layer_names == set(kv_cache_raw_tensors.keys()), "Some layers are not correctly initialized"
        return kv_cache_raw_tensors

    def _reshape_kv_cache_tensors(
        self, kv_cache_config: KVCacheConfig, kv_cache_raw_tensors: dict[str, torch.Tensor]
    ) -> dict[str, Any]:
        """
        Reshape the KV cache tensors to the desired shape and dtype.
        Returns:
            Dict[str, Any]: A map between layer names to their corresponding
            memory buffer for KV cache (a tensor for attention, a KDAReplayState for KDA).
        """
        kv_caches: dict[str, Any] = {}
        for group in self.attn_groups:
            kv_cache_spec = group.kv_cache_spec
            for layer_name in group.layer_names:
                raw_tensor = kv_cache_raw_tensors[layer_name]
                assert raw_tensor.numel() % kv_cache_spec.page_size_bytes == 0
                num_blocks = raw_tensor.numel() // kv_cache_spec.page_size_bytes
                if isinstance(kv_cache_spec, AttentionSpec):
                    kv_cache_shape = group.backend.get_kv_cache_shape(
                        num_blocks, kv_cache_spec.block_size, kv_cache_spec.num_kv_heads, kv_cache_spec.head_size
                    )
                    kv_caches[layer_name] = raw_tensor.view(kv_cache_spec.dtype).view(kv_cache_shape)
                elif isinstance(kv_cache_spec, MambaSpec):
                    state_tensors = []
                    storage_offset_bytes = 0
                    for shape, dtype in zip(kv_cache_spec.shapes, kv_cache_spec.dtypes):
                        dtype_size = get_dtype_size(dtype)
                        num_element_per_page = kv_cache_spec.page_size_bytes // dtype_size
                        target_shape = (num_blocks, *shape)
                        stride = torch.empty(target_shape).stride()
                        target_stride = (num_element_per_page, *stride[1:])
                        assert storage_offset_bytes % dtype_size == 0
                        tensor = torch.as_strided(
                            raw_tensor.view(dtype),
                            size=target_shape,
                            stride=target_stride,
                            storage_offset=storage_offset_bytes // dtype_size,
                        )
                        state_tensors.append(tensor)
                        storage_offset_bytes += stride[0] * dtype_size
                    kv_caches[layer_name] = KDAReplayState(*state_tensors)
                else:
                    raise NotImplementedError(type(kv_cache_spec))
        return kv_caches

    def initialize_kv_cache_tensors(self, kv_cache_config: KVCacheConfig) -> dict[str, Any]:
        # Initialize the memory buffer for KV cache
        kv_cache_raw_tensors = self._allocate_kv_cache_tensors(kv_cache_config)
        # Change the memory buffer to the desired shape
        kv_caches = self._reshape_kv_cache_tensors(kv_cache_config, kv_cache_raw_tensors)
        # Set up cross-layer KV cache sharing
        if self.shared_kv_cache_layers:
            initialize_kv_cache_for_kv_sharing(self.shared_kv_cache_layers, kv_caches)
        bind_kv_cache(kv_caches, self.compilation_config.static_forward_context, self.kv_caches)
        return kv_caches

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        """
        Initialize KV cache based on `kv_cache_config`.
        Args:
            kv_cache_config: Configuration for the KV cache, including the KV
            cache size of each layer
        """
        self.kv_cache_config = kv_cache_config
        self.initialize_attn_backend(kv_cache_config)
        self.layer_kv_caches = self.initialize_kv_cache_tensors(kv_cache_config)
        if self.drafter is not None and self.drafter.separate_cache_layer_names:
            self.drafter.initialize_kv_cache(kv_cache_config.num_blocks)

    def _replay_caches(self) -> dict[str, KDAReplayState]:
        return {
            name: cache
            for name, cache in self.layer_kv_caches.items()
            if isinstance(cache, KDAReplayState) and name not in self.shared_kv_cache_layers
        }

    # --- batches -------------------------------------------------------------------------

    def add_request(self, req_id: str, block_ids: list[int]) -> None:
        self.requests[req_id] = CachedRequestState(req_id, list(block_ids))

    def _build_attention_metadata(
        self, common_attn_metadata: CommonAttentionMetadata, for_cudagraph_capture: bool = False
    ) -> dict[str, Any]:
        attn_metadata: dict[str, Any] = {}
        for group in self.attn_groups:
            builder = group.metadata_builder
            if for_cudagraph_capture:
                metadata = builder.build_for_cudagraph_capture(common_attn_metadata)
            else:
                metadata = builder.build(common_prefix_len=0, common_attn_metadata=common_attn_metadata)
            for layer_name in group.layer_names:
                attn_metadata[layer_name] = metadata
        for layer_name, target_layer_name in self.shared_kv_cache_layers.items():
            attn_metadata[layer_name] = attn_metadata[target_layer_name]
        return attn_metadata

    def _prepare_inputs(self, scheduler_output: SchedulerOutput) -> CommonAttentionMetadata:
        num_reqs = len(scheduler_output.req_ids)
        for i, req_id in enumerate(scheduler_output.req_ids):
            req = self.requests[req_id]
            pos = req.num_computed_tokens
            self.input_ids[i] = scheduler_output.token_ids[i]
            self.positions[i] = pos
            self.seq_lens[i] = pos + 1
            self.slot_mapping[i] = req.block_ids[pos // self.block_size] * self.block_size + pos % self.block_size
            self.block_table[i].zero_()
            self.block_table[i, : len(req.block_ids)] = torch.tensor(req.block_ids, dtype=torch.int32)
            self.replay_write_pos[i] = req.replay_write_pos
            self.replay_force_flush[i] = int(req_id in scheduler_output.force_flush_req_ids)
        return CommonAttentionMetadata(
            num_reqs=num_reqs,
            num_actual_tokens=num_reqs,
            seq_lens=self.seq_lens[:num_reqs],
            block_table_tensor=self.block_table[:num_reqs],
            slot_mapping=self.slot_mapping[:num_reqs],
            replay_write_pos=self.replay_write_pos[:num_reqs],
            replay_force_flush=self.replay_force_flush[:num_reqs],
        )

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        common_attn_metadata = self._prepare_inputs(scheduler_output)
        num_reqs = common_attn_metadata.num_reqs
        attn_metadata = self._build_attention_metadata(common_attn_metadata)
        with set_forward_context(attn_metadata, self.vllm_config, num_tokens=num_reqs):
            hidden_states = self.model(self.input_ids[:num_reqs], self.positions[:num_reqs])
        logits = self.model.compute_logits(hidden_states)
        # the kernel treats write_pos as read-only: advance the cursors here
        next_write_pos = advance_write_pos(
            self.replay_write_pos[:num_reqs], self.cache_config.kda_ring_len, self.replay_force_flush[:num_reqs]
        )
        for i, req_id in enumerate(scheduler_output.req_ids):
            req = self.requests[req_id]
            req.replay_write_pos = int(next_write_pos[i])
            req.num_computed_tokens += 1
        return ModelRunnerOutput(
            req_ids=list(scheduler_output.req_ids),
            sampled_token_ids=logits.argmax(dim=-1).tolist(),
            logits=logits,
            hidden_states=hidden_states,
        )

    # --- speculative decoding ----------------------------------------------------------------

    def save_replay_rows_for_rollback(self, req_ids: list[str]) -> dict[str, KDAReplayState]:
        """Copies the slots of ``req_ids`` before the target verifies their draft tokens;
        ``rollback_replay_rows`` puts them back for requests whose drafts were rejected."""
        num_reqs = len(req_ids)
        slots = torch.tensor([self.requests[r].block_ids[0] for r in req_ids], dtype=torch.long, device=self.device)
        if self.replay_rollback is None:
            self.replay_rollback = {}
            for layer_name, cache in self._replay_caches().items():
                rows = self.max_num_reqs
                self.replay_rollback[layer_name] = KDAReplayState(  # expect-bug: like
                    state=torch.zeros_like(cache.state[:rows]),
                    d_cache=torch.zeros_like(cache.d_cache[:rows]),
                    k_cache=torch.zeros_like(cache.k_cache[:rows]),
                    g_cache=torch.zeros_like(cache.k_cache[:rows]),
                )
        for layer_name, cache in self._replay_caches().items():
            backup = self.replay_rollback[layer_name]
            for src, dst in zip(cache, backup):
                dst[:num_reqs].copy_(src.index_select(0, slots))
        self._rollback_write_pos = {r: self.requests[r].replay_write_pos for r in req_ids}
        return self.replay_rollback

    def rollback_replay_rows(self, req_ids: list[str], rejected: list[bool]) -> None:
        assert self.replay_rollback is not None
        for i, (req_id, was_rejected) in enumerate(zip(req_ids, rejected)):
            if not was_rejected:
                continue
            slot = self.requests[req_id].block_ids[0]
            for layer_name, cache in self._replay_caches().items():
                for src, dst in zip(self.replay_rollback[layer_name], cache):
                    dst[slot].copy_(src[i])
            self.requests[req_id].replay_write_pos = self._rollback_write_pos[req_id]

    # --- profiling and CUDA graphs -------------------------------------------------------------

    def _dummy_common_metadata(self, num_reqs: int) -> CommonAttentionMetadata:
        return CommonAttentionMetadata(
            num_reqs=num_reqs,
            num_actual_tokens=num_reqs,
            seq_lens=torch.ones(num_reqs, dtype=torch.int32, device=self.device),
            block_table_tensor=torch.zeros(
                (num_reqs, self.max_num_blocks_per_req), dtype=torch.int32, device=self.device
            ),
            slot_mapping=torch.full((num_reqs,), PAD_SLOT_ID, dtype=torch.int64, device=self.device),
            replay_write_pos=torch.zeros(num_reqs, dtype=torch.int32, device=self.device),
        )

    @torch.inference_mode()
    def _dummy_run(self, num_tokens: int, capture_attn_cudagraph: bool = False) -> torch.Tensor:
        """A padded batch: every row has slot PAD_SLOT_ID, so no cache is read or written."""
        num_reqs = min(num_tokens, self.max_num_reqs)
        common_attn_metadata = self._dummy_common_metadata(num_reqs)
        attn_metadata = self._build_attention_metadata(common_attn_metadata, for_cudagraph_capture=True)
        with set_forward_context(
            attn_metadata,
            self.vllm_config,
            num_tokens=num_tokens,
            cudagraph_runtime_mode="FULL" if capture_attn_cudagraph else "NONE",
        ):
            hidden_states = self.model(self.input_ids[:num_reqs], self.positions[:num_reqs])
        return hidden_states

    @torch.inference_mode()
    def profile_run(self) -> dict[str, KDAReplayState]:
        """Dummy forward pass before the KV cache exists, to find the activation peak.

        The KDA decode kernel's temporaries scale with the pool it reads, so the KDA layers get
        a throwaway pool of ``max_num_reqs`` slots for the duration of the run. Returned so
        that the caller can account for its size.
        """
        kda_layers = get_layers_from_vllm_config(self.vllm_config, MambaBase)
        attn_layers = get_layers_from_vllm_config(self.vllm_config, Attention)
        num_reqs = self.max_num_reqs
        with set_default_torch_dtype(self.dtype):  # expect-bug: default-dtype id=profile-default
            dummy_pools = {  # expect-bug: default-dtype id=profile-default
                layer_name: KDAReplayState(
                    *(torch.zeros((num_reqs, *shape), device=self.device) for shape in layer.get_state_shape())
                )
                for layer_name, layer in kda_layers.items()
            }
        placeholders = {layer_name: layer.kv_cache for layer_name, layer in kda_layers.items()}
        common = self._dummy_common_metadata(num_reqs)
        attn_metadata: dict[str, Any] = {}
        for layer_name, layer in kda_layers.items():
            layer.kv_cache = [dummy_pools[layer_name]]
            attn_metadata[layer_name] = KDAReplayMetadata(
                num_reqs=num_reqs,
                state_indices_tensor=torch.arange(num_reqs, dtype=torch.int32, device=self.device),
                write_pos=torch.zeros(num_reqs, dtype=torch.int32, device=self.device),
            )
        for layer_name in attn_layers:
            attn_metadata[layer_name] = TorchSDPAMetadata(
                num_reqs, common.seq_lens, common.block_table_tensor, common.slot_mapping
            )
        try:
            with set_forward_context(attn_metadata, self.vllm_config, num_tokens=num_reqs):
                self.model(self.input_ids[:num_reqs], self.positions[:num_reqs])
        finally:
            for layer_name, layer in kda_layers.items():
                layer.kv_cache = placeholders[layer_name]
        return dummy_pools

    def capture_model(self) -> int:
        if self.model_config.enforce_eager:
            logger.warning("Skipping CUDA graph capture because enforce_eager is set.")
            return 0
        # Capture the large shapes first so that the smaller shapes
        # can reuse the memory pool allocated for the large shapes.
        for num_tokens in self.cudagraph_batch_sizes:
            for _ in range(self.compilation_config.cudagraph_num_of_warmups):
                self._dummy_run(num_tokens, capture_attn_cudagraph=True)
            if self.device.type == "cuda":
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    output = self._dummy_run(num_tokens, capture_attn_cudagraph=True)
                self.cudagraphs[num_tokens] = (graph, output)
            else:
                self.cudagraphs[num_tokens] = None
        logger.info("Graph capturing finished for sizes %s", self.cudagraph_batch_sizes)
        return len(self.cudagraphs)


# --- examples --------------------------------------------------------------------------------


def _new_runner(vllm_config: VllmConfig, initialize_kv_cache: bool = True) -> GPUModelRunner:
    runner = GPUModelRunner(vllm_config, vllm_config.device_config.device)
    runner.load_model()
    if initialize_kv_cache:
        kv_cache_config = get_kv_cache_config(vllm_config, runner.get_kv_cache_spec(), available_memory=1 << 20)
        runner.initialize_kv_cache(kv_cache_config)
    return runner


def _decode(runner: GPUModelRunner, num_steps: int = 5) -> torch.Tensor:
    """Two requests (slots 0 and 2), ``num_steps`` tokens each; req-1 forces a flush at step 1."""
    runner.add_request("req-0", [0])
    runner.add_request("req-1", [2])
    vocab = runner.model_config.hf_config.vocab_size
    logits = []
    for step in range(num_steps):
        output = runner.execute_model(
            SchedulerOutput(
                req_ids=["req-0", "req-1"],
                token_ids=[(7 * step + 3) % vocab, (5 * step + 11) % vocab],
                force_flush_req_ids={"req-1"} if step == 1 else set(),
            )
        )
        logits.append(output.logits)
    return torch.stack(logits)


def build_model_runner():
    """fp32 model with 16-bit delta/key rings (``mamba_cache_dtype``), allocated as one byte
    buffer per layer and viewed per state."""
    runner = _new_runner(tiny_vllm_config(dtype="float32", mamba_cache_dtype="bfloat16"))
    return {"layer_kv_caches": runner.layer_kv_caches, "kv_caches": runner.kv_caches}


def build_decode_steps():
    """bf16 model, five decode steps with a forced flush."""
    runner = _new_runner(tiny_vllm_config())
    logits = _decode(runner)
    return {"kv_caches": runner.layer_kv_caches, "logits": logits}


def build_cuda_graph_capture():
    """Warm-up/capture over padded batches leaves the pools untouched."""
    runner = _new_runner(tiny_vllm_config())
    runner.capture_model()
    hidden = runner._dummy_run(2)
    return {"kv_caches": runner.layer_kv_caches, "warmup_hidden_states": hidden}


def build_profile_run():
    """The profile run's throwaway replay pools."""
    runner = _new_runner(tiny_vllm_config(), initialize_kv_cache=False)
    return {"profile_pools": runner.profile_run()}


def build_spec_rollback_buffers():
    """Rollback copies of the slots taken before verifying draft tokens."""
    runner = _new_runner(tiny_vllm_config(speculative=True))
    _decode(runner, num_steps=3)
    rollback = runner.save_replay_rows_for_rollback(["req-0", "req-1"])
    return {"rollback": rollback, "kv_caches": runner.layer_kv_caches}


def build_fp32_model_bf16_kv_cache():
    """fp32 weights with ``--kv-cache-dtype bfloat16``."""
    runner = _new_runner(tiny_vllm_config(dtype="float32", cache_dtype="bfloat16"))
    logits = _decode(runner, num_steps=2)
    return {"kv_caches": runner.layer_kv_caches, "logits": logits}
