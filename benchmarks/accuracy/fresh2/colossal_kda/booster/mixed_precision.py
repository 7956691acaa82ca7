from abc import ABC, abstractmethod
from functools import partial
from typing import Callable, Optional, Union

import torch
import torch.nn as nn

class ModelWrapper(nn.Module):
    """
    A wrapper class to define the common interface used by booster.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def unwrap(self) -> nn.Module:
        return self.module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


class AMPModelWrapper(ModelWrapper):
    def __init__(self, module: nn.Module, dtype: torch.dtype) -> None:
        super().__init__(module)
        self.autocast_dtype = dtype

    def forward(self, *args, **kwargs):
        with torch.autocast(device_type="cpu", dtype=self.autocast_dtype):
            return self.module(*args, **kwargs)


class MixedPrecision(ABC):
    """
    An abstract class for mixed precision training.
    """

    @abstractmethod
    def configure(self, model: nn.Module, optimizer=None, criterion: Optional[Callable] = None):
        pass


class FP16TorchMixedPrecision(MixedPrecision):
    """
    Precision for mixed precision training in FP16 using PyTorch AMP. Parameters and buffers keep
    their dtype, the forward pass runs under autocast.

    Args:
        dtype (torch.dtype): autocast dtype. Defaults to torch.float16.
    """

    def __init__(self, dtype: torch.dtype = torch.float16) -> None:
        self.dtype = dtype

    def configure(self, model: nn.Module, optimizer=None, criterion: Optional[Callable] = None):
        return AMPModelWrapper(model, self.dtype), optimizer, criterion


class NaiveMixedPrecision(MixedPrecision):
    """
    Runs the whole model in a low precision dtype (the ``fp16_naive`` and ``bf16`` precisions).

    Args:
        dtype (torch.dtype): the low precision dtype.
        keep_buffers_fp32 (bool): cast the parameters only; buffers (normalization statistics,
            recurrent states) keep their dtype. Defaults to False.
    """

    def __init__(self, dtype: torch.dtype = torch.float16, keep_buffers_fp32: bool = False) -> None:
        self.dtype = dtype
        self.keep_buffers_fp32 = keep_buffers_fp32

    def configure(self, model: nn.Module, optimizer=None, criterion: Optional[Callable] = None):
        if self.keep_buffers_fp32:
            for param in model.parameters():
                param.data = param.data.to(self.dtype)
        else:
            model = model.to(dtype=self.dtype)  # expect-bug: module-cast
        return ModelWrapper(model), optimizer, criterion


_mixed_precision_mapping = {
    "fp16": FP16TorchMixedPrecision,
    "bf16_amp": partial(FP16TorchMixedPrecision, dtype=torch.bfloat16),
    "fp16_naive": partial(NaiveMixedPrecision, dtype=torch.float16),
    "bf16": partial(NaiveMixedPrecision, dtype=torch.bfloat16),
}


class Booster:
    """
    Booster is a high-level API for training neural networks. It provides a unified interface for
    training with different precision, accelerator, and plugin.

    Args:
        device (str or torch.device): The device to run the training. Default: None.
        mixed_precision (str or MixedPrecision): The mixed precision to run the training. Default: None.
            If the argument is a string, it can be 'fp16', 'bf16_amp', 'fp16_naive' or 'bf16'.
    """

    def __init__(self, device: Optional[str] = None, mixed_precision: Union[MixedPrecision, str] = None) -> None:
        self.device = device
        if isinstance(mixed_precision, str):
            assert mixed_precision in _mixed_precision_mapping, f"The mixed precision {mixed_precision} is not supported."
            self.mixed_precision = _mixed_precision_mapping[mixed_precision]()
        else:
            self.mixed_precision = mixed_precision

    def boost(self, model: nn.Module, optimizer=None, criterion: Callable = None, dataloader=None, lr_scheduler=None):
        """
        Boost the model, optimizer, criterion, lr_scheduler, and dataloader.
        """
        if self.mixed_precision is not None:
            model, optimizer, criterion = self.mixed_precision.configure(model, optimizer, criterion)
        return model, optimizer, criterion, dataloader, lr_scheduler


def _boost_and_decode(mixed_precision) -> dict:
    from colossal_kda.inference.modeling.models.kimi_linear import KimiLinearConfig, KimiLinearForCausalLM
    from colossal_kda.kernel.kernel_loader import LAST_CALL

    model, *_ = Booster(mixed_precision=mixed_precision).boost(KimiLinearForCausalLM(KimiLinearConfig()))
    with torch.no_grad():
        model(torch.tensor([[2]]))
    return {"model": model, "decode": dict(LAST_CALL)}


def build_boosted_bf16():
    return _boost_and_decode("bf16")


def build_boosted_bf16_keep_buffers():
    return _boost_and_decode(NaiveMixedPrecision(torch.bfloat16, keep_buffers_fp32=True))


def build_boosted_bf16_amp():
    return _boost_and_decode("bf16_amp")
