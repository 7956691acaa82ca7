"""``ModelPT``: base class of the collections' models, with ``.nemo`` archive save and restore."""

import tarfile
import tempfile
from pathlib import Path

import torch
from torch import nn

from ..lightning.precision import torch_dtype_from_precision
from .config import DictConfig, OmegaConf

class ModelPT(nn.Module):
    model_config_yaml, model_weights_ckpt = "model_config.yaml", "model_weights.ckpt"

    def __init__(self, cfg: DictConfig, trainer=None) -> None:
        super().__init__()
        self.cfg, self.trainer = cfg, trainer

    def state_dict_for_save_checkpoint(self) -> dict:
        return self.state_dict()

    def save_artifacts(self, directory: Path) -> list[str]:  # extra archive members, written into ``directory``
        return []

    def on_restore_from(self, directory: Path) -> None:  # the extracted archive, after the weights are loaded
        pass

    def save_to(self, save_path: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            OmegaConf.save(self.cfg, tmp / self.model_config_yaml)
            torch.save(self.state_dict_for_save_checkpoint(), tmp / self.model_weights_ckpt)
            with tarfile.open(save_path, "w") as tar:
                for name in [self.model_config_yaml, self.model_weights_ckpt, *self.save_artifacts(tmp)]:
                    tar.add(tmp / name, arcname=name)

    @classmethod
    def restore_from(cls, restore_path: str, override_config_path: str | None = None, map_location=None,
                     strict: bool = True, trainer=None):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            with tarfile.open(restore_path, "r") as tar:
                tar.extractall(tmp, filter="data")
            instance = cls(OmegaConf.load(override_config_path or tmp / cls.model_config_yaml), trainer=trainer)
            state = torch.load(tmp / cls.model_weights_ckpt, map_location=map_location or "cpu", weights_only=True)
            instance.load_state_dict(state, strict=strict)
            if trainer is not None and trainer.precision.endswith("-true"):
                instance = instance.to(dtype=torch_dtype_from_precision(trainer.precision))  # expect-bug: module-cast
            instance.on_restore_from(tmp)
        return instance
