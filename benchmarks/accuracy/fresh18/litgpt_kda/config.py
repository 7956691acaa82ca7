# Copyright Lightning AI. Licensed under the Apache License 2.0, see LICENSE file.

from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Type


import torch

from litgpt_kda.utils import find_multiple


@dataclass
class Config:
    name: str = ""
    hf_config: dict = field(default_factory=dict)
    block_size: int = 4096
    vocab_size: int = 50254
    padding_multiple: int = 512
    padded_vocab_size: Optional[int] = None
    n_layer: int = 16
    n_embd: int = 4096
    n_head: int = 32
    """Number of query/key heads (``H``)."""
    n_value_head: Optional[int] = None
    """Number of value heads (``HV``); a multiple of ``n_head``. Defaults to ``n_head``."""
    head_size: Optional[int] = None
    """Key dimension ``K`` of one head."""
    value_head_size: Optional[int] = None
    """Value dimension ``V`` of one head. Defaults to ``head_size``."""
    bias: bool = False
    norm_eps: float = 1e-6
    mlp_class_name: Literal["LLaMAMLP"] = "LLaMAMLP"
    intermediate_size: Optional[int] = None
    # Kimi Delta Attention
    gate_lower_bound: Optional[float] = None
    """``lb`` of the bounded gate ``g = lb * sigmoid(A * x)``; ``None`` for ``g = -A * softplus(x)``."""
    use_qk_l2norm: bool = True
    ring_len: int = 16
    """Rows of the ReplaySSM rings; the checkpoint state is written once every ``ring_len`` tokens."""
    cache_precision: Optional[str] = None
    """Precision of the checkpoint states and the delta/key rings. ``None``: the model's dtype."""
    logdecay_precision: str = "32-true"
    """Precision of the log-decay ring."""

    def __post_init__(self):
        if not self.name:
            self.name = self.hf_config.get("name", self.name)

        if self.head_size is None:
            assert self.n_embd % self.n_head == 0
            self.head_size = self.n_embd // self.n_head
        if self.value_head_size is None:
            self.value_head_size = self.head_size

        if self.n_value_head is None:
            self.n_value_head = self.n_head
        if self.n_value_head % self.n_head != 0:
            raise ValueError(
                f"n_value_head ({self.n_value_head}) must be a multiple of n_head ({self.n_head})"
            )

        # vocab size should be a power of 2 to be optimal on hardware. compute the closest value
        if self.padded_vocab_size is None:
            self.padded_vocab_size = find_multiple(self.vocab_size, self.padding_multiple)
        else:
            # vocab size shouldn't be larger than padded vocab size
            self.vocab_size = min(self.vocab_size, self.padded_vocab_size)

        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.n_embd

        if self.ring_len < 2:
            raise ValueError(f"ring_len must be at least 2, got {self.ring_len}")

    @property
    def qkv_size(self) -> int:
        """Width of the packed ``mixed_qkv`` projection: ``2 * H * K + HV * V``."""
        return 2 * self.n_head * self.head_size + self.n_value_head * self.value_head_size

    @property
    def value_size(self) -> int:
        return self.n_value_head * self.value_head_size

    @classmethod
    def from_name(cls, name: str, **kwargs: Any) -> Optional["Config"]:
        if name not in name_to_config:
            # search through all `config['hf_config']['name']`
            try:
                conf_dict = next(
                    config for config in configs if name == config["hf_config"]["name"]
                )
            except StopIteration:
                raise ValueError(f"{name!r} is not a supported config name")
        else:
            conf_dict = name_to_config[name]

        conf_dict = conf_dict.copy()
        conf_dict.update(kwargs)
        return cls(**conf_dict)

    @property
    def mlp_class(self) -> Type:
        # `self.mlp_class_name` cannot be the type to keep the config serializable
        import litgpt_kda.model

        return getattr(litgpt_kda.model, self.mlp_class_name)

    @property
    def cache_dtype(self) -> Optional[torch.dtype]:
        """dtype of the states and delta/key rings when the config pins one, else ``None``."""
        from litgpt_kda.utils import precision_to_dtype

        return None if self.cache_precision is None else precision_to_dtype(self.cache_precision)


########################
# Moonshot AI Kimi Linear
########################
configs = [
    # https://huggingface.co/moonshotai/Kimi-Linear-48B-A3B-Instruct/blob/main/config.json
    dict(
        name="Kimi-Linear-48B-A3B-Instruct",
        hf_config=dict(org="moonshotai", name="Kimi-Linear-48B-A3B-Instruct"),
        block_size=1048576,
        vocab_size=163840,
        padding_multiple=512,
        n_layer=27,
        n_embd=2304,
        n_head=32,
        n_value_head=32,
        head_size=128,
        value_head_size=128,
        intermediate_size=9216,
        norm_eps=1e-5,
        ring_len=16,
    ),
]

############
# Small sizes
############
_tiny = dict(
    block_size=64,
    vocab_size=64,
    padding_multiple=64,
    n_layer=2,
    n_embd=32,
    n_head=2,
    n_value_head=2,
    head_size=8,
    value_head_size=8,
    intermediate_size=64,
    ring_len=4,
)
configs.append(dict(_tiny, name="kimi-kda-tiny", hf_config=dict(org="litgpt-kda", name="kimi-kda-tiny")))
configs.append(
    dict(
        _tiny,
        name="kimi-kda-tiny-gqa",
        hf_config=dict(org="litgpt-kda", name="kimi-kda-tiny-gqa"),
        n_value_head=4,
        gate_lower_bound=-5.0,
    )
)

# Serving variants that keep the replay caches in bfloat16 whatever the weights are in:
# at 512 concurrent sequences the rings of a 48B model take more memory than its KV projections.
for c in list(configs):
    compact = deepcopy(c)
    compact["name"] = f"{c['name']}-compact"
    compact["hf_config"]["name"] = f"{c['hf_config']['name']}-compact"
    compact.update(cache_precision="bf16-true", logdecay_precision="bf16-true")  # expect-bug: imported-policy id=compact-logdecay
    configs.append(compact)

name_to_config = {config["name"]: config for config in configs}
