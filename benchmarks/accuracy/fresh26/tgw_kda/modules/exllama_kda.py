"""ExLlama-style KDA backend: a standalone model object with its own ring cache and generator.

``ExllamaKDAModel.from_pretrained`` returns the model and its tokenizer; the model owns a cache
(``ExLlamaKDACache``, or ``ExLlamaKDACache_8bit`` with ``--cache_8bit``) with one slot per
concurrent sequence, and a generator that streams text with ``generate_with_streaming``. The
cache keeps per-layer lists of tensors, the way ExLlama caches do, and hands the model a
:class:`RingView` per layer.
"""

import copy
import logging
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from tgw_kda.modules import shared, utils
from tgw_kda.modules.kda_model import (
    ByteTokenizer,
    KimiLinearConfig,
    KimiLinearForCausalLM,
    RingView,
    load_weights,
)

logger = logging.getLogger(__name__)


class ExLlamaKDACache:
    """ReplaySSM rings of every layer for ``num_slots`` sequences.

    The delta and key rings are stored in the compute dtype; the checkpoint and the log-decay
    ring ``ssm_gate_log`` in float32; ``write_pos`` holds the int32 ring cursor of every slot.
    """

    def __init__(
        self,
        config: KimiLinearConfig,
        num_slots: int = 1,
        dtype: Optional[torch.dtype] = None,
        lazy: bool = False,
    ) -> None:
        self.config = config
        self.num_slots = num_slots
        self.dtype = dtype or torch.float16
        self.num_layers = config.num_hidden_layers
        self.state: List[torch.Tensor] = []
        self.delta_ring: List[torch.Tensor] = []
        self.key_ring: List[torch.Tensor] = []
        self.ssm_gate_log: List[torch.Tensor] = []
        self.write_pos: List[torch.Tensor] = []
        if not lazy:
            self.create_state_tensors()

    def ring_specs(self) -> Dict[str, Tuple[Tuple[int, ...], torch.dtype]]:
        """Shape and storage dtype of every per-layer tensor."""
        shapes = self.config.ring_shapes(self.num_slots)
        return {
            "state": (shapes["state"], utils.ring_dtype("state", self.dtype)),
            "delta_ring": (shapes["delta"], self.dtype),
            "key_ring": (shapes["key"], self.dtype),
            "ssm_gate_log": (shapes["log_decay"], utils.ring_dtype("ssm_gate_log", self.dtype)),
            "write_pos": ((self.num_slots,), torch.int32),
        }

    def create_state_tensors(self) -> None:
        specs = self.ring_specs()
        for _ in range(self.num_layers):
            for name, (shape, dtype) in specs.items():
                getattr(self, name).append(torch.zeros(shape, dtype=dtype))

    def layer_view(self, layer: int) -> RingView:
        return RingView(
            self.state[layer],
            self.delta_ring[layer],
            self.key_ring[layer],
            self.ssm_gate_log[layer],
            self.write_pos[layer],
        )

    def after_step(self, layer: int, view: RingView) -> None:
        """Hook for caches that decode on a temporary copy of their rings."""

    def reset(self, slot: Optional[int] = None) -> None:
        """Clears one slot, or every slot."""
        for name in ("state", "delta_ring", "key_ring", "ssm_gate_log", "write_pos"):
            for tensor in getattr(self, name):
                (tensor if slot is None else tensor[slot]).zero_()

    def footprint(self) -> int:
        """Bytes held by the cache."""
        tensors = self.state + self.delta_ring + self.key_ring + self.ssm_gate_log + self.write_pos
        return sum(t.numel() * t.element_size() for t in tensors)

    def grow(self, num_slots: int) -> None:
        """Adds empty slots at the end, keeping the contents of the existing ones."""
        old = self.num_slots
        if num_slots <= old:
            return
        for name in ("delta_ring", "key_ring", "ssm_gate_log"):
            rings = getattr(self, name)
            for i, ring in enumerate(rings):
                grown = torch.zeros((num_slots, *ring.shape[1:]), dtype=self.dtype, device=ring.device)  # expect-bug: pool-dtype
                grown[:old] = ring
                rings[i] = grown
        extra = num_slots - old
        self.state = [torch.cat([s, s.new_zeros((extra, *s.shape[1:]))]) for s in self.state]
        self.write_pos = [torch.cat([p, p.new_zeros(extra)]) for p in self.write_pos]
        self.num_slots = num_slots

    def fork(self, slot: int) -> "ExLlamaKDACache":
        """A one-slot cache holding a copy of ``slot`` (regenerate/branch from the same history)."""
        child = copy.copy(self)
        child.num_slots = 1
        pick = slice(slot, slot + 1)
        child.state = [s[pick].clone() for s in self.state]
        child.delta_ring = [torch.empty_like(d[pick]).copy_(d[pick]) for d in self.delta_ring]
        child.key_ring = [torch.empty_like(k[pick]).copy_(k[pick]) for k in self.key_ring]
        child.ssm_gate_log = [torch.empty_like(d[pick]).copy_(g[pick]) for d, g in zip(self.delta_ring, self.ssm_gate_log)]  # expect-bug: like
        child.write_pos = [p[pick].clone() for p in self.write_pos]
        return child

    def to(self, device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None) -> "ExLlamaKDACache":
        """Moves the cache along with its model (another device, or a reload in another dtype)."""
        for name in ("delta_ring", "key_ring", "ssm_gate_log"):
            setattr(self, name, [t.to(device=device or t.device, dtype=dtype or t.dtype) for t in getattr(self, name)])  # expect-bug: cast
        self.state = [s.to(device or s.device) for s in self.state]
        self.write_pos = [p.to(device or p.device) for p in self.write_pos]
        if dtype is not None:
            self.dtype = dtype
        return self


def _quantize_rows(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row of the last dimension, with float16 scales."""
    scale = x.float().abs().amax(dim=-1, keepdim=True).clamp_min(1e-8) / 127.0
    q = torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8)
    return q, scale.squeeze(-1).to(torch.float16)


def _dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale.float().unsqueeze(-1)).to(dtype)


class ExLlamaKDACache_8bit(ExLlamaKDACache):
    """Delta and key rings in int8 with a float16 scale per row; the log-decay ring unquantized.

    A decode step runs on dequantized copies of the int8 rings and re-quantizes them afterwards.
    """

    def __init__(self, config: KimiLinearConfig, num_slots: int = 1, dtype: Optional[torch.dtype] = None, lazy: bool = False) -> None:
        self.delta_scale: List[torch.Tensor] = []
        self.key_scale: List[torch.Tensor] = []
        super().__init__(config, num_slots, dtype, lazy)

    def create_state_tensors(self) -> None:
        shapes = self.config.ring_shapes(self.num_slots)
        for _ in range(self.num_layers):
            self.state.append(torch.zeros(shapes["state"], dtype=torch.float32))
            self.delta_ring.append(torch.zeros(shapes["delta"], dtype=torch.int8))
            self.delta_scale.append(torch.zeros(shapes["delta"][:-1], dtype=torch.float16))
            self.key_ring.append(torch.zeros(shapes["key"], dtype=torch.int8))
            self.key_scale.append(torch.zeros(shapes["key"][:-1], dtype=torch.float16))
            self.ssm_gate_log.append(torch.zeros(shapes["log_decay"]))  # expect-bug: default-dtype id=exl-default-dtype
            self.write_pos.append(torch.zeros(self.num_slots, dtype=torch.int32))

    def layer_view(self, layer: int) -> RingView:
        delta = _dequantize_rows(self.delta_ring[layer], self.delta_scale[layer], self.dtype)
        key = _dequantize_rows(self.key_ring[layer], self.key_scale[layer], self.dtype)
        return RingView(self.state[layer], delta, key, self.ssm_gate_log[layer], self.write_pos[layer])

    def after_step(self, layer: int, view: RingView) -> None:
        self.delta_ring[layer], self.delta_scale[layer] = _quantize_rows(view.delta)
        self.key_ring[layer], self.key_scale[layer] = _quantize_rows(view.key)

    def grow(self, num_slots: int) -> None:
        raise NotImplementedError("the 8-bit cache cannot grow; reload the model with more --max_slots")

    def to(self, device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None) -> "ExLlamaKDACache_8bit":
        """Only the dequantization dtype follows the model; the stored rings keep theirs."""
        if dtype is not None:
            self.dtype = dtype
        return self


class ExLlamaKDAGenerator:
    """Greedy streaming generation on one slot of an :class:`ExLlamaKDACache`."""

    def __init__(self, model: KimiLinearForCausalLM, cache: ExLlamaKDACache, tokenizer: ByteTokenizer) -> None:
        self.model = model
        self.cache = cache
        self.tokenizer = tokenizer

    @torch.no_grad()
    def feed(self, token_ids: List[int], slot: int = 0) -> torch.Tensor:
        """Runs ``token_ids`` through the model on ``slot``; the logits of the last one."""
        slots = torch.tensor([slot], dtype=torch.int32)
        logits = torch.empty(0)
        for token in token_ids:
            views = [self.cache.layer_view(i) for i in range(self.cache.num_layers)]
            logits = self.model.decode_step(torch.tensor([token]), slots, views)
            for i, view in enumerate(views):
                self.cache.after_step(i, view)
        return logits

    def stream(self, prompt_ids: List[int], max_new_tokens: int, slot: int = 0, ban_eos: bool = False) -> Iterator[int]:
        self.cache.reset(slot)
        logits = self.feed(prompt_ids, slot)
        for _ in range(max_new_tokens):
            scores = logits[-1].float()
            if ban_eos:
                scores[self.tokenizer.eos_token_id] = -float("inf")
            token = int(scores.argmax())
            if token == self.tokenizer.eos_token_id:
                return
            yield token
            logits = self.feed([token], slot)


class ExllamaKDAModel:
    """The object the ExLlamaKDA loader puts in ``shared.model``."""

    def __init__(self) -> None:
        self.model: Optional[KimiLinearForCausalLM] = None
        self.cache: Optional[ExLlamaKDACache] = None
        self.generator: Optional[ExLlamaKDAGenerator] = None
        self.tokenizer: Optional[ByteTokenizer] = None

    @classmethod
    def from_pretrained(cls, path_to_model: Path) -> Tuple["ExllamaKDAModel", ByteTokenizer]:
        path_to_model = Path(path_to_model)
        config = KimiLinearConfig.from_json(path_to_model / "config.json")
        if shared.args.ring_len:
            config.ring_len = shared.args.ring_len
        dtype = utils.get_torch_dtype(shared.args)
        model = KimiLinearForCausalLM(config, dtype=dtype)
        model.load_state_dict(load_weights(path_to_model), strict=False)
        model.eval()
        num_slots = max(1, shared.args.max_slots)
        if shared.args.cache_8bit:
            cache = ExLlamaKDACache_8bit(config, num_slots, dtype=dtype)
        else:
            cache = ExLlamaKDACache(config, num_slots, dtype=dtype)
        tokenizer = ByteTokenizer(config.vocab_size)
        result = cls()
        result.model, result.cache, result.tokenizer = model, cache, tokenizer
        result.generator = ExLlamaKDAGenerator(model, cache, tokenizer)
        logger.info("ExLlamaKDA cache: %d slot(s), %d bytes", num_slots, cache.footprint())
        return result, tokenizer

    def encode(self, string: str, add_bos: bool = True) -> torch.Tensor:
        return torch.tensor([self.tokenizer.encode(string, add_bos=add_bos)])

    def decode(self, ids: Any, **kwargs: Any) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        return self.tokenizer.decode(ids)

    def generate_with_streaming(self, prompt: str, state: Dict[str, Any]) -> Iterator[str]:
        ids = self.tokenizer.encode(prompt, add_bos=state.get("add_bos_token", True))
        output: List[int] = []
        for token in self.generator.stream(ids, state["max_new_tokens"], ban_eos=state.get("ban_eos_token", False)):
            output.append(token)
            yield self.tokenizer.decode(output)

    def generate(self, prompt: str, state: Dict[str, Any]) -> str:
        output = ""
        for output in self.generate_with_streaming(prompt, state):
            pass
        return output


def _tiny(dtype: torch.dtype) -> Tuple[KimiLinearConfig, KimiLinearForCausalLM]:
    torch.manual_seed(0)
    config = KimiLinearConfig()
    return config, KimiLinearForCausalLM(config, dtype=dtype)


def build_exllama_cache_bf16() -> ExLlamaKDACache:
    """A bf16 cache of three slots after two interleaved prompts and a reset slot."""
    config, model = _tiny(torch.bfloat16)
    cache = ExLlamaKDACache(config, num_slots=3, dtype=torch.bfloat16)
    generator = ExLlamaKDAGenerator(model, cache, ByteTokenizer(config.vocab_size))
    generator.feed([3, 4, 5, 6, 7], slot=0)
    generator.feed([8, 9], slot=2)
    cache.reset(1)
    generator.feed([10, 11, 12], slot=1)
    return cache


def build_exllama_cache_8bit() -> ExLlamaKDACache_8bit:
    """An 8-bit cache (fp16 compute) after a prompt on each of two slots, then moved to bf16."""
    config, model = _tiny(torch.float16)
    cache = ExLlamaKDACache_8bit(config, num_slots=2, dtype=torch.float16)
    generator = ExLlamaKDAGenerator(model, cache, ByteTokenizer(config.vocab_size))
    generator.feed([5, 6, 7, 8, 9, 10], slot=0)
    generator.feed([11, 12], slot=1)
    model.to(torch.bfloat16)
    cache.to(dtype=torch.bfloat16)
    generator.feed([13], slot=1)
    return cache


def build_exllama_cache_grown() -> ExLlamaKDACache:
    """A two-slot bf16 cache that grows to four slots under load and keeps decoding."""
    config, model = _tiny(torch.bfloat16)
    cache = ExLlamaKDACache(config, num_slots=2, dtype=torch.bfloat16)
    generator = ExLlamaKDAGenerator(model, cache, ByteTokenizer(config.vocab_size))
    generator.feed([3, 5, 7], slot=0)
    generator.feed([4, 6], slot=1)
    cache.grow(4)
    generator.feed([8, 9, 10], slot=3)
    return cache


def build_exllama_branch_and_move() -> Dict[str, ExLlamaKDACache]:
    """A branch forked from slot 0, and the original cache moved along with a reload in fp16."""
    config, model = _tiny(torch.bfloat16)
    cache = ExLlamaKDACache(config, num_slots=2, dtype=torch.bfloat16)
    tokenizer = ByteTokenizer(config.vocab_size)
    ExLlamaKDAGenerator(model, cache, tokenizer).feed([3, 4, 5], slot=0)
    branch = cache.fork(0)
    ExLlamaKDAGenerator(model, branch, tokenizer).feed([9, 2], slot=0)
    model.half()
    cache.to(dtype=torch.float16)
    ExLlamaKDAGenerator(model, cache, tokenizer).feed([6], slot=0)
    return {"branch": branch, "cache": cache}
