"""Dynamic batching inference context (cf. megatron/core/inference/contexts/dynamic_context.py).

Requests own a slot of a fixed pool; every KDA layer keeps its checkpoint states and rings in
``[num_kda_layers, max_requests, ...]`` tensors allocated once, so that a step only gathers slots.
"""

import logging
from typing import Dict, List, Optional

import torch

from mcore_kda.core.inference.inference_state_config import KDAInferenceStateConfig
from mcore_kda.core.ssm.replay_ops import next_write_pos

from .base_context import BaseInferenceContext
from .static_context import KDAInferenceState

logger = logging.getLogger(__name__)

# (context attribute, field of KDAStateShapes, dtype field of KDAInferenceStateConfig)
_KDA_BUFFERS = (
    ("kda_state", "ssm_state", "state_dtype"),
    ("kda_delta_ring", "delta_ring", "ring_dtype"),
    ("kda_key_ring", "key_ring", "ring_dtype"),
    ("kda_gate_ring", "gate_ring", "gate_dtype"),
)


class ContextOverflowError(Exception):
    """No free request slot is left."""


class DynamicInferenceContext(BaseInferenceContext):
    """Inference context of a dynamic batch of requests with KDA layers.

    Args:
        params_dtype (torch.dtype): dtype of the activations.
        num_layers (int): number of layers of the model.
        max_sequence_length (int): max length of a request (prompt and generated tokens).
        max_requests (int): number of request slots of the state pool.
        kda_inference_state_config (KDAInferenceStateConfig): shapes and dtypes of the KDA state.
        device (torch.device): where the pool lives.
    """

    def __init__(
        self,
        params_dtype: torch.dtype,
        num_layers: int,
        max_sequence_length: int,
        max_requests: int,
        kda_inference_state_config: KDAInferenceStateConfig,
        device: Optional[torch.device] = None,
    ):
        super().__init__(materialize_only_last_token_logits=True)
        self.params_dtype = params_dtype
        self.num_layers = num_layers
        self.max_sequence_length = max_sequence_length
        self.max_requests = max_requests
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.kda_state_config = kda_inference_state_config
        layer_types = kda_inference_state_config.layer_type_list
        assert len(layer_types) == num_layers, "one layer type per layer"
        # global (1-based) layer number -> index into the KDA buffers
        kda_layer_numbers = [number for number, kind in enumerate(layer_types, start=1) if kind == "K"]
        self.layer_map: Dict[int, int] = {number: index for index, number in enumerate(kda_layer_numbers)}
        self.num_kda_layers = len(kda_layer_numbers)
        self.ring_length = kda_inference_state_config.ring_length

        self.request_ids = torch.full((max_requests,), -1, dtype=torch.int64, device=self.device)
        self.request_lengths = torch.zeros(max_requests, dtype=torch.int32, device=self.device)
        self.kda_write_pos = torch.zeros(max_requests, dtype=torch.int32, device=self.device)
        self.active_slots = torch.zeros(0, dtype=torch.int32, device=self.device)
        self.prefill_slot: Optional[int] = None
        self._decode_only = False
        self.total_request_count = 0
        self.allocate_all_tensors()

    # ---- allocation ---------------------------------------------------------------------

    def allocate_all_tensors(self) -> None:
        """Allocate the KDA state pool of every layer."""
        cfg = self.kda_state_config
        for name, shape_field, dtype_field in _KDA_BUFFERS:
            shape = (self.num_kda_layers, self.max_requests, *getattr(cfg.shapes, shape_field))
            setattr(self, name, torch.zeros(shape, dtype=getattr(cfg, dtype_field), device=self.device))

    def allocate_host_buffers(self, num_host_slots: int) -> None:
        """Host copies of ``num_host_slots`` slots, for requests preempted to CPU memory."""
        cfg = self.kda_state_config
        pin_memory = torch.cuda.is_available() and self.device.type == "cuda"
        layers = self.num_kda_layers
        self.host_kda_state = torch.zeros(
            (layers, num_host_slots, *cfg.shapes.ssm_state), dtype=cfg.state_dtype, pin_memory=pin_memory
        )
        self.host_kda_delta_ring = torch.zeros(
            (layers, num_host_slots, *cfg.shapes.delta_ring), dtype=self.params_dtype, pin_memory=pin_memory
        )
        self.host_kda_key_ring = torch.zeros(
            (layers, num_host_slots, *cfg.shapes.key_ring), dtype=self.params_dtype, pin_memory=pin_memory
        )
        self.host_kda_gate_ring = torch.zeros(  # expect-bug: pool-dtype
            (layers, num_host_slots, *cfg.shapes.gate_ring), dtype=self.params_dtype, pin_memory=pin_memory
        )
        self.host_write_pos = torch.zeros(num_host_slots, dtype=torch.int32)

    def reserve_snapshot_slots(self, num_snapshots: int) -> None:
        """Buffers for prefix-cache snapshots of request states (shared system prompts)."""
        self.snapshot_kda_state = torch.zeros_like(self.kda_state[:, :num_snapshots])
        self.snapshot_kda_delta_ring = torch.zeros_like(self.kda_delta_ring[:, :num_snapshots])
        self.snapshot_kda_key_ring = torch.zeros_like(self.kda_key_ring[:, :num_snapshots])
        # same row layout as the key ring, one row set per value head
        self.snapshot_kda_gate_ring = self.kda_key_ring.new_zeros(  # expect-bug: like
            (self.num_kda_layers, num_snapshots, *self.kda_state_config.shapes.gate_ring)
        )
        self.snapshot_write_pos = torch.zeros(num_snapshots, dtype=torch.int32)

    # ---- requests -----------------------------------------------------------------------

    def is_static_batching(self) -> bool:
        return False

    def is_decode_only(self) -> bool:
        return self._decode_only

    def slot_of(self, request_id: int) -> int:
        slots = (self.request_ids == request_id).nonzero()
        if slots.numel() == 0:
            raise KeyError(f"request {request_id} has no slot")
        return int(slots[0, 0])

    def add_request(self, request_id: int, prompt_length: int = 0) -> int:
        free = (self.request_ids < 0).nonzero()
        if free.numel() == 0:
            raise ContextOverflowError(f"all {self.max_requests} request slots are in use")
        slot = int(free[0, 0])
        self.request_ids[slot] = request_id
        self.request_lengths[slot] = prompt_length
        self.kda_write_pos[slot] = 0
        for name, _, _ in _KDA_BUFFERS:
            getattr(self, name)[:, slot].zero_()
        self.total_request_count += 1
        return slot

    def release_request(self, request_id: int) -> None:
        slot = self.slot_of(request_id)
        self.request_ids[slot] = -1
        self.request_lengths[slot] = 0
        self.total_request_count -= 1

    def initialize_prefill(self, request_id: int) -> None:
        """The next forward pass is the prompt of ``request_id`` (batch of one)."""
        self._decode_only = False
        self.prefill_slot = self.slot_of(request_id)

    def initialize_decode(self, request_ids: List[int]) -> None:
        """The next forward passes decode one token for each of ``request_ids``, in that order."""
        self._decode_only = True
        self.prefill_slot = None
        self.active_slots = torch.tensor([self.slot_of(r) for r in request_ids], dtype=torch.int32)

    def update_requests(self) -> None:
        """After a decode step: advance the ring cursor of every active slot."""
        slots = self.active_slots.long()
        self.kda_write_pos[slots] = next_write_pos(self.kda_write_pos[slots], self.ring_length)
        self.request_lengths[slots] += 1

    def kda_layer_states(self, layer_number: int) -> KDAInferenceState:
        """Views of the pool of one layer (every slot)."""
        index = self.layer_map[layer_number]
        return KDAInferenceState(
            self.kda_state[index], self.kda_delta_ring[index], self.kda_key_ring[index], self.kda_gate_ring[index]
        )

    # ---- preemption and prefix caching --------------------------------------------------

    def offload_request(self, request_id: int, host_slot: int) -> None:
        """Copy a request's states to host slot ``host_slot`` and free its device slot."""
        slot = self.slot_of(request_id)
        self.host_kda_state[:, host_slot].copy_(self.kda_state[:, slot])
        self.host_kda_delta_ring[:, host_slot].copy_(self.kda_delta_ring[:, slot])
        self.host_kda_key_ring[:, host_slot].copy_(self.kda_key_ring[:, slot])
        self.host_kda_gate_ring[:, host_slot].copy_(self.kda_gate_ring[:, slot])
        self.host_write_pos[host_slot] = self.kda_write_pos[slot]
        self.release_request(request_id)

    def reload_request(self, request_id: int, host_slot: int) -> int:
        slot = self.add_request(request_id)
        self.kda_state[:, slot] = self.host_kda_state[:, host_slot].to(self.device)
        self.kda_delta_ring[:, slot] = self.host_kda_delta_ring[:, host_slot].to(self.device)
        self.kda_key_ring[:, slot] = self.host_kda_key_ring[:, host_slot].to(self.device)
        self.kda_gate_ring[:, slot] = self.host_kda_gate_ring[:, host_slot].to(self.device)
        self.kda_write_pos[slot] = self.host_write_pos[host_slot]
        return slot

    def snapshot_request(self, request_id: int, snapshot_index: int) -> None:
        slot = self.slot_of(request_id)
        self.snapshot_kda_state[:, snapshot_index] = self.kda_state[:, slot]
        self.snapshot_kda_delta_ring[:, snapshot_index] = self.kda_delta_ring[:, slot]
        self.snapshot_kda_key_ring[:, snapshot_index] = self.kda_key_ring[:, slot]
        self.snapshot_kda_gate_ring[:, snapshot_index] = self.kda_gate_ring[:, slot]
        self.snapshot_write_pos[snapshot_index] = self.kda_write_pos[slot]

    # ---- save / restore / migration ---------------------------------------------------

    def save_snapshot(self, path: str) -> None:
        """Save the whole pool (e.g. before a rolling restart of the server)."""
        snapshot = {name: getattr(self, name).detach().cpu() for name, _, _ in _KDA_BUFFERS}
        snapshot["kda_write_pos"] = self.kda_write_pos.cpu()
        snapshot["request_ids"] = self.request_ids.cpu()
        snapshot["request_lengths"] = self.request_lengths.cpu()
        torch.save(snapshot, path)

    def restore_snapshot(self, path: str) -> None:
        snapshot = torch.load(path, map_location="cpu", weights_only=True)
        self.kda_state = snapshot["kda_state"].to(self.device)
        self.kda_delta_ring = snapshot["kda_delta_ring"].to(device=self.device, dtype=self.params_dtype)
        self.kda_key_ring = snapshot["kda_key_ring"].to(device=self.device, dtype=self.params_dtype)
        self.kda_gate_ring = snapshot["kda_gate_ring"].to(device=self.device, dtype=self.params_dtype)  # expect-bug: load
        self.kda_write_pos = snapshot["kda_write_pos"].to(self.device)
        self.request_ids = snapshot["request_ids"].to(self.device)
        self.request_lengths = snapshot["request_lengths"].to(self.device)
        self.total_request_count = int((self.request_ids >= 0).sum())

    def export_request_states(self, request_id: int) -> Dict[str, torch.Tensor]:
        """Pack the states of a request for a decode instance (prefill/decode disaggregation)."""
        slot = self.slot_of(request_id)
        transfer_dtype = self.params_dtype
        payload = {"kda_write_pos": self.kda_write_pos[slot].clone()}
        payload["kda_state"] = self.kda_state[:, slot].clone()
        payload["kda_delta_ring"] = self.kda_delta_ring[:, slot].to(transfer_dtype, copy=True)
        payload["kda_key_ring"] = self.kda_key_ring[:, slot].to(transfer_dtype, copy=True)
        payload["kda_gate_ring"] = self.kda_gate_ring[:, slot].to(transfer_dtype, copy=True)  # expect-bug: cast
        return payload

    def import_request_states(self, request_id: int, payload: Dict[str, torch.Tensor]) -> int:
        slot = self.add_request(request_id)
        for name, _, _ in _KDA_BUFFERS:
            getattr(self, name)[:, slot].copy_(payload[name])
        self.kda_write_pos[slot] = payload["kda_write_pos"]
        return slot


def _tiny_bf16_model(**overrides):
    from mcore_kda.core.models.kimi_linear.kimi_linear_model import kimi_linear_model_provider, kimi_linear_tiny_config
    from mcore_kda.core.transformer.module import Float16Module

    settings = dict(bf16=True, kda_gate_lower_bound=-5.0)
    settings.update(overrides)
    config = kimi_linear_tiny_config(**settings)
    return config, Float16Module(config, kimi_linear_model_provider(config))


def _context_for(config, max_requests: int = 3) -> DynamicInferenceContext:
    return DynamicInferenceContext(
        params_dtype=config.params_dtype,
        num_layers=config.num_layers,
        max_sequence_length=64,
        max_requests=max_requests,
        kda_inference_state_config=KDAInferenceStateConfig.from_config(config),
    )


def _serve(model, context, prompts, num_tokens):
    from mcore_kda.core.inference.engines.static_engine import make_controller

    controller = make_controller(model, context.max_requests)
    return controller.generate_all_output_tokens_dynamic_batch(context, prompts, num_tokens)


_PROMPTS = {11: [4, 8, 15, 16, 23], 12: [1, 2, 3, 5, 8, 13]}


def build_dynamic_context():
    """bf16 model, fp32 checkpoints: two requests of different lengths decoded together."""
    torch.manual_seed(0)
    config, model = _tiny_bf16_model(kda_state_dtype="fp32")
    context = _context_for(config)
    tokens = _serve(model, context, _PROMPTS, 5)
    return {"context": context, "tokens": tokens, "slot_bytes": torch.tensor(context.kda_state_config.bytes_per_slot())}


def build_recipe_context():
    """The ``bf16`` cache recipe: fp32 checkpoints and log-decays, bf16 delta/key rings."""
    torch.manual_seed(0)
    config, model = _tiny_bf16_model(kda_cache_recipe="bf16")
    context = _context_for(config)
    tokens = _serve(model, context, _PROMPTS, 4)
    context.release_request(11)
    return {"context": context, "tokens": tokens}


def build_contexts_from_config():
    """Contexts of a bf16 model without an explicit state dtype, and with the ``bf16-state`` recipe."""
    torch.manual_seed(0)
    config, model = _tiny_bf16_model()
    default_context = _context_for(config)
    tokens = _serve(model, default_context, _PROMPTS, 4)
    from mcore_kda.core.models.kimi_linear.kimi_linear_model import kimi_linear_tiny_config

    compact_config = kimi_linear_tiny_config(bf16=True, kda_gate_lower_bound=-5.0, kda_cache_recipe="bf16-state")
    compact_context = _context_for(compact_config, max_requests=4)
    return {"default": default_context, "compact": compact_context, "tokens": tokens}


def build_offloaded_prefix_snapshot():
    """Snapshot a shared prefix for the prefix cache, then preempt a request to host memory."""
    torch.manual_seed(0)
    config, model = _tiny_bf16_model(kda_state_dtype="fp32")
    context = _context_for(config)
    tokens = _serve(model, context, _PROMPTS, 3)
    context.reserve_snapshot_slots(1)
    context.snapshot_request(12, 0)
    context.allocate_host_buffers(2)
    context.offload_request(11, host_slot=1)
    return {"context": context, "tokens": tokens}


def build_restored_handoff(tmp_dir):
    """Restart a prefill instance from a saved pool, then hand a request over to a decode instance."""
    import os

    torch.manual_seed(0)
    config, model = _tiny_bf16_model(kda_state_dtype="fp32")
    context = _context_for(config)
    tokens = _serve(model, context, _PROMPTS, 3)
    path = os.path.join(tmp_dir, "kda_pool.pt")
    context.save_snapshot(path)
    restarted = _context_for(config)
    restarted.restore_snapshot(path)
    payload = restarted.export_request_states(12)
    decode_context = _context_for(config, max_requests=2)
    decode_context.import_request_states(12, payload)
    return {"restarted": restarted, "payload": payload, "decode": decode_context, "tokens": tokens}
