"""``Fabric`` (stand-in for ``lightning.fabric.Fabric``), single device.

``fabric.setup(model)`` converts the module with the precision plugin and wraps it so that its
forward runs under the plugin's forward context; ``fabric.init_module()`` and
``fabric.init_tensor()`` are the plugin's init contexts.
"""

from typing import Any, ContextManager, Dict, List, Optional, Union

import torch
from torch import nn

from pl_kda.lite.precision import Precision, _select_precision


class _FabricModule(nn.Module):
    """What ``setup`` returns: the converted module, called under the precision context."""

    def __init__(self, forward_module: nn.Module, precision: Precision) -> None:
        super().__init__()
        self._forward_module = forward_module
        self._precision = precision

    @property
    def module(self) -> nn.Module:
        return self._forward_module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = self._precision.convert_input((args, kwargs))
        with self._precision.forward_context():
            output = self._forward_module(*args, **kwargs)
        return self._precision.convert_output(output)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "_forward_module":
                raise
            return getattr(self._forward_module, name)


class Fabric:
    def __init__(
        self,
        accelerator: str = "cpu",
        devices: int = 1,
        precision: Any = "32-true",
        callbacks: Optional[List[Any]] = None,
    ) -> None:
        self._precision = _select_precision(precision)
        self._callbacks = list(callbacks or [])
        self.accelerator = accelerator
        self.device = torch.device("cpu")
        self.world_size = devices
        self.global_rank = 0

    @property
    def precision(self) -> str:
        return self._precision.precision

    def launch(self) -> None:
        pass

    def setup(self, module: nn.Module, move_to_device: bool = True) -> _FabricModule:
        module = self._precision.convert_module(module)
        if move_to_device:
            module = module.to(self.device)
        return _FabricModule(module, self._precision)

    def setup_dataloaders(self, *dataloaders: Any) -> Any:
        return dataloaders[0] if len(dataloaders) == 1 else dataloaders

    def init_module(self, empty_init: Optional[bool] = None) -> ContextManager:
        return self._precision.module_init_context()

    def init_tensor(self) -> ContextManager:
        return self._precision.tensor_init_context()

    def autocast(self) -> ContextManager:
        return self._precision.forward_context()

    def to_device(self, obj: Any) -> Any:
        if isinstance(obj, (torch.Tensor, nn.Module)):
            return obj.to(self.device)
        if isinstance(obj, dict):
            return {k: self.to_device(v) for k, v in obj.items()}
        return obj

    def call(self, hook_name: str, *args: Any, **kwargs: Any) -> None:
        for callback in self._callbacks:
            method = getattr(callback, hook_name, None)
            if callable(method):
                method(*args, **kwargs)

    def save(self, path: str, state: Dict[str, Any]) -> None:
        payload: Dict[str, Any] = {}
        for key, obj in state.items():
            payload[key] = obj.state_dict() if isinstance(obj, nn.Module) else obj
        torch.save(payload, path)

    def load(self, path: str, state: Optional[Dict[str, Any]] = None, strict: bool = True) -> Dict[str, Any]:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        if state is None:
            return checkpoint
        for key, obj in list(state.items()):
            if isinstance(obj, nn.Module):
                target = obj.module if isinstance(obj, _FabricModule) else obj
                target.load_state_dict(checkpoint.pop(key), strict=strict)
        return checkpoint
