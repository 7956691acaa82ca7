"""ModelMixin: loading, saving, dtype/device bookkeeping and precision helpers for every model."""

from __future__ import annotations

import os
from typing import Callable, Dict, List, Optional, Tuple, Union

import torch
from torch import nn

from ..configuration_utils import ConfigMixin
from ..utils import SAFETENSORS_WEIGHTS_NAME, _add_variant, load_file, logging, save_file
from ..utils.torch_utils import torch_dtype_context

logger = logging.get_logger(__name__)


def get_parameter_device(parameter: nn.Module) -> torch.device:
    for param in parameter.parameters():
        return param.device
    for buffer in parameter.buffers():
        return buffer.device
    return torch.device("cpu")


def get_parameter_dtype(parameter: nn.Module) -> torch.dtype:
    """The dtype of the first floating-point parameter (buffers may be kept in another precision)."""
    last_dtype = None
    for param in parameter.parameters():
        last_dtype = param.dtype
        if param.is_floating_point():
            return param.dtype
    return last_dtype if last_dtype is not None else torch.get_default_dtype()


class ModelMixin(nn.Module):
    r"""Base class for all models.

    Class attributes:
        - **_keep_in_fp32_buffers** (`List[str]`) -- names of buffers (last path component) that stay
          in float32 whatever dtype the model is moved to with ``to``/``half``/``bfloat16``.
        - **_skip_layerwise_casting_patterns** (`Tuple[str]`) -- submodule names matching these are not
          touched by [`~ModelMixin.enable_layerwise_casting`].
    """

    config_name = "config.json"
    _keep_in_fp32_buffers: List[str] = []
    _skip_layerwise_casting_patterns: Optional[Tuple[str, ...]] = None
    _supports_gradient_checkpointing = False

    def __init__(self) -> None:
        super().__init__()

    @property
    def device(self) -> torch.device:
        return get_parameter_device(self)

    @property
    def dtype(self) -> torch.dtype:
        return get_parameter_dtype(self)

    def num_parameters(self, only_trainable: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not only_trainable)

    # -- precision -----------------------------------------------------------------------------

    def _buffer_owner(self, name: str) -> Tuple[nn.Module, str]:
        module_path, _, buffer_name = name.rpartition(".")
        return (self.get_submodule(module_path) if module_path else self), buffer_name

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True):
        kept = {
            name: buffer
            for name, buffer in self.named_buffers()
            if name.rpartition(".")[2] in self._keep_in_fp32_buffers and buffer.dtype == torch.float32
        }
        super()._apply(fn, recurse)
        for name, buffer in kept.items():
            owner, buffer_name = self._buffer_owner(name)
            target = fn(torch.empty(0, dtype=buffer.dtype, device=buffer.device))
            owner._buffers[buffer_name] = buffer.to(device=target.device)
        return self

    def enable_layerwise_casting(
        self,
        storage_dtype: torch.dtype = torch.bfloat16,
        compute_dtype: Optional[torch.dtype] = None,
    ) -> None:
        r"""Stores the weights of every leaf module in ``storage_dtype`` and upcasts them to
        ``compute_dtype`` (default: the current dtype) only while that module runs."""
        compute_dtype = compute_dtype or self.dtype
        skip = self._skip_layerwise_casting_patterns or ()
        for name, module in self.named_modules():
            if not name or any(pattern in name for pattern in skip) or next(module.children(), None) is not None:
                continue
            module.to(dtype=storage_dtype)  # expect-bug: module-cast
            if type(module).forward is not nn.Module.forward:
                module.register_forward_pre_hook(_LayerwiseUpcast(compute_dtype))
                module.register_forward_hook(_LayerwiseDowncast(storage_dtype))
        self._layerwise_casting = (storage_dtype, compute_dtype)

    # -- serialization -------------------------------------------------------------------------

    def save_pretrained(self, save_directory: Union[str, os.PathLike], variant: Optional[str] = None) -> None:
        """Saves the config and the persistent weights (``state_dict``) under ``save_directory``."""
        os.makedirs(save_directory, exist_ok=True)
        self.save_config(save_directory)
        state_dict = {name: tensor.detach().cpu() for name, tensor in self.state_dict().items()}
        save_file(state_dict, os.path.join(save_directory, _add_variant(SAFETENSORS_WEIGHTS_NAME, variant)), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: Union[str, os.PathLike],
        torch_dtype: Optional[torch.dtype] = None,
        low_cpu_mem_usage: bool = False,
        variant: Optional[str] = None,
        subfolder: Optional[str] = None,
        **kwargs,
    ) -> "ModelMixin":
        r"""Instantiates a model from a folder written by [`~ModelMixin.save_pretrained`].

        Args:
            torch_dtype (`torch.dtype`, *optional*): the dtype to load the model in.
            low_cpu_mem_usage (`bool`): create the modules directly in ``torch_dtype`` instead of
                creating them in float32 and converting them afterwards.
        """
        folder = os.fspath(pretrained_model_name_or_path)
        if subfolder is not None:
            folder = os.path.join(folder, subfolder)
        config = cls.load_config(folder)
        if low_cpu_mem_usage and torch_dtype is not None:
            with torch_dtype_context(torch_dtype):  # expect-bug: default-dtype id=lowmem-init
                model = cls.from_config(config, **kwargs)
        else:
            model = cls.from_config(config, **kwargs)
        state_dict = load_file(os.path.join(folder, _add_variant(SAFETENSORS_WEIGHTS_NAME, variant)))
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
        if unexpected:
            logger.warning("Some weights of the checkpoint were not used: %s", unexpected)
        if missing:
            logger.info("Some weights of %s were newly initialized: %s", cls.__name__, missing)
        if torch_dtype is not None and not low_cpu_mem_usage:
            model = model.to(torch_dtype)
        model.eval()
        return model


class _LayerwiseUpcast:
    def __init__(self, compute_dtype: torch.dtype) -> None:
        self.compute_dtype = compute_dtype

    def __call__(self, module: nn.Module, args):
        for param in module.parameters(recurse=False):
            param.data = param.data.to(self.compute_dtype)
        return tuple(arg.to(self.compute_dtype) if torch.is_tensor(arg) and arg.is_floating_point() else arg for arg in args)


class _LayerwiseDowncast:
    def __init__(self, storage_dtype: torch.dtype) -> None:
        self.storage_dtype = storage_dtype

    def __call__(self, module: nn.Module, args, output):
        for param in module.parameters(recurse=False):
            param.data = param.data.to(self.storage_dtype)
        return output


def load_state_dict_into_model(model: nn.Module, state_dict: Dict[str, torch.Tensor]) -> List[str]:
    """Copies ``state_dict`` into the existing tensors of ``model`` (each keeps its dtype); returns
    the names that were not found."""
    own = dict(model.state_dict(keep_vars=True))
    missing = []
    with torch.no_grad():
        for name, value in state_dict.items():
            if name in own:
                own[name].copy_(value)
            else:
                missing.append(name)
    return missing
