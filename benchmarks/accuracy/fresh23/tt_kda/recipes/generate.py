# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

"""Generation recipe: load a Kimi Linear model, set up its decode caches and sample."""

from typing import Any, Dict, Optional

import torch
from torch import nn

from tt_kda import config, generation, training, utils
from tt_kda.config import DictConfig, OmegaConf
from tt_kda.generation import PrefixRingStore
from tt_kda.recipes.configs import GENERATION_TINY, GENERATION_TINY_FP32_DECAY


class InferenceRecipe:
    """Recipe for generating tokens from a Kimi Linear model.

    The model is built directly in the configured dtype and gets ReplaySSM decode caches for
    ``batch_size`` sequences. With ``prefix_cache`` set, the caches after each prompt are kept
    in a :class:`PrefixRingStore` so that a repeated prompt skips its prefill.
    """

    def __init__(self, cfg: DictConfig) -> None:
        self._device = utils.get_device(device=cfg.device)
        self._dtype = training.get_dtype(dtype=cfg.dtype, device=self._device)
        self._logger = utils.get_logger(cfg.get("log_level", "INFO"))
        self._seed = training.set_seed(seed=cfg.seed)
        self._prefix_store: Optional[PrefixRingStore] = None

    def setup(self, cfg: DictConfig) -> None:
        model_state_dict = None
        if cfg.get("checkpointer") is not None:
            checkpointer = config.instantiate(cfg.checkpointer)
            model_state_dict = checkpointer.load_checkpoint()[training.MODEL_KEY]
        self._model = self._setup_model(cfg_model=cfg.model, model_state_dict=model_state_dict)
        self._setup_caches(cfg)

    def _setup_model(
        self, cfg_model: DictConfig, model_state_dict: Optional[Dict[str, Any]]
    ) -> nn.Module:
        with training.set_default_dtype(self._dtype), self._device:
            model = config.instantiate(cfg_model)
        if model_state_dict is not None:
            model.load_state_dict(model_state_dict)
        training.validate_expected_param_dtype(model.named_parameters(), dtype=self._dtype)
        self._logger.info(f"Model is initialized with precision {self._dtype}.")
        return model.eval()

    def _setup_caches(self, cfg: DictConfig) -> None:
        decay_dtype = training.get_dtype(cfg.cache.decay_dtype, device=self._device)  # expect-bug: imported-policy id=cache-decay-dtype
        with training.set_default_dtype(self._dtype), self._device:
            self._model.setup_caches(
                batch_size=cfg.batch_size,
                dtype=self._dtype,
                decoder_max_seq_len=cfg.cache.max_seq_len,
                log_decay_dtype=decay_dtype,
            )
            if cfg.get("prefix_cache") is not None:
                self._prefix_store = PrefixRingStore.for_model(
                    self._model, capacity=cfg.prefix_cache.capacity, dtype=self._dtype
                )
        self._model.to(self._device)

    @torch.no_grad()
    def generate(self, cfg: DictConfig) -> torch.Tensor:
        prompt = torch.tensor(cfg.prompt_tokens, dtype=torch.long, device=self._device)
        rng = torch.Generator(device=self._device).manual_seed(self._seed)
        tokens, _ = generation.generate(
            self._model,
            prompt,
            max_generated_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            rng=rng,
        )
        if self._prefix_store is not None:
            for slot, row in enumerate(prompt.tolist()):
                self._prefix_store.insert(row, self._model, slot=slot)
        return tokens


def _run(content: Dict[str, Any]) -> InferenceRecipe:
    cfg = OmegaConf.create(content)
    recipe = InferenceRecipe(cfg)
    recipe.setup(cfg)
    recipe.tokens = recipe.generate(cfg)
    return recipe


def build_inference_recipe_bf16() -> Dict[str, object]:
    """The bf16 tiny generation config, with its prefix store."""
    recipe = _run(GENERATION_TINY)
    return {"model": recipe._model, "prefix_store": recipe._prefix_store, "tokens": recipe.tokens}


def build_inference_recipe_fp32_decay() -> Dict[str, object]:
    """The bf16 tiny generation config with the decay ring pinned to fp32."""
    recipe = _run(GENERATION_TINY_FP32_DECAY)
    return {"model": recipe._model, "tokens": recipe.tokens}
