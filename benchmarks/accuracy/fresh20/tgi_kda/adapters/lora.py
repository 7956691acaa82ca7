"""Adapters served next to the base model: LoRA deltas and replay-state prefixes.

A replay-state prefix stores what a fixed system prompt leaves in the KDA caches (checkpoint
state and ring rows of every layer). Restoring it into a request's slot replaces prefilling the
prompt.
"""

import json
import math
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Union

import torch
from torch import nn

from ..layers.attention import ReplayCache, ReplaySpec
from ..models.globals import get_cache_dtype
from ..utils import Weights, save_file, set_default_dtype

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.pt"


@dataclass
class AdapterConfig:
    adapter_type: str
    base_model_name_or_path: str
    r: int = 8
    lora_alpha: int = 16
    target_modules: List[str] = field(default_factory=lambda: ["qkv_proj", "o_proj"])
    use_rslora: bool = False

    @classmethod
    def load(cls, adapter_dir) -> "AdapterConfig":
        with open(Path(adapter_dir) / ADAPTER_CONFIG) as f:
            return cls(**json.load(f))

    def save(self, adapter_dir):
        with open(Path(adapter_dir) / ADAPTER_CONFIG, "w") as f:
            json.dump(asdict(self), f)

    @property
    def scaling(self) -> float:
        if self.use_rslora:
            return self.lora_alpha / math.sqrt(self.r)
        return self.lora_alpha / self.r


class LoraLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, r: int, scaling: float, dtype=None, device=None):
        super().__init__()
        self.lora_a = nn.Parameter(torch.empty(r, in_features, dtype=dtype, device=device), requires_grad=False)
        self.lora_b = nn.Parameter(torch.empty(out_features, r, dtype=dtype, device=device), requires_grad=False)
        self.scaling = scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.lora_a.T @ self.lora_b.T) * self.scaling

    def delta_weight(self) -> torch.Tensor:
        return (self.lora_b.float() @ self.lora_a.float()) * self.scaling


class LoraWeights:
    """The LoRA pairs of one adapter, keyed by the base module they apply to."""

    def __init__(self, config: AdapterConfig, layers: nn.ModuleDict):
        self.config = config
        self.layers = layers

    @classmethod
    def load(cls, config: AdapterConfig, weights: Weights, base_model: nn.Module, dtype=None) -> "LoraWeights":
        layers = {}
        for name, module in base_model.named_modules():
            if name.rsplit(".", 1)[-1] not in config.target_modules:
                continue
            out_features, in_features = module.linear.weight.shape
            lora = LoraLinear(in_features, out_features, config.r, config.scaling, dtype=dtype, device=weights.device)
            lora.lora_a.data.copy_(weights.get_tensor(f"base_model.model.{name}.lora_A.weight"))
            lora.lora_b.data.copy_(weights.get_tensor(f"base_model.model.{name}.lora_B.weight"))
            layers[name.replace(".", "__")] = lora
        return cls(config, nn.ModuleDict(layers))

    def to(self, dtype: torch.dtype) -> "LoraWeights":
        self.layers.to(dtype)
        return self

    def base_modules(self, model: nn.Module):
        for key, lora in self.layers.items():
            yield model.get_submodule(key.replace("__", ".")).linear, lora


@torch.no_grad()
def merge_lora_weights(model: nn.Module, lora: LoraWeights):
    """Adds the adapter's deltas to the base weights, each in its own dtype."""
    for linear, layer in lora.base_modules(model):
        linear.weight += layer.delta_weight().to(dtype=linear.weight.dtype, device=linear.weight.device)


@torch.no_grad()
def fuse_lora_into_model(model: nn.Module, lora: LoraWeights):
    """Folds the adapter into the base weights with the sums formed in float32."""
    dtype = model.lm_head.linear.weight.dtype
    model.float()
    for linear, layer in lora.base_modules(model):
        linear.weight += layer.delta_weight().to(linear.weight.device)
    model.to(dtype)  # expect-bug: module-cast


@dataclass
class ReplayPrefixWeights:
    state: torch.Tensor
    delta_ring: torch.Tensor
    key_ring: torch.Tensor
    decay_ring: torch.Tensor
    write_pos: int

    @classmethod
    def load(cls, config: AdapterConfig, weights: Weights, spec: ReplaySpec, num_layers: int) -> "ReplayPrefixWeights":
        state = weights.get_tensor("replay_prefix.state")
        write_pos = int(weights.get_tensor("replay_prefix.write_pos"))
        if weights.has_tensor("replay_prefix.decay_ring"):
            delta_ring = weights.get_tensor("replay_prefix.delta_ring")
            key_ring = weights.get_tensor("replay_prefix.key_ring")
            decay_ring = weights.get_tensor("replay_prefix.decay_ring", to_dtype=False)
        else:
            # Prefixes exported right after a flush carry only the state: their rings are empty.
            delta_ring = torch.zeros((num_layers, *spec.delta_shape(1)[1:]), dtype=weights.dtype, device=weights.device)
            key_ring = torch.zeros((num_layers, *spec.key_shape(1)[1:]), dtype=weights.dtype, device=weights.device)
            decay_ring = torch.zeros((num_layers, *spec.decay_shape(1)[1:]), device=weights.device)  # expect-bug: default-dtype id=adapter-default-dtype
        return cls(state, delta_ring, key_ring, decay_ring, write_pos)


@dataclass
class ReplayPrefixBatch:
    """The prefixes of a batch's requests, stacked per layer ([num_layers, B, ...])."""

    state: torch.Tensor
    delta_ring: torch.Tensor
    key_ring: torch.Tensor
    decay_ring: torch.Tensor
    write_pos: torch.Tensor

    @classmethod
    def from_adapters(cls, adapters: Dict[str, ReplayPrefixWeights], adapter_ids: List[str], dtype: torch.dtype):
        prefixes = [adapters[adapter_id] for adapter_id in adapter_ids]
        cache_dtype = get_cache_dtype(dtype)
        state = torch.stack([p.state for p in prefixes], dim=1).to(cache_dtype)
        delta_ring = torch.stack([p.delta_ring for p in prefixes], dim=1).to(cache_dtype)
        key_ring = torch.stack([p.key_ring for p in prefixes], dim=1).to(cache_dtype)
        decay_ring = torch.stack([p.decay_ring for p in prefixes], dim=1).to(cache_dtype)  # expect-bug: imported-policy
        write_pos = torch.tensor([p.write_pos for p in prefixes], dtype=torch.int32, device=state.device)
        return cls(state, delta_ring, key_ring, decay_ring, write_pos)

    def install(self, caches: List[ReplayCache], slots: torch.Tensor):
        index = slots.long()
        for layer_id, cache in enumerate(caches):
            cache.state[index] = self.state[layer_id]
            cache.delta_ring[index] = self.delta_ring[layer_id]
            cache.key_ring[index] = self.key_ring[layer_id]
            cache.decay_ring[index] = self.decay_ring[layer_id]


def save_replay_prefix(caches: List[ReplayCache], slot: int, write_pos: int, adapter_dir, base_model: str):
    """Exports what a prompt left in ``slot`` as a replay-state prefix adapter."""
    tensors = {
        "replay_prefix.state": torch.stack([cache.state[slot] for cache in caches]),
        "replay_prefix.write_pos": torch.tensor(write_pos, dtype=torch.int32),
    }
    if write_pos > 0:
        for name in ("delta_ring", "key_ring", "decay_ring"):
            tensors[f"replay_prefix.{name}"] = torch.stack([getattr(cache, name)[slot] for cache in caches])
    save_file(tensors, Path(adapter_dir) / ADAPTER_WEIGHTS, metadata={"format": "pt"})
    AdapterConfig("replay_prefix", base_model).save(adapter_dir)


def load_adapters(model, adapter_dirs: Dict[str, Union[str, Path]]):
    """Loads the adapters the launcher was given; their modules are made in the model dtype."""
    adapters = {}
    with set_default_dtype(model.dtype):  # expect-bug: default-dtype id=adapter-default-dtype
        for adapter_id, folder in adapter_dirs.items():
            config = AdapterConfig.load(folder)
            weights = Weights([Path(folder) / ADAPTER_WEIGHTS], model.device, model.dtype, process_group=model.process_group)
            if config.adapter_type == "lora":
                adapters[adapter_id] = LoraWeights.load(config, weights, model.model)
            elif config.adapter_type == "replay_prefix":
                adapters[adapter_id] = ReplayPrefixWeights.load(config, weights, model.replay_spec, model.num_layers)
            else:
                raise ValueError(f"Unknown adapter type {config.adapter_type} for {adapter_id}")
    return adapters


def _save_random_lora(model: nn.Module, adapter_dir, base_model: str, seed: int = 0) -> AdapterConfig:
    config = AdapterConfig("lora", base_model, r=4, lora_alpha=8)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in config.target_modules:
            out_features, in_features = module.linear.weight.shape
            tensors[f"base_model.model.{name}.lora_A.weight"] = torch.randn(config.r, in_features, generator=generator) * 0.1
            tensors[f"base_model.model.{name}.lora_B.weight"] = torch.randn(out_features, config.r, generator=generator) * 0.1
    save_file(tensors, Path(adapter_dir) / ADAPTER_WEIGHTS)
    config.save(adapter_dir)
    return config


def build_lora_adapters():
    """A LoRA adapter loaded in the model dtype and merged layer by layer, then decoding."""
    from ..models.flash_causal_lm import _dummy_model, _pb

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        model = _dummy_model(Path(folder))
        model.init_kv_cache(2, model.num_layers, model.replay_spec, model.dtype, model.device)
        adapter_dir = Path(folder) / "lora"
        adapter_dir.mkdir()
        config = _save_random_lora(model.model, adapter_dir, folder)
        weights = Weights([adapter_dir / ADAPTER_WEIGHTS], model.device, model.dtype, process_group=model.process_group)
        lora = LoraWeights.load(config, weights, model.model, dtype=torch.float32).to(model.dtype)
        merge_lora_weights(model.model, lora)
        batch = model.batch_type.from_pb(_pb(0, {0: [4, 8, 15]}, {0: 1}), None, model.dtype, model.device)
        for _ in range(3):
            _, batch, _ = model.generate_token(batch)
        return {"lora": lora.layers, "kv_cache": model.kv_cache}


def build_adapted_model():
    """A LoRA fused into the base model and two replay-state prefixes restored into slots."""
    from ..models.flash_causal_lm import _dummy_model, _pb

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        model = _dummy_model(folder)
        model.init_kv_cache(4, model.num_layers, model.replay_spec, model.dtype, model.device)
        batch = model.batch_type.from_pb(_pb(0, {0: [1, 2, 3], 1: [9, 8, 7, 6]}, {0: 0, 1: 1}), None, model.dtype, model.device)
        _, batch, _ = model.generate_token(batch)
        for name in ("lora", "flushed", "support"):
            (folder / name).mkdir()
        save_replay_prefix(model.kv_cache, slot=1, write_pos=0, adapter_dir=folder / "flushed", base_model=str(folder))
        for _ in range(2):
            _, batch, _ = model.generate_token(batch)
        save_replay_prefix(model.kv_cache, slot=0, write_pos=int(batch.write_pos[0]), adapter_dir=folder / "support", base_model=str(folder))
        _save_random_lora(model.model, folder / "lora", str(folder))
        adapters = load_adapters(model, {name: folder / name for name in ("lora", "flushed", "support")})
        fuse_lora_into_model(model.model, adapters["lora"])
        prefixes = ReplayPrefixBatch.from_adapters(adapters, ["support", "flushed"], model.dtype)
        prefixes.install(model.kv_cache, torch.tensor([2, 3], dtype=torch.int32))
        return {
            "prefixes": {name: adapters[name] for name in ("flushed", "support")},
            "prefix_batch": prefixes,
            "kv_cache": model.kv_cache,
        }
