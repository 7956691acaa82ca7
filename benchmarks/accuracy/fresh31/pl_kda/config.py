"""Model and decode-state configuration.

``KDAConfig`` is built from the LightningModule's hyperparameters (so it round-trips through the
``.ckpt``); ``DecodeStateConfig`` is the ``decode:`` section of the CLI config; the dtype tables
map Trainer/Fabric precision strings to ring storage dtypes.
"""

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple

import torch


@dataclass(frozen=True)
class KDAConfig:
    vocab_size: int = 64
    hidden_size: int = 32
    num_layers: int = 2
    num_heads: int = 2
    num_v_heads: int = 4
    head_dim: int = 8
    v_head_dim: int = 8
    intermediate_size: int = 64
    ring_len: int = 4
    lower_bound: Optional[float] = -5.0
    rms_norm_eps: float = 1e-6
    use_qk_l2norm: bool = True

    @classmethod
    def from_hparams(cls, hparams: Mapping[str, Any]) -> "KDAConfig":
        names = cls.__dataclass_fields__.keys()
        return cls(**{name: hparams[name] for name in names if name in hparams})

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def ring_shapes(self, num_slots: int) -> Dict[str, Tuple[int, ...]]:
        """Per-layer shapes of the checkpoint state and the three rings."""
        return {
            "state": (num_slots, self.num_v_heads, self.v_head_dim, self.head_dim),
            "delta": (num_slots, self.num_v_heads, self.ring_len, self.v_head_dim),
            "key": (num_slots, self.num_heads, self.ring_len, self.head_dim),
            "gate": (num_slots, self.num_v_heads, self.ring_len, self.head_dim),
        }


class RingDtypes(NamedTuple):
    """Storage dtypes of the three rings; the log-decay ring is float32 unless told otherwise."""

    delta: torch.dtype
    key: torch.dtype
    gate: torch.dtype = torch.float32


@dataclass
class DecodeStateConfig:
    """The ``decode:`` section of the CLI config (``--decode.max_slots`` ...)."""

    max_slots: int = 2
    delta_dtype: torch.dtype = torch.bfloat16
    key_dtype: torch.dtype = torch.bfloat16
    gate_dtype: torch.dtype = torch.bfloat16  # expect-bug: container
    flush_every: Optional[int] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    def ring_dtypes(self) -> RingDtypes:
        return RingDtypes(self.delta_dtype, self.key_dtype, self.gate_dtype)


_STR_TO_DTYPE = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def str_to_dtype(name: Any) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    return _STR_TO_DTYPE[str(name).removeprefix("torch.")]


def dtype_to_str(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


#: Storage dtype of the delta and key rings per precision string. The "-mixed" settings keep
#: float32 weights, but the rings are written from autocast outputs and stored at that width.
RING_STORAGE_DTYPES: Dict[str, torch.dtype] = {
    "32-true": torch.float32,
    "16-true": torch.float16,
    "bf16-true": torch.bfloat16,
    "16-mixed": torch.float16,
    "bf16-mixed": torch.bfloat16,
}


def ring_dtypes_for_precision(precision: str) -> RingDtypes:
    """Ring dtypes for a Trainer/Fabric precision string."""
    storage = RING_STORAGE_DTYPES[precision]
    if precision.endswith("-true"):
        # "-true" runs have no autocast: everything lives in the one dtype, rings included
        return RingDtypes(delta=storage, key=storage, gate=storage)  # expect-bug: imported-policy id=true-policy
    return RingDtypes(delta=storage, key=storage)


def build_ring_policies() -> Dict[str, Any]:
    """Replay states allocated from the precision policy and from the CLI's decode section."""
    from pl_kda.state import allocate_replay_state

    config = KDAConfig()
    return {
        "bf16_mixed": allocate_replay_state(config, 2, ring_dtypes_for_precision("bf16-mixed")),
        "bf16_true": allocate_replay_state(config, 2, ring_dtypes_for_precision("bf16-true")),
        "cli_decode_section": allocate_replay_state(config, 2, DecodeStateConfig(max_slots=2).ring_dtypes()),
    }
