"""``PeftModel``: a base model with adapters, their saving and loading, and KDA replay caches."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Union

import torch
from torch import nn

from .config import PeftConfig
from .mapping import PEFT_TYPE_TO_CONFIG_MAPPING, PEFT_TYPE_TO_TUNER_MAPPING
from .modeling_kda import KdaReplayCache, ReplayRings, replay_ring_shapes
from .utils import (
    KDA_RING_NAMES,
    REPLAY_CACHE_NAME,
    TaskType,
    _set_adapter,
    _set_trainable,
    get_peft_model_state_dict,
    get_replay_cache_state_dict,
    load_peft_weights,
    load_replay_cache_file,
    save_adapter_weights,
    save_replay_cache_file,
    set_peft_model_state_dict,
    set_replay_cache_state_dict,
)


class PeftModel(nn.Module):
    """Base model wrapped with adapters of one PEFT method.

    Args:
        model: the base model.
        peft_config: the config of the first adapter.
        adapter_name: its name.
        autocast_adapter_dtype: upcast bf16/fp16 adapter weights to float32.
        low_cpu_mem_usage: load adapter weights without copying them into freshly created ones.
    """

    def __init__(self, model: nn.Module, peft_config: PeftConfig, adapter_name: str = "default",
                 autocast_adapter_dtype: bool = True, low_cpu_mem_usage: bool = False) -> None:
        super().__init__()
        self.modules_to_save: Optional[set] = None
        self.active_adapter = adapter_name
        self.peft_type = peft_config.peft_type
        tuner_cls = PEFT_TYPE_TO_TUNER_MAPPING[peft_config.peft_type]
        self.base_model = tuner_cls(model, {adapter_name: peft_config}, adapter_name, low_cpu_mem_usage=low_cpu_mem_usage)
        self.set_additional_trainable_modules(peft_config, adapter_name)
        self.base_model._cast_adapter_dtype(adapter_name=adapter_name, autocast_adapter_dtype=autocast_adapter_dtype)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "base_model":
                raise
            return getattr(self.base_model, name)

    @property
    def peft_config(self) -> Dict[str, PeftConfig]:
        return self.base_model.peft_config

    @property
    def active_peft_config(self) -> PeftConfig:
        return self.peft_config[self.active_adapter]

    def get_base_model(self) -> nn.Module:
        return self.base_model.model

    def set_additional_trainable_modules(self, peft_config: PeftConfig, adapter_name: str) -> None:
        modules_to_save = getattr(peft_config, "modules_to_save", None)
        if modules_to_save:
            if self.modules_to_save is None:
                self.modules_to_save = set(modules_to_save)
            else:
                self.modules_to_save.update(modules_to_save)
            _set_trainable(self, adapter_name, module_names=modules_to_save)

    def add_adapter(self, adapter_name: str, peft_config: PeftConfig, low_cpu_mem_usage: bool = False) -> None:
        if peft_config.peft_type != self.peft_type:
            raise ValueError(f"Cannot combine adapters with different peft types. Found {self.peft_type} and {peft_config.peft_type}.")
        self.peft_config[adapter_name] = peft_config
        self.base_model.inject_adapter(self.base_model.model, adapter_name, low_cpu_mem_usage=low_cpu_mem_usage)
        self.set_additional_trainable_modules(peft_config, adapter_name)

    def set_adapter(self, adapter_name: str) -> None:
        if adapter_name not in self.peft_config:
            raise ValueError(f"Adapter {adapter_name} not found.")
        self.active_adapter = adapter_name
        self.base_model.set_adapter(adapter_name)
        _set_adapter(self, adapter_name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.base_model(*args, **kwargs)

    def save_pretrained(self, save_directory: str, safe_serialization: bool = True, selected_adapters: Optional[List[str]] = None,
                        save_replay_cache: bool = False) -> None:
        """Writes each adapter's weights and config (``default`` at the top, others in a subdirectory).

        ``save_replay_cache`` also writes the model's warm replay caches next to the adapter.
        """
        if os.path.isfile(save_directory):
            raise ValueError(f"Provided path ({save_directory}) should be a directory, not a file")
        os.makedirs(save_directory, exist_ok=True)
        for adapter_name in selected_adapters or list(self.peft_config):
            peft_config = self.peft_config[adapter_name]
            output_dir = save_directory if adapter_name == "default" else os.path.join(save_directory, adapter_name)
            os.makedirs(output_dir, exist_ok=True)
            save_adapter_weights(get_peft_model_state_dict(self, adapter_name=adapter_name), output_dir, safe_serialization=safe_serialization)
            if save_replay_cache:
                save_replay_cache_file(get_replay_cache_state_dict(self.get_base_model()), os.path.join(output_dir, REPLAY_CACHE_NAME))
            inference_mode = peft_config.inference_mode
            peft_config.inference_mode = True
            peft_config.save_pretrained(output_dir)
            peft_config.inference_mode = inference_mode

    @classmethod
    def from_pretrained(cls, model: nn.Module, model_id: str, adapter_name: str = "default", is_trainable: bool = False,
                        config: Optional[PeftConfig] = None, autocast_adapter_dtype: bool = True, low_cpu_mem_usage: bool = False,
                        torch_dtype: Optional[torch.dtype] = None, load_replay_cache: bool = True) -> "PeftModel":
        """Wraps ``model`` with the adapter saved in the directory ``model_id``.

        ``torch_dtype``: dtype of the loaded tensors (default: as saved). A replay cache saved with
        the adapter is restored into the model's caches when ``load_replay_cache``.
        """
        if config is None:
            config = PEFT_TYPE_TO_CONFIG_MAPPING[PeftConfig._get_peft_type(model_id)].from_pretrained(model_id)
        config.inference_mode = not is_trainable
        if cls is PeftModel and config.task_type in MODEL_TYPE_TO_PEFT_MODEL_MAPPING:
            cls = MODEL_TYPE_TO_PEFT_MODEL_MAPPING[config.task_type]
        peft_model = cls(model, config, adapter_name, autocast_adapter_dtype=autocast_adapter_dtype, low_cpu_mem_usage=low_cpu_mem_usage)
        peft_model.load_adapter(model_id, adapter_name, is_trainable=is_trainable, torch_dtype=torch_dtype,
                                autocast_adapter_dtype=autocast_adapter_dtype, low_cpu_mem_usage=low_cpu_mem_usage,
                                load_replay_cache=load_replay_cache)
        return peft_model

    def load_adapter(self, model_id: str, adapter_name: str, is_trainable: bool = False, torch_dtype: Optional[torch.dtype] = None,
                     autocast_adapter_dtype: bool = True, low_cpu_mem_usage: bool = False, load_replay_cache: bool = True):
        if adapter_name not in self.peft_config:
            peft_config = PEFT_TYPE_TO_CONFIG_MAPPING[PeftConfig._get_peft_type(model_id)].from_pretrained(model_id)
            peft_config.inference_mode = not is_trainable
            self.add_adapter(adapter_name, peft_config, low_cpu_mem_usage=low_cpu_mem_usage)
        adapters_weights = load_peft_weights(model_id, torch_dtype=torch_dtype)
        load_result = set_peft_model_state_dict(self, adapters_weights, adapter_name=adapter_name, low_cpu_mem_usage=low_cpu_mem_usage)
        cache_file = os.path.join(model_id, REPLAY_CACHE_NAME)
        if load_replay_cache and os.path.exists(cache_file):
            set_replay_cache_state_dict(self.get_base_model(), load_replay_cache_file(cache_file), torch_dtype=torch_dtype,
                                        low_cpu_mem_usage=low_cpu_mem_usage)
        self.base_model._cast_adapter_dtype(adapter_name=adapter_name, autocast_adapter_dtype=autocast_adapter_dtype)
        if not is_trainable:
            self.eval()
        return load_result


class PeftModelForCausalLM(PeftModel):
    """Causal LM with adapters; decoding runs on the base model's KDA replay caches or on a pool."""

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int = 2, caches: Optional[List[Any]] = None,
                 slot_mapping: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.get_base_model().generate(input_ids, max_new_tokens=max_new_tokens, caches=caches, slot_mapping=slot_mapping)

    def enable_replay_cache(self, num_slots: int, cache_implementation: Optional[str] = None) -> List[KdaReplayCache]:
        """Replay caches on the base model, with the ring dtypes of the active adapter's config."""
        base = self.get_base_model()
        ring_dtypes = self.active_peft_config.replay_ring_dtypes(base.dtype)
        return base.enable_replay_cache(num_slots, ring_dtypes=ring_dtypes, cache_implementation=cache_implementation)

    def init_replay_pool(self, num_slots: int, dtype: Optional[torch.dtype] = None) -> List[ReplayRings]:
        """Replay rings for ``num_slots`` sequences outside the model, one :class:`ReplayRings` per
        layer; pass them as ``caches=`` (e.g. one pool per adapter)."""
        base = self.get_base_model()
        dtype = dtype or base.dtype
        shapes = replay_ring_shapes(base.config)
        pool = []
        for _ in range(base.config.num_hidden_layers):
            rings = {name: torch.zeros(num_slots, *shapes[name], dtype=dtype) for name in KDA_RING_NAMES}  # expect-bug: pool-dtype
            pool.append(
                ReplayRings(
                    recurrent_state=torch.zeros(num_slots, *shapes["recurrent_state"], dtype=torch.float32),
                    write_pos=torch.zeros(num_slots, dtype=torch.int32),
                    **rings,
                )
            )
        return pool

    def set_adapter(self, adapter_name: str) -> None:
        super().set_adapter(adapter_name)
        # the rows in the rings were produced by the previous adapter's projections
        self._reset_replay_caches()

    def _reset_replay_caches(self) -> None:
        # fresh storage rather than zero_(): rings handed out earlier (pool views, offloads) keep their rows
        for cache in self.get_base_model().replay_caches():
            cache.recurrent_state = torch.zeros_like(cache.recurrent_state)
            cache.write_pos = torch.zeros_like(cache.write_pos)
            cache.delta_ring = torch.zeros_like(cache.delta_ring)
            cache.key_ring = torch.zeros_like(cache.key_ring)
            cache.log_decay_ring = cache.delta_ring.new_zeros(cache.log_decay_ring.shape)  # expect-bug: like


MODEL_TYPE_TO_PEFT_MODEL_MAPPING: Dict[Union[str, TaskType], type] = {TaskType.CAUSAL_LM: PeftModelForCausalLM}


def _base_model(dtype: torch.dtype, num_slots: Optional[int] = 2):
    from .modeling_kda import KdaConfig, KdaForCausalLM

    torch.manual_seed(0)
    model = KdaForCausalLM(KdaConfig()).to(dtype)
    if num_slots:
        model.enable_replay_cache(num_slots)
    return model


def _lora(**kwargs: Any):
    from .tuners.lora import LoraConfig

    kwargs.setdefault("target_modules", ["q_proj", "v_proj", "f_proj"])
    return LoraConfig(r=2, lora_alpha=4, init_lora_weights=False, **kwargs)


_PROMPT = torch.tensor([[3, 5, 7], [2, 4, 6]])


def build_peft_replay_cache() -> Dict[str, Any]:
    """LoRA (and a head copy) on a bf16 model, replay caches from the adapter config, three slots."""
    from .mapping import get_peft_model

    peft_model = get_peft_model(_base_model(torch.bfloat16, None), _lora(modules_to_save=["lm_head"]))
    peft_model.enable_replay_cache(3)
    tokens = peft_model.generate(_PROMPT, max_new_tokens=3, slot_mapping=torch.tensor([2, 0], dtype=torch.int32))
    return {"caches": peft_model.get_base_model().replay_caches(), "tokens": tokens}


def build_peft_replay_pool() -> Dict[str, Any]:
    """LoRA on a bf16 model decoding on a replay pool outside the model."""
    from .mapping import get_peft_model

    peft_model = get_peft_model(_base_model(torch.bfloat16, None), _lora())
    pool = peft_model.init_replay_pool(2)
    tokens = peft_model.generate(_PROMPT, max_new_tokens=3, caches=pool)
    return {"pool": pool, "tokens": tokens}


def build_compact_cache_adapter_switch() -> Dict[str, Any]:
    """Two adapters with compact replay rings on a bf16 model; decoding, switching, decoding."""
    from .mapping import get_peft_model

    peft_model = get_peft_model(_base_model(torch.bfloat16, None), _lora(compact_replay_cache=True), adapter_name="chat")
    peft_model.add_adapter("code", _lora(target_modules=["k_proj", "v_proj"], compact_replay_cache=True))
    peft_model.enable_replay_cache(2)
    peft_model.generate(_PROMPT, max_new_tokens=2)
    peft_model.set_adapter("code")
    tokens = peft_model.generate(torch.tensor([[1], [9]]), max_new_tokens=3)
    return {"caches": peft_model.get_base_model().replay_caches(), "tokens": tokens}


def _saved_adapter(tmp_dir: str) -> str:
    from .mapping import get_peft_model

    peft_model = get_peft_model(_base_model(torch.bfloat16), _lora(modules_to_save=["lm_head"]))
    peft_model.generate(_PROMPT, max_new_tokens=2)
    path = os.path.join(tmp_dir, "kda-lora")
    peft_model.save_pretrained(path, save_replay_cache=True)
    return path


def build_adapter_roundtrip(tmp_dir: str) -> Dict[str, Any]:
    """An adapter saved with its warm cache, loaded (bf16) onto a fresh bf16 model, decoding on."""
    path = _saved_adapter(tmp_dir)
    peft_model = PeftModelForCausalLM.from_pretrained(_base_model(torch.bfloat16), path, torch_dtype=torch.bfloat16)
    tokens = peft_model.generate(torch.tensor([[8], [1]]), max_new_tokens=3)
    return {"caches": peft_model.get_base_model().replay_caches(), "tokens": tokens}


def build_adapter_low_cpu_mem_load(tmp_dir: str) -> Dict[str, Any]:
    """As :func:`build_adapter_roundtrip`, loading with ``low_cpu_mem_usage``."""
    path = _saved_adapter(tmp_dir)
    peft_model = PeftModelForCausalLM.from_pretrained(_base_model(torch.bfloat16), path, torch_dtype=torch.bfloat16, low_cpu_mem_usage=True)
    tokens = peft_model.generate(torch.tensor([[8], [1]]), max_new_tokens=3)
    return {"caches": peft_model.get_base_model().replay_caches(), "tokens": tokens}
