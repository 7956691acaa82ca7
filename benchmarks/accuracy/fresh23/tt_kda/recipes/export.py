# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

"""Export recipe: a Kimi Linear model with its decode caches, and example inputs of the decode
op, all in the export dtype, ready for ``torch.export``."""

from typing import Any, Dict

import torch
from torch import nn

from tt_kda import config, training, utils
from tt_kda.config import DictConfig, OmegaConf
from tt_kda.recipes.configs import EXPORT_TINY


class ExportRecipe:
    """Prepares a model and the example inputs of one decode step for export.

    Export traces factory calls and constants in torch's default dtype, so the recipe sets it
    to the export dtype while it runs (restored by :meth:`cleanup`).
    """

    def __init__(self, cfg: DictConfig) -> None:
        self._device = utils.get_device(device=cfg.device)
        self._dtype = training.get_dtype(dtype=cfg.dtype, device=self._device)
        self._previous_dtype = torch.get_default_dtype()
        training.set_seed(seed=cfg.seed)

    def setup(self, cfg: DictConfig) -> None:
        torch.set_default_dtype(self._dtype)
        self._model = self._setup_model(
            cfg.model, batch_size=cfg.batch_size, max_seq_len=cfg.max_seq_len
        )
        self._example_inputs = self._decode_example_inputs(cfg.batch_size)

    def _setup_model(
        self, cfg_model: DictConfig, *, batch_size: int, max_seq_len: int
    ) -> nn.Module:
        with self._device:
            model = config.instantiate(cfg_model)
        model.setup_caches(batch_size, self._dtype, decoder_max_seq_len=max_seq_len)
        model.eval()
        # one dtype for the whole exported program
        model = model.to(device=self._device, dtype=self._dtype)  # expect-bug: module-cast
        return model

    def _decode_example_inputs(self, batch_size: int) -> Dict[str, Any]:
        shape = self._model.layers[0].attn.kv_cache.shape
        h, hv, k, v, ring = shape
        mixed_qkv = torch.randn(batch_size, 2 * h * k + hv * v)
        a, b = torch.randn(batch_size, hv * k), torch.randn(batch_size, hv)
        state = torch.zeros(shape.state(batch_size), dtype=torch.float32)
        d_cache = torch.zeros(batch_size, hv, ring, v)
        k_cache = torch.zeros(batch_size, h, ring, k)
        g_cache = torch.zeros(batch_size, hv, ring, k)  # expect-bug: default-dtype
        return {
            "mixed_qkv": mixed_qkv,
            "a": a,
            "b": b,
            "initial_state": state,
            "d_cache": d_cache,
            "k_cache": k_cache,
            "g_cache": g_cache,
            "ssm_state_indices": torch.arange(batch_size, dtype=torch.int32),
            "write_pos": torch.zeros(batch_size, dtype=torch.int32),
        }

    def cleanup(self) -> None:
        torch.set_default_dtype(self._previous_dtype)


def build_export_program() -> Dict[str, object]:
    """The tiny model and decode example inputs prepared for a bf16 export."""
    cfg = OmegaConf.create(EXPORT_TINY)
    recipe = ExportRecipe(cfg)
    try:
        recipe.setup(cfg)
        return {"model": recipe._model, "example_inputs": recipe._example_inputs}
    finally:
        recipe.cleanup()
