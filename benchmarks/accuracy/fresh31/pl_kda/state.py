"""The decode state kept outside a module: ``ReplayState`` and a slot pool.

A ``ReplayState`` holds, per layer, the float32 checkpoints, the delta/key rings, the log-decay
("forget") ring and the int32 ring cursors of ``num_slots`` sequences. The Fabric predictors, the
checkpoint exporter and the serving CLI pass it around; the LightningModule keeps its own rings as
buffers instead.
"""

from dataclasses import dataclass, fields
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from pl_kda.config import KDAConfig, RingDtypes

RING_FIELDS = ("initial_state", "d_ring", "k_ring", "forget_ring", "write_pos")


@dataclass
class ReplayState:
    initial_state: List[torch.Tensor]
    d_ring: List[torch.Tensor]
    k_ring: List[torch.Tensor]
    forget_ring: List[torch.Tensor]
    write_pos: List[torch.Tensor]

    @property
    def num_layers(self) -> int:
        return len(self.d_ring)

    @property
    def num_slots(self) -> int:
        return self.d_ring[0].shape[0]

    def named_rings(self) -> Iterator[Tuple[str, List[torch.Tensor]]]:
        for item in fields(self):
            yield item.name, getattr(self, item.name)

    def layer(self, index: int) -> Dict[str, torch.Tensor]:
        """Layer ``index`` under the kernel's argument names (for ``KimiLinear.decode_step``)."""
        return {
            "initial_state": self.initial_state[index],
            "d_cache": self.d_ring[index],
            "k_cache": self.k_ring[index],
            "g_cache": self.forget_ring[index],
            "write_pos": self.write_pos[index],
        }

    def layers(self) -> List[Dict[str, torch.Tensor]]:
        return [self.layer(i) for i in range(self.num_layers)]

    def reset_slots(self, slots: Sequence[int]) -> None:
        for _, tensors in self.named_rings():
            for tensor in tensors:
                tensor[list(slots)] = 0

    def to(self, device: Any = None, dtype: Optional[torch.dtype] = None) -> "ReplayState":
        """Moves the state to ``device``; with ``dtype`` the floating tensors are also cast."""

        def move(tensor: torch.Tensor) -> torch.Tensor:
            if dtype is not None and tensor.is_floating_point():
                return tensor.to(device=device or tensor.device, dtype=dtype)  # expect-bug: cast id=adopt-state
            return tensor.to(device=device or tensor.device)

        return ReplayState(*([move(t) for t in tensors] for _, tensors in self.named_rings()))

    def with_dk_dtype(self, dtype: torch.dtype) -> "ReplayState":
        """A copy whose delta/key rings are stored in ``dtype`` (checkpoints and log-decays untouched)."""
        return ReplayState(
            initial_state=list(self.initial_state),
            d_ring=[t.to(dtype) for t in self.d_ring],
            k_ring=[t.to(dtype) for t in self.k_ring],
            forget_ring=list(self.forget_ring),
            write_pos=list(self.write_pos),
        )


def allocate_replay_state(config: KDAConfig, num_slots: int, dtypes: RingDtypes, device: Any = "cpu") -> ReplayState:
    """Empty rings of every layer with the given ring dtypes (checkpoints float32, cursors int32)."""
    shapes = config.ring_shapes(num_slots)
    layers = range(config.num_layers)
    return ReplayState(
        initial_state=[torch.zeros(shapes["state"], dtype=torch.float32, device=device) for _ in layers],
        d_ring=[torch.zeros(shapes["delta"], dtype=dtypes.delta, device=device) for _ in layers],
        k_ring=[torch.zeros(shapes["key"], dtype=dtypes.key, device=device) for _ in layers],
        forget_ring=[torch.zeros(shapes["gate"], dtype=dtypes.gate, device=device) for _ in layers],
        write_pos=[torch.zeros(num_slots, dtype=torch.int32, device=device) for _ in layers],
    )


def grow_replay_state(state: ReplayState, num_slots: int) -> ReplayState:
    """A copy of ``state`` with room for ``num_slots`` sequences; existing slots keep their rows."""
    if num_slots <= state.num_slots:
        return state

    def grown(tensor: torch.Tensor) -> torch.Tensor:
        bigger = tensor.new_zeros((num_slots, *tensor.shape[1:]))
        bigger[: tensor.shape[0]] = tensor
        return bigger

    forget_ring = []
    for d, g in zip(state.d_ring, state.forget_ring):
        rows = d.new_zeros((num_slots, *g.shape[1:]))  # expect-bug: like
        rows[: g.shape[0]] = g
        forget_ring.append(rows)
    return ReplayState(
        initial_state=[grown(t) for t in state.initial_state],
        d_ring=[grown(t) for t in state.d_ring],
        k_ring=[grown(t) for t in state.k_ring],
        forget_ring=forget_ring,
        write_pos=[grown(t) for t in state.write_pos],
    )


def push_gate_rows(ring: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Sliding-window variant: drops the oldest row of ``ring [S, HV, L, K]`` and appends ``rows [S, HV, K]``."""
    return torch.cat([ring[:, :, 1:], rows.unsqueeze(2)], dim=2)


class ReplayStatePool:
    """Hands out cache slots of one set of rings shared by all requests of a worker.

    The rings are stacked over layers (``[layers, slots, ...]``); ``view()`` returns a
    ``ReplayState`` of per-layer views for the decode step.
    """

    RINGS = {"d_ring": "delta", "k_ring": "key", "forget_ring": "gate"}

    def __init__(self, config: KDAConfig, max_slots: int, dtype: torch.dtype = torch.bfloat16) -> None:
        self.config = config
        self.max_slots = max_slots
        self.dtype = dtype
        shapes = config.ring_shapes(max_slots)
        self.initial_state = torch.zeros(config.num_layers, *shapes["state"], dtype=torch.float32)
        self.rings: Dict[str, torch.Tensor] = {}
        for name, shape_key in self.RINGS.items():
            self.rings[name] = torch.zeros(config.num_layers, *shapes[shape_key], dtype=self.dtype)  # expect-bug: pool-dtype
        self.write_pos = torch.zeros(config.num_layers, max_slots, dtype=torch.int32)
        self.free_slots: List[int] = list(range(max_slots))
        self.slot_of: Dict[str, int] = {}

    def acquire(self, request_id: str) -> int:
        if request_id in self.slot_of:
            return self.slot_of[request_id]
        if not self.free_slots:
            raise RuntimeError("no free decode slot")
        slot = self.free_slots.pop(0)
        self.slot_of[request_id] = slot
        self.initial_state[:, slot].zero_()
        for ring in self.rings.values():
            ring[:, slot].zero_()
        self.write_pos[:, slot] = 0
        return slot

    def release(self, request_id: str) -> None:
        self.free_slots.append(self.slot_of.pop(request_id))
        self.free_slots.sort()

    def view(self) -> ReplayState:
        layers = range(self.config.num_layers)
        return ReplayState(
            initial_state=[self.initial_state[i] for i in layers],
            d_ring=[self.rings["d_ring"][i] for i in layers],
            k_ring=[self.rings["k_ring"][i] for i in layers],
            forget_ring=[self.rings["forget_ring"][i] for i in layers],
            write_pos=[self.write_pos[i] for i in layers],
        )


def _feed(state: ReplayState, steps: int, seed: int = 0) -> ReplayState:
    """Decodes ``steps`` tokens on every slot of ``state`` with a small bf16 model."""
    from pl_kda.modeling import KimiLinear

    torch.manual_seed(seed)
    config = KDAConfig()
    model = KimiLinear(config).to(torch.bfloat16)
    slots = torch.arange(state.num_slots, dtype=torch.int32)
    with torch.no_grad():
        for step in range(steps):
            ids = torch.randint(0, config.vocab_size, (state.num_slots,))
            model.decode_step(ids, state.layers(), slots)
    return state


def build_pool_and_grow() -> Dict[str, Any]:
    """A worker pool in the model dtype, and a correctly allocated state grown for more requests."""
    torch.manual_seed(0)
    config = KDAConfig()
    pool = ReplayStatePool(config, max_slots=2, dtype=torch.bfloat16)
    pool.acquire("req-0")
    pool.acquire("req-1")
    _feed(pool.view(), steps=3)
    state = _feed(allocate_replay_state(config, 2, RingDtypes(torch.bfloat16, torch.bfloat16)), steps=5)
    return {"pool": pool, "grown": grow_replay_state(state, 4)}


def build_replay_state_bf16() -> Dict[str, Any]:
    """bf16 delta/key rings with a float32 forget ring: fed, shifted, copied and moved."""
    torch.manual_seed(0)
    config = KDAConfig()
    state = _feed(allocate_replay_state(config, 2, RingDtypes(delta=torch.bfloat16, key=torch.bfloat16)), steps=6)
    rows = torch.randn(2, config.num_v_heads, config.head_dim).to(torch.bfloat16)
    shifted = push_gate_rows(state.forget_ring[0], -torch.nn.functional.softplus(rows))
    raw = state.forget_ring[1].view(torch.uint8).clone()
    moved = state.to(device="cpu")
    fp16_dk = state.with_dk_dtype(torch.float16)
    return {
        "state": state,
        "moved": moved,
        "fp16_dk": fp16_dk,
        "shifted": {"forget_ring": shifted},
        "from_bytes": {"forget_ring": raw.view(torch.float32)},
    }
