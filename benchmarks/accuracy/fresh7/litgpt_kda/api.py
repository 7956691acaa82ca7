"""Python API for inference, after litgpt/api.py: ``LLM.load(...)``, ``llm.distribute(...)``, ``llm.generate(...)``."""

import json
from pathlib import Path
from typing import Literal, Optional

import torch

from . import utils
from .config import Config
from .generate.base import generate as generate_fn
from .model import GPT


class LLM(torch.nn.Module):
    def __init__(self, config: Config, checkpoint_dir: Optional[Path] = None) -> None:
        super().__init__()
        self.config, self.checkpoint_dir = config, checkpoint_dir
        self.model: Optional[GPT] = None
        self.kv_cache_initialized, self.fixed_kv_cache_size = False, None

    @classmethod
    def load(cls, model: str, init: Literal["pretrained", "random"] = "pretrained", checkpoint_dir: Optional[Path] = None,
             distribute: Optional[Literal["auto"]] = "auto") -> "LLM":
        if init == "pretrained":
            utils.check_valid_checkpoint_dir(checkpoint_dir)
        llm = cls(Config(**json.loads((checkpoint_dir / "model_config.json").read_text())), checkpoint_dir) if init == "pretrained" else cls(Config.from_name(model))
        if distribute == "auto":
            llm.distribute()
        return llm

    def distribute(self, accelerator: str = "cpu", devices: int = 1, precision: Optional[str] = None, fixed_kv_cache_size: Optional[int] = None) -> None:
        precision = precision or utils.get_default_supported_precision(training=False)
        fabric = utils.Fabric(accelerator=accelerator, devices=devices, precision=precision)
        with fabric.init_module(empty_init=(devices > 1)):
            model = GPT(self.config)
        if self.checkpoint_dir is not None:
            utils.load_checkpoint(fabric, model, self.checkpoint_dir / "lit_model.pth")
        if fixed_kv_cache_size is not None:
            # a fixed-size cache is allocated once, with the weights, so that the memory use is known up front
            model.set_kv_cache(batch_size=1, max_seq_length=fixed_kv_cache_size, device=fabric.device)
            self.kv_cache_initialized = True
        self.model = fabric.setup_module(model)  # expect-bug: module-cast
        self.fabric, self.fixed_kv_cache_size = fabric, fixed_kv_cache_size

    @torch.no_grad()
    def generate(self, prompt: list[int], max_new_tokens: int = 8, temperature: float = 0.0) -> list[int]:
        input_ids = torch.tensor([prompt], device=self.fabric.device)
        max_returned_tokens = input_ids.size(1) + max_new_tokens
        if not self.kv_cache_initialized:
            with self.fabric.init_tensor():
                self.model.max_seq_length = max_returned_tokens
                self.model.set_kv_cache(batch_size=1, device=self.fabric.device)
            self.kv_cache_initialized = True
        elif not self.fixed_kv_cache_size and max_returned_tokens > self.model.max_seq_length:
            # dynamically grow the kv cache size if necessary
            with self.fabric.init_tensor():  # expect-bug: default-dtype id=window-resize
                self.model.max_seq_length = max_returned_tokens
        for block in self.model.transformer.h:
            block.attn.kv_cache.reset_parameters()
        return generate_fn(self.model, input_ids, max_returned_tokens, temperature=temperature)[0].tolist()

    def offload_cache(self, dtype: torch.dtype = torch.bfloat16) -> None:
        """Moves the attached cache to host memory between requests, in ``dtype`` to halve the transfer."""
        for block in self.model.transformer.h:
            block.attn.kv_cache = block.attn.kv_cache.to("cpu", dtype=dtype)  # expect-bug: module-cast


def _distributed(precision: str = "bf16-true", fixed_kv_cache_size: Optional[int] = None) -> LLM:
    torch.manual_seed(0)
    llm = LLM.load("kda-tiny", init="random", distribute=None)
    llm.distribute(precision=precision, fixed_kv_cache_size=fixed_kv_cache_size)
    llm.generate([1], max_new_tokens=1)
    return llm


def build_llm(tmp_dir: str) -> dict:
    config, checkpoint_dir = Config.from_name("kda-tiny"), Path(tmp_dir)
    utils.save_config(config, checkpoint_dir)
    torch.manual_seed(0)
    torch.save(GPT(config).state_dict(), checkpoint_dir / "lit_model.pth")
    llm = LLM.load("kda-tiny", checkpoint_dir=checkpoint_dir)
    llm.generate([1, 2, 3], max_new_tokens=3)
    return {"llm": llm, "fixed": _distributed("bf16-mixed", fixed_kv_cache_size=4)}


def build_llm_serving() -> dict:
    fixed, chat, idle = _distributed(fixed_kv_cache_size=4), _distributed(), _distributed()
    chat.generate([1, 2, 3], max_new_tokens=3)
    idle.offload_cache()
    return {"fixed": fixed, "chat": chat, "idle": idle}
