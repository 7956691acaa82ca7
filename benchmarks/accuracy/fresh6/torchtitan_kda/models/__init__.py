"""KDA model arguments and flavors."""

from dataclasses import dataclass


@dataclass
class KDAModelArgs:
    dim: int = 8
    n_layers: int = 2
    n_heads: int = 1
    n_v_heads: int = 2
    head_dim: int = 4
    ring_len: int = 4
    max_batch_size: int = 2
    vocab_size: int = 16
    norm_eps: float = 1e-5
    # dtype of the decode rings that are re-allocated when the batch size changes
    state_dtype: str = "bfloat16"  # expect-bug: imported-policy id=titan-args-state

    @property
    def qkv_dim(self) -> int:
        return (2 * self.n_heads + self.n_v_heads) * self.head_dim


kda_configs = {"debugmodel": KDAModelArgs(), "debugmodel_long_ring": KDAModelArgs(ring_len=6)}
