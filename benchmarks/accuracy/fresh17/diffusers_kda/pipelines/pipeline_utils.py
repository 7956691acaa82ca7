"""DiffusionPipeline: component registration, device/dtype handling and model CPU offloading."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

import torch
from torch import nn

from ..configuration_utils import ConfigMixin
from ..models.modeling_utils import ModelMixin
from ..utils import logging, progress_bar

logger = logging.get_logger(__name__)


class CpuOffloadHook:
    r"""Keeps a model on the offload device between pipeline calls and moves it to the execution
    device for its forward pass (an ``accelerate.cpu_offload_with_hook`` stand-in).

    Args:
        execution_device: where the module runs.
        offload_device: where it waits between calls.
        host_dtype (`torch.dtype`, *optional*): store the module's floating buffers in this dtype
            while offloaded, to save host memory; parameters are never converted.
    """

    def __init__(self, execution_device: Union[str, torch.device] = "cpu", offload_device: Union[str, torch.device] = "cpu", host_dtype: Optional[torch.dtype] = None) -> None:
        self.execution_device = torch.device(execution_device)
        self.offload_device = torch.device(offload_device)
        self.host_dtype = host_dtype
        self._handle = None

    def init_hook(self, module: nn.Module) -> nn.Module:
        self._handle = module.register_forward_pre_hook(self._pre_forward)
        return module

    def _pre_forward(self, module: nn.Module, args):
        self.onload(module)
        return None

    def onload(self, module: nn.Module) -> None:
        module.to(self.execution_device)

    def offload(self, module: nn.Module) -> None:
        if self.host_dtype is None:
            module.to(self.offload_device)
            return
        for owner in module.modules():
            for name, buffer in list(owner._buffers.items()):
                if buffer is None or not buffer.is_floating_point():
                    continue
                host = torch.empty(buffer.shape, dtype=self.host_dtype, device=self.offload_device)  # expect-bug: pool-dtype
                host.copy_(buffer)
                owner._buffers[name] = host
        for param in module.parameters():
            param.data = param.data.to(self.offload_device)

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


class DiffusionPipeline(ConfigMixin):
    r"""Base class for all pipelines.

    Class attributes:
        - **config_name** (`str`) -- file that stores the class and module names of the components.
        - **model_cpu_offload_seq** (`str`) -- ``"a->b"``: the order models run in, for CPU offloading.
        - **_optional_components** (`List[str]`) -- components that may be ``None``.
    """

    config_name = "model_index.json"
    model_cpu_offload_seq: Optional[str] = None
    _optional_components: List[str] = []

    def register_modules(self, **kwargs: Any) -> None:
        for name, module in kwargs.items():
            if module is None:
                register = {name: (None, None)}
            else:
                register = {name: (type(module).__module__.split(".")[0], type(module).__name__)}
            self.register_to_config(**register)
            setattr(self, name, module)

    @property
    def components(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in self.config.keys() if not name.startswith("_")}

    @property
    def device(self) -> torch.device:
        for component in self.components.values():
            if isinstance(component, nn.Module):
                return next(iter(component.parameters()), torch.empty(0)).device
        return torch.device("cpu")

    @property
    def _execution_device(self) -> torch.device:
        hooks = getattr(self, "_offload_hooks", None)
        if hooks:
            return next(iter(hooks.values())).execution_device
        return self.device

    @property
    def dtype(self) -> torch.dtype:
        for component in self.components.values():
            if isinstance(component, ModelMixin):
                return component.dtype
        return torch.float32

    def to(self, *args: Any, **kwargs: Any) -> "DiffusionPipeline":
        r"""Moves every module component: ``pipe.to("cpu")``, ``pipe.to(torch.float16)`` or
        ``pipe.to("cpu", torch.float16)``; ``device=``/``dtype=`` keywords work too."""
        device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
        for arg in args:
            if isinstance(arg, torch.dtype):
                dtype = arg
            else:
                device = arg
        for name, module in self.components.items():
            if not isinstance(module, nn.Module):
                continue
            module.to(device=device, dtype=dtype)  # expect-bug: module-cast
        return self

    def enable_model_cpu_offload(self, device: Union[str, torch.device] = "cpu", host_dtype: Optional[torch.dtype] = None) -> None:
        r"""Offloads the models in ``model_cpu_offload_seq`` to the CPU between calls; each one is
        moved to ``device`` when its ``forward`` runs."""
        self.remove_all_hooks()
        self._offload_hooks: Dict[str, CpuOffloadHook] = {}
        for name in (self.model_cpu_offload_seq or "").split("->"):
            module = getattr(self, name, None)
            if isinstance(module, nn.Module):
                hook = CpuOffloadHook(execution_device=device, host_dtype=host_dtype)
                self._offload_hooks[name] = hook
                hook.init_hook(module)

    def maybe_free_model_hooks(self) -> None:
        """Sends every hooked model back to the offload device after a call."""
        for name, hook in getattr(self, "_offload_hooks", {}).items():
            hook.offload(getattr(self, name))

    def remove_all_hooks(self) -> None:
        for hook in getattr(self, "_offload_hooks", {}).values():
            hook.remove()
        self._offload_hooks = {}

    def progress_bar(self, iterable):
        return progress_bar(iterable, disable=getattr(self, "_progress_bar_disable", True))

    def set_progress_bar_config(self, disable: bool = True) -> None:
        self._progress_bar_disable = disable
