"""Base class of the injected operators.

An injected operator wraps the module it replaces (``orig_module``, registered as a child so its
parameters stay visible), keeps the loader and the device split it was injected with, and forwards
attribute lookups it does not answer itself to the original module.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..compat import PretrainedConfig
from ..util.custom_gguf import GGUFLoader
from ..util.utils import load_weights


class BaseInjectedModule(nn.Module):
    def __init__(
        self,
        key: str,
        gguf_loader: GGUFLoader,
        config: PretrainedConfig,
        orig_module: nn.Module,
        prefill_device: str = "cpu",
        generate_device: str = "cpu",
        **kwargs: Any,
    ) -> None:
        nn.Module.__init__(self)
        nn.Module.__setattr__(self, "orig_module", orig_module)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "gguf_loader", gguf_loader)
        object.__setattr__(self, "config", config)
        object.__setattr__(self, "prefill_device", prefill_device)
        object.__setattr__(self, "generate_device", generate_device)
        object.__setattr__(self, "device", generate_device)
        object.__setattr__(self, "inject_kwargs", dict(kwargs))

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            orig_module = super().__getattr__("orig_module")
            return getattr(orig_module, name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.orig_module.forward(*args, **kwargs)

    def load(self) -> None:
        """Materialises the original module's weights from the GGUF archive (``key`` is its HF name)."""
        load_weights(self.orig_module, self.gguf_loader, self.key + ".", device=self.generate_device)
