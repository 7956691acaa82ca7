import logging
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from tgi_kda import globals as tgi_globals
from tgi_kda.flash_kimi_modeling import (
    FlashKimiForCausalLM,
    KimiReplayConfig,
    ReplayDraftHead,
    Seqlen,
    random_checkpoint,
)
from tgi_kda.globals import MAX_REPLAY_SLOTS, REPLAY_DTYPES
from tgi_kda.ops import LAST_CALL
from tgi_kda.replay_cache import ReplayCache
from tgi_kda.utils import Weights, default_dtype, log_master

logger = logging.getLogger(__name__)

MODEL_ID = "moonshotai/Kimi-Linear-tiny"


class ReplayGraphInputs(NamedTuple):
    """Static decode inputs of one layer inside a captured CUDA graph."""

    initial_state: torch.Tensor
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor


@dataclass
class FlashCausalLMBatch:
    batch_id: int
    input_ids: torch.Tensor
    slots: torch.Tensor
    seqlen: Seqlen
    prefilling: bool = True

    @classmethod
    def from_tokens(
        cls, batch_id: int, tokens: list[list[int]], slots: list[int]
    ) -> "FlashCausalLMBatch":
        input_ids = torch.tensor([t for request in tokens for t in request], dtype=torch.int64)
        seqlen = Seqlen.from_lengths(torch.tensor([len(r) for r in tokens], dtype=torch.int32))
        return cls(batch_id, input_ids, torch.tensor(slots, dtype=torch.int64), seqlen)

    def next_tokens(self, next_ids: torch.Tensor) -> "FlashCausalLMBatch":
        seqlen = Seqlen.from_lengths(torch.ones_like(self.seqlen.input_lengths))
        return FlashCausalLMBatch(self.batch_id, next_ids, self.slots, seqlen, prefilling=False)


class FlashCausalLM:
    def __init__(
        self,
        model_id: str,
        model_class: type[FlashKimiForCausalLM],
        config: KimiReplayConfig,
        weights: Weights,
        dtype: torch.dtype,
        replay_dtypes: tuple[torch.dtype, torch.dtype, torch.dtype],
        speculate: int = 0,
    ):
        self.model_id = model_id
        self.config = config
        self.dtype = dtype
        self.device = weights.device
        self.replay_dtypes = replay_dtypes
        self.num_slots = MAX_REPLAY_SLOTS
        with default_dtype(dtype):
            self.model = model_class(None, config, weights)
        self.speculator: ReplayDraftHead | None = None
        if speculate > 0:
            speculator = ReplayDraftHead("mtp", config, weights)
            self.speculator = speculator.to(self.device, dtype)  # expect-bug: module-cast
        self.replay_cache: list[ReplayCache] = []
        self.cuda_graphs: dict[int, dict[str, Any]] = {}
        self.draft_rings: dict[str, torch.Tensor] = {}

    def init_replay_cache(self, num_slots: int) -> None:
        state_dtype, ring_dtype, gate_dtype = self.replay_dtypes
        cfg = self.config
        dims = (num_slots, cfg.num_heads, cfg.num_k_heads, cfg.head_dim)
        kwargs = dict(ring_len=cfg.replay_ring_len, state_dtype=state_dtype, gate_dtype=gate_dtype)
        self.replay_cache = [
            ReplayCache(*dims, ring_dtype, self.device, **kwargs)
            for _ in range(cfg.num_hidden_layers)
        ]

    def init_draft_rings(self, num_slots: int) -> None:
        """Per-request rings of the MTP draft step, allocated once speculation is on."""
        heads, k_heads = self.config.num_heads, self.config.num_k_heads
        ring, dim = self.config.replay_ring_len, self.config.head_dim
        with default_dtype(self.dtype):
            d_ring = torch.zeros(num_slots, heads, ring, dim)
            k_ring = torch.zeros(num_slots, k_heads, ring, dim)
            log_alpha = torch.zeros(num_slots, heads, ring, dim)  # expect-bug: default-dtype
            cursor = torch.zeros(num_slots, dtype=torch.int32)
        self.draft_rings = dict(d_ring=d_ring, k_ring=k_ring, log_alpha=log_alpha, cursor=cursor)

    def prefill(self, batch: FlashCausalLMBatch) -> torch.Tensor:
        hidden_states = self.model.embed_tokens(batch.input_ids)
        for layer, cache in zip(self.model.layers, self.replay_cache, strict=True):
            attn_output, seed = layer.prefill(hidden_states, batch.seqlen)
            cache.write_seed(batch.slots, seed)
            hidden_states = hidden_states + attn_output
        last = batch.seqlen.cu_seqlen_q[1:] - 1
        return self.model.lm_head(self.model.norm(hidden_states[last]))

    def _decode(
        self, input_ids: torch.Tensor, slots: torch.Tensor, replay: list[dict]
    ) -> torch.Tensor:
        hidden_states = self.model.embed_tokens(input_ids)
        for layer, inputs in zip(self.model.layers, replay, strict=True):
            hidden_states = hidden_states + layer(hidden_states, slots=slots, **inputs)
        return self.model.lm_head(self.model.norm(hidden_states))

    def forward(self, batch: FlashCausalLMBatch) -> torch.Tensor:
        if batch.prefilling:
            return self.prefill(batch)
        replay = [
            {
                "initial_state": cache.state,
                "d_cache": cache.d_ring,
                "k_cache": cache.k_ring,
                "g_cache": cache.log_alpha,
                "write_pos": cache.cursor[batch.slots],
            }
            for cache in self.replay_cache
        ]
        return self._decode(batch.input_ids, batch.slots, replay)

    def cuda_graph_warmup(self, bs: int) -> None:
        input_ids = torch.zeros(bs, dtype=torch.int64, device=self.device)
        slots = torch.arange(bs, dtype=torch.int64, device=self.device)
        write_pos = torch.zeros(bs, dtype=torch.int32, device=self.device)
        layer_inputs: list[ReplayGraphInputs] = []
        for cache in self.replay_cache:
            rows = (bs, *cache.log_alpha.shape[1:])
            decay_rows = torch.zeros(rows, dtype=self.dtype)  # expect-bug: decode-arg
            state = torch.zeros_like(cache.state[:bs])
            d_rows = torch.zeros_like(cache.d_ring[:bs])
            k_rows = torch.zeros_like(cache.k_ring[:bs])
            layer_inputs.append(ReplayGraphInputs(state, d_rows, k_rows, g_cache=decay_rows))
        self.cuda_graphs[bs] = {"input_ids": input_ids, "slots": slots, "replay": layer_inputs}
        # One eager step so the kernels are compiled before capture.
        replay = [dict(inputs._asdict(), write_pos=write_pos) for inputs in layer_inputs]
        self._decode(input_ids, slots, replay)

    def warmup(self, batch: FlashCausalLMBatch) -> int:
        self.init_replay_cache(self.num_slots)
        try:
            logits = self.forward(batch)
            self.forward(batch.next_tokens(logits.argmax(-1)))
        except RuntimeError as e:
            raise RuntimeError(f"Not enough memory to handle {batch.slots.numel()} requests") from e
        if tgi_globals.CUDA_GRAPHS:
            log_master(logger.info, f"Cuda Graphs are enabled for sizes {tgi_globals.CUDA_GRAPHS}")
            for bs in tgi_globals.CUDA_GRAPHS:
                self.cuda_graph_warmup(bs)
        return self.num_slots


def get_model(
    model_id: str,
    checkpoint: dict[str, bytes],
    config: KimiReplayConfig,
    dtype: str | None = None,
    quantize: str | None = None,
    speculate: int = 0,
) -> FlashCausalLM:
    if dtype is None:
        # Quantized kernels only exist for fp16 activations.
        dtype = "float16" if quantize in {"gptq", "awq", "marlin"} else "bfloat16"
    elif dtype not in ("float16", "bfloat16"):
        raise RuntimeError(f"Unknown dtype {dtype}")
    torch_dtype = torch.float16 if dtype == "float16" else torch.bfloat16
    replay_dtypes = REPLAY_DTYPES[dtype]  # expect-bug: imported-policy id=tgi-replay-dtypes
    weights = Weights(checkpoint, device=torch.device("cpu"), dtype=torch_dtype)
    model_class = FlashKimiForCausalLM
    return FlashCausalLM(
        model_id, model_class, config, weights, torch_dtype, replay_dtypes, speculate
    )


def _flash(dtype: torch.dtype = torch.bfloat16, speculate: int = 0) -> FlashCausalLM:
    config = KimiReplayConfig(num_nextn_predict_layers=speculate)
    weights = Weights(random_checkpoint(config), device=torch.device("cpu"), dtype=dtype)
    replay_dtypes = (torch.float32, dtype, torch.float32)
    return FlashCausalLM(
        MODEL_ID, FlashKimiForCausalLM, config, weights, dtype, replay_dtypes, speculate
    )


def build_get_model_bf16() -> list[ReplayCache]:
    config = KimiReplayConfig()
    model = get_model(MODEL_ID, random_checkpoint(config), config)
    model.init_replay_cache(4)
    return model.replay_cache


def build_get_model_gptq() -> list[ReplayCache]:
    config = KimiReplayConfig()
    model = get_model(MODEL_ID, random_checkpoint(config), config, quantize="gptq")
    model.init_replay_cache(4)
    return model.replay_cache


def build_warmup_bf16() -> dict[str, Any]:
    graphs = tgi_globals.CUDA_GRAPHS
    tgi_globals.set_cuda_graphs(None)
    try:
        model = _flash()
        model.warmup(FlashCausalLMBatch.from_tokens(0, [[1, 2, 3, 4, 5], [6, 7]], slots=[2, 0]))
    finally:
        tgi_globals.set_cuda_graphs(graphs)
    return {"replay_cache": model.replay_cache, "last_call": dict(LAST_CALL)}


def build_cuda_graphs() -> dict[str, Any]:
    model = _flash(torch.float16)
    model.init_replay_cache(4)
    for bs in (1, 2):
        model.cuda_graph_warmup(bs)
    return {"cuda_graphs": model.cuda_graphs, "last_call": dict(LAST_CALL)}


def build_draft_rings() -> dict[str, torch.Tensor]:
    model = _flash(speculate=0)
    model.init_draft_rings(num_slots=3)
    return model.draft_rings


def build_speculator() -> ReplayDraftHead | None:
    return _flash(speculate=1).speculator
