"""Generation recipe (``recipes/generate.py`` layout): loads a checkpoint and sets up the
decode caches (and, optionally, a prefix cache for the shared system prompt)."""

import logging
from dataclasses import dataclass
from typing import Any

import torch

from . import training
from .model_builders import TransformerDecoder, kimi_linear_tiny

logger = logging.getLogger(__name__)

_MODEL_BUILDERS = {"kimi_linear_tiny": kimi_linear_tiny}


@dataclass
class PrefixCache:
    """One layer's rings after the shared system prompt; copied into each new request's cache."""

    state: torch.Tensor
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor


class InferenceRecipe:
    """Recipe for generating tokens from a Kimi-Linear model on a single device."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self._device = torch.device(cfg.get("device", "cpu"))
        self._dtype = training.get_dtype(dtype=cfg["dtype"], device=self._device)
        self.prefix_cache: list[PrefixCache] = []

    def setup(self, cfg: dict[str, Any]) -> None:
        checkpointer = training.FullModelTorchCheckpointer(**cfg["checkpointer"])
        ckpt_dict = checkpointer.load_checkpoint()
        self._model = self._setup_model(cfg["model"], ckpt_dict[training.MODEL_KEY])
        self._setup_caches(cfg)

    def _setup_model(self, model_name: str, model_state_dict: dict[str, Any]) -> TransformerDecoder:
        with training.set_default_dtype(self._dtype), self._device:
            model = _MODEL_BUILDERS[model_name]()
        model.load_state_dict(model_state_dict)
        logger.info(f"Model is initialized with precision {self._dtype}.")
        return model

    def _setup_caches(self, cfg: dict[str, Any]) -> None:
        with training.set_default_dtype(self._dtype), self._device:
            self._model.setup_caches(batch_size=cfg["batch_size"], dtype=self._dtype)
            if cfg.get("prefix_cache", False):
                self.prefix_cache = [
                    PrefixCache(
                        state=torch.zeros(cache.state.shape[1:], dtype=torch.float32),
                        d_cache=torch.zeros(cache.d_cache.shape[1:]),
                        k_cache=torch.zeros(cache.k_cache.shape[1:]),
                        g_cache=torch.zeros(cache.g_cache.shape[1:]),  # expect-bug: default-dtype
                    )
                    for cache in self._model.replay_caches()
                ]

    def load_prompt_cache(self, snapshot: dict[str, torch.Tensor]) -> list[PrefixCache]:
        """Per-layer prefix caches from a prompt-cache snapshot keyed ``layers.{i}.{buffer}``."""
        caches = []
        for i in range(len(self._model.layers)):
            d_cache = snapshot[f"layers.{i}.d_cache"].to(self._dtype)
            caches.append(
                PrefixCache(
                    state=snapshot[f"layers.{i}.state"].float(),
                    d_cache=d_cache,
                    k_cache=snapshot[f"layers.{i}.k_cache"].to(self._dtype),
                    g_cache=snapshot[f"layers.{i}.g_cache"].type_as(d_cache),  # expect-bug: cast
                )
            )
        return caches


class InferenceRecipeV2(InferenceRecipe):
    """The ``dev/generate_v2`` variant: cache dtypes come from ``training.get_cache_dtypes``."""

    def _setup_caches(self, cfg: dict[str, Any]) -> None:
        cache_dtypes = training.get_cache_dtypes(self._dtype)
        gate_dtype = cache_dtypes["g_cache"]  # expect-bug: imported-policy id=tune-cache-dtypes
        with self._device:
            self._model.setup_caches(
                batch_size=cfg["batch_size"], dtype=cache_dtypes["d_cache"], gate_dtype=gate_dtype
            )


def _recipe(
    tmp_dir: str, recipe_cls: type[InferenceRecipe] = InferenceRecipe, **overrides: Any
) -> InferenceRecipe:
    torch.save(kimi_linear_tiny().state_dict(), f"{tmp_dir}/model_0.pt")
    cfg = {
        "model": "kimi_linear_tiny",
        "dtype": "bf16",
        "batch_size": 2,
        "checkpointer": {"checkpoint_dir": tmp_dir, "checkpoint_files": ["model_0.pt"]},
        **overrides,
    }
    recipe = recipe_cls(cfg)
    recipe.setup(cfg)
    return recipe


def build_recipe_bf16(tmp_dir: str) -> dict[str, Any]:
    return {"model": _recipe(tmp_dir)._model}


def build_recipe_bf16_prefix_cache(tmp_dir: str) -> dict[str, Any]:
    recipe = _recipe(tmp_dir, prefix_cache=True)
    return {"model": recipe._model, "prefix_cache": recipe.prefix_cache}


def build_recipe_fp32_prefix_cache(tmp_dir: str) -> dict[str, Any]:
    recipe = _recipe(tmp_dir, dtype="fp32", prefix_cache=True)
    return {"model": recipe._model, "prefix_cache": recipe.prefix_cache}


def build_recipe_v2_bf16(tmp_dir: str) -> dict[str, Any]:
    return {"model": _recipe(tmp_dir, InferenceRecipeV2)._model}


def build_recipe_v2_fp32(tmp_dir: str) -> dict[str, Any]:
    return {"model": _recipe(tmp_dir, InferenceRecipeV2, dtype="fp32")._model}


def build_prompt_cache_from_snapshot(tmp_dir: str) -> dict[str, Any]:
    recipe = _recipe(tmp_dir)
    snapshot = {}
    for i in range(2):
        snapshot[f"layers.{i}.state"] = torch.randn(2, 4, 4)
        snapshot[f"layers.{i}.d_cache"] = torch.randn(2, 4, 4)
        snapshot[f"layers.{i}.k_cache"] = torch.randn(1, 4, 4)
        snapshot[f"layers.{i}.g_cache"] = -torch.rand(2, 4, 4)
    return {"prompt_cache": recipe.load_prompt_cache(snapshot)}
