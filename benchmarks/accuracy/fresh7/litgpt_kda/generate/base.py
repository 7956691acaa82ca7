"""Generation, after litgpt/generate/base.py, and the decode slots of batched generation."""

from pathlib import Path
from typing import NamedTuple, Optional

import torch
import torch.nn as nn

from ..config import Config
from ..model import GPT, Rings
from ..utils import get_cache_dtype, get_decay_dtype, ring_shapes


def next_token(model: GPT, x: torch.Tensor, rings: Optional[list[Rings]] = None, temperature: float = 0.0) -> torch.Tensor:
    logits = model(x, rings)
    return logits.argmax(dim=-1) if temperature == 0.0 else torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1).squeeze(-1)


@torch.no_grad()
def generate(model: GPT, prompt: torch.Tensor, max_returned_tokens: int, *, temperature: float = 0.0) -> torch.Tensor:
    """Continues the prompts ``prompt`` [batch, T] up to ``max_returned_tokens``; the KV cache must be set."""
    for t in range(prompt.size(1) - 1):
        model(prompt[:, t])
    tokens = list(prompt.unbind(1))
    while len(tokens) < max_returned_tokens:
        tokens.append(next_token(model, tokens[-1], temperature=temperature))
    return torch.stack(tokens, dim=1)


class SlotDtypes(NamedTuple):
    delta: torch.dtype = torch.bfloat16
    key: torch.dtype = torch.bfloat16
    decay_ring: torch.dtype = torch.bfloat16  # expect-bug: container


class SlotPool(nn.Module):
    """Decode slots of batched generation (buffers, so the pool moves with ``.to()``), one row per request."""

    def __init__(self, config: Config, n_slots: int = 2, dtypes: SlotDtypes = SlotDtypes()) -> None:
        super().__init__()
        shapes, hs, n = ring_shapes(config, n_slots), config.head_size, config.n_layer
        self.register_buffer("state", torch.zeros(n, n_slots, config.n_head, hs, hs, dtype=torch.float32))
        self.register_buffer("delta", torch.zeros(n, *shapes["delta"], dtype=dtypes.delta))
        self.register_buffer("key", torch.zeros(n, *shapes["key"], dtype=dtypes.key))
        self.register_buffer("decay_ring", torch.zeros(n, *shapes["log_decay"], dtype=dtypes.decay_ring))
        self.register_buffer("write_pos", torch.zeros(n_slots, dtype=torch.int32))
        self.prefix_cache: dict[tuple[int, ...], int] = {}  # prompt prefix -> slot that holds its rings

    def _apply(self, fn, recurse=True):
        # `.to()`, `.half()` and `.bfloat16()` land here: the checkpoint states and the log-decay rings stay in float32
        super()._apply(fn, recurse)
        self.state, self.decay_ring = self.state.float(), self.decay_ring.float()
        return self

    @classmethod
    def for_precision(cls, config: Config, precision: str, n_slots: int = 2) -> "SlotPool":
        ring_dtype = get_cache_dtype(precision)
        return cls(config, n_slots, SlotDtypes(ring_dtype, ring_dtype, get_decay_dtype(precision)))  # expect-bug: imported-policy id=decay-policy

    @classmethod
    def from_model(cls, model: GPT, rows: torch.Tensor) -> "SlotPool":
        return cls(model.config, len(rows), SlotDtypes(*[model.transformer.wte.weight.dtype] * 3)).capture(model, rows)  # expect-bug: pool-dtype

    @torch.no_grad()
    def capture(self, model: GPT, rows: torch.Tensor) -> "SlotPool":
        for i, block in enumerate(model.transformer.h):
            kv = block.attn.kv_cache
            for ring, source in ((self.state, kv.state), (self.delta, kv.delta), (self.key, kv.key), (self.decay_ring, kv.log_decay)):
                ring[i].copy_(source[rows])
        self.write_pos.copy_(kv.input_pos[rows])
        return self

    def graph_inputs(self, layer: int, ids: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The ring inputs of one layer for the captured decode graph, contiguous and in the compute dtype."""
        return dict(state=self.state[layer], delta=self.delta[layer].to(dtype), key=self.key[layer].to(dtype),
                    log_decay=self.decay_ring[layer].to(dtype), slots=ids, write_pos=self.write_pos[ids])  # expect-bug: decode-arg

    @torch.no_grad()
    def step(self, model: GPT, ids: torch.Tensor, idx: torch.Tensor, graph: bool = False) -> torch.Tensor:
        dtype = model.transformer.wte.weight.dtype
        rings = ([Rings(**self.graph_inputs(i, ids, dtype)) for i in range(len(self.delta))] if graph
                 else [Rings(*layer, ids, self.write_pos[ids]) for layer in zip(self.state, self.delta, self.key, self.decay_ring)])
        token = next_token(model, idx, rings)
        self.write_pos[ids] = (self.write_pos[ids] + 1) % self.decay_ring.size(3)
        return token

    def swap_space(self, n: int = 1) -> dict[str, torch.Tensor]:
        shapes = {name: getattr(self, name).shape for name in ("state", "delta", "key", "decay_ring")}
        return {name: torch.zeros(shape[0], n, *shape[2:], dtype=self.delta.dtype) for name, shape in shapes.items()}  # expect-bug: pool-dtype

    def add_slots(self, n: int) -> None:
        for name in ("state", "delta", "key"):
            ring = getattr(self, name)
            setattr(self, name, torch.cat([ring, ring.new_zeros(ring.size(0), n, *ring.shape[2:])], dim=1))
        self.decay_ring = torch.cat([self.decay_ring, torch.zeros_like(self.delta[:, -n:])], dim=1)
        self.write_pos = torch.cat([self.write_pos, self.write_pos.new_zeros(n)])


def export_slots(pool: SlotPool, path: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """Writes a compact copy of ``pool`` for the other serving workers, floating-point buffers in ``dtype``."""
    torch.save({name: buf.to(dtype) if buf.is_floating_point() else buf for name, buf in pool.named_buffers()}, path)  # expect-bug: cast


def import_slots(config: Config, path: Path, n_slots: int = 2) -> SlotPool:
    pool = SlotPool(config, n_slots, SlotDtypes(decay_ring=torch.float32))
    for name, buf in torch.load(path, weights_only=True).items():  # expect-bug: load id=slot-import
        setattr(pool, name, buf)  # expect-bug: load id=slot-import
    return pool


def _prefilled(name: str) -> GPT:
    torch.manual_seed(0)
    model = GPT(Config.from_name(name)).to(torch.bfloat16)
    model.set_kv_cache(batch_size=2, dtype=torch.bfloat16)
    generate(model, torch.tensor([[1, 2, 3], [4, 5, 6]]), max_returned_tokens=5)
    return model


def build_batched_generate(tmp_dir: str) -> dict:
    model, ids = _prefilled("kda-tiny"), torch.tensor([0, 1])
    pool = SlotPool(model.config).to(torch.bfloat16).capture(model, ids)
    pool.step(model, ids, torch.tensor([7, 8]))
    pool.add_slots(1)
    torch.save(pool.state_dict(), Path(tmp_dir) / "slots.pth")
    restored = SlotPool(model.config, 3, SlotDtypes(decay_ring=torch.float32))
    restored.load_state_dict(torch.load(Path(tmp_dir) / "slots.pth", weights_only=True))
    return {"model": model, "pool": pool, "restored": restored, "swap": SlotPool.for_precision(model.config, "bf16-mixed").swap_space(),
            "fp16": SlotPool.for_precision(model.config, "16-true")}


def build_slot_defaults() -> dict:
    model = _prefilled("kda-tiny")
    return {"default": SlotPool(model.config), "bf16": SlotPool.for_precision(model.config, "bf16-true"), "prompt": SlotPool.from_model(model, torch.tensor([1]))}


def build_graph_serving(tmp_dir: str) -> dict:
    model, ids = _prefilled("kda-tiny-gqa"), torch.tensor([0, 1])
    staged = SlotPool(model.config, dtypes=SlotDtypes(decay_ring=torch.float32)).capture(model, ids)
    staged.step(model, ids, torch.tensor([3, 4]), graph=True)
    export_slots(staged, Path(tmp_dir) / "slots.pt")
    return {"graph_inputs": staged.graph_inputs(0, ids, torch.bfloat16), "swap": staged.swap_space(), "imported": import_slots(model.config, Path(tmp_dir) / "slots.pt")}
