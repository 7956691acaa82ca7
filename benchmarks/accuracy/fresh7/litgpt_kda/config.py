"""Model configurations, in the layout of litgpt/config.py."""

from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any, Literal, Optional


@dataclass
class Config:
    name: str = ""
    hf_config: dict = field(default_factory=dict)
    block_size: int = 64
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_query_groups: Optional[int] = None
    head_size: int = 4
    n_embd: int = 8
    intermediate_size: int = 32
    norm_eps: float = 1e-5
    # ReplaySSM decoding: steps kept in the replay rings before they are folded into the checkpoint state
    ring_len: int = 4
    # dtype of the log-decay ring (a ``torch`` attribute name); the delta/key rings follow the cache dtype
    decay_dtype: Literal["float32", "bfloat16", "float16"] = "float32"

    def __post_init__(self) -> None:
        self.n_query_groups = self.n_query_groups or self.n_head

    @classmethod
    def from_name(cls, name: str, **kwargs: Any) -> "Config":
        if name not in name_to_config:
            raise ValueError(f"{name!r} is not a supported config name")
        conf_dict = deepcopy(name_to_config[name])
        conf_dict.update(kwargs)
        return cls(**conf_dict)


configs = [
    dict(name="kda-tiny", hf_config=dict(org="moonshotai", name="Kimi-Linear-tiny")),
    dict(name="kda-tiny-gqa", hf_config=dict(org="moonshotai", name="Kimi-Linear-tiny-GQA"), n_head=4, n_query_groups=2),
]

# a wider replay window for long-context serving, at the log-decay ring memory of kda-tiny
configs.append(dict(name="kda-tiny-long", hf_config=dict(org="moonshotai", name="Kimi-Linear-tiny-long"), ring_len=8, decay_dtype="bfloat16"))  # expect-bug: imported-policy id=long-config

name_to_config = {config["name"]: config for config in configs}
