"""LightningModule, LightningDataModule, Callback and a single-process Trainer (stand-ins).

Only what the project needs: hyperparameters, the device/dtype bookkeeping of a module, the
``validate``/``predict`` loops with their hooks, and ``.ckpt`` save/restore.
"""

import copy
import inspect
import os
from typing import Any, Dict, Iterable, List, Optional, Sequence

import torch
from torch import nn

from pl_kda.lite.precision import Precision, _select_precision

PL_VERSION = "2.5.1"


class AttributeDict(dict):
    """A dict whose keys are also attributes (``hparams.max_slots``)."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as error:
            raise AttributeError(key) from error

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


def _init_args(frame: Any, cls: type) -> Dict[str, Any]:
    """The arguments of ``cls.__init__`` as seen in its running frame."""
    names = [name for name in inspect.signature(cls.__init__).parameters if name != "self"]
    local_vars = frame.f_locals
    init_args: Dict[str, Any] = {}
    for name in names:
        if name in local_vars:
            init_args[name] = local_vars[name]
    kwargs = inspect.signature(cls.__init__).parameters
    for name, param in kwargs.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD and name in local_vars:
            init_args.pop(name, None)
            init_args.update(local_vars[name])
    return init_args


class HyperparametersMixin:
    """``save_hyperparameters()`` and ``hparams``."""

    def save_hyperparameters(self, *args: str, ignore: Optional[Sequence[str]] = None, frame: Any = None) -> None:
        frame = frame or inspect.currentframe().f_back
        init_args = _init_args(frame, type(self))
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        selected = {k: v for k, v in init_args.items() if k not in ignored and (not args or k in args)}
        self._hparams = AttributeDict(selected)
        self._hparams_initial = copy.deepcopy(self._hparams)

    @property
    def hparams(self) -> AttributeDict:
        if not hasattr(self, "_hparams"):
            self._hparams = AttributeDict()
        return self._hparams

    @property
    def hparams_initial(self) -> AttributeDict:
        return AttributeDict(copy.deepcopy(getattr(self, "_hparams_initial", {})))


class _DeviceDtypeModuleMixin(nn.Module):
    """Tracks the device and dtype a module was last moved or cast to (``self.dtype``)."""

    def __init__(self) -> None:
        super().__init__()
        self._dtype = torch.get_default_dtype()
        self._device = torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return self._device

    def _update_properties(self, device: Any = None, dtype: Optional[torch.dtype] = None) -> None:
        def apply(module: nn.Module) -> None:
            if isinstance(module, _DeviceDtypeModuleMixin):
                if device is not None:
                    module._device = torch.device(device)
                if dtype is not None:
                    module._dtype = dtype

        self.apply(apply)

    def to(self, *args: Any, **kwargs: Any) -> "_DeviceDtypeModuleMixin":
        device, dtype = kwargs.get("device"), kwargs.get("dtype")
        for arg in args:
            if isinstance(arg, torch.dtype):
                dtype = arg
            elif isinstance(arg, (str, torch.device)):
                device = arg
            elif isinstance(arg, torch.Tensor):
                device, dtype = arg.device, arg.dtype
        self._update_properties(device=device, dtype=dtype)
        return super().to(*args, **kwargs)

    def half(self) -> "_DeviceDtypeModuleMixin":
        self._update_properties(dtype=torch.float16)
        return super().half()

    def bfloat16(self) -> "_DeviceDtypeModuleMixin":
        self._update_properties(dtype=torch.bfloat16)
        return super().bfloat16()

    def float(self) -> "_DeviceDtypeModuleMixin":
        self._update_properties(dtype=torch.float32)
        return super().float()


class LightningModule(_DeviceDtypeModuleMixin, HyperparametersMixin):
    """Hooks and the trainer reference of a LightningModule."""

    def __init__(self) -> None:
        super().__init__()
        self._trainer: Optional["Trainer"] = None
        self._logged: Dict[str, float] = {}

    @property
    def trainer(self) -> "Trainer":
        if self._trainer is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a `Trainer`.")
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: Optional["Trainer"]) -> None:
        self._trainer = trainer

    def log(self, name: str, value: Any, **kwargs: Any) -> None:
        self._logged[name] = float(value)

    # hooks ------------------------------------------------------------------------------------
    def configure_model(self) -> None:
        pass

    def on_save_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        pass

    def on_load_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        pass

    def on_validation_start(self) -> None:
        pass

    def on_validation_end(self) -> None:
        pass

    def on_predict_start(self) -> None:
        pass

    def on_predict_epoch_start(self) -> None:
        pass

    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        pass

    def on_predict_end(self) -> None:
        pass

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        raise NotImplementedError

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        raise NotImplementedError

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: str, map_location: Any = "cpu", **kwargs: Any) -> "LightningModule":
        checkpoint = torch.load(checkpoint_path, map_location=map_location, weights_only=True)
        hparams = dict(checkpoint.get("hyper_parameters", {}))
        hparams.update(kwargs)
        model = cls(**hparams)
        model.configure_model()
        model.on_load_checkpoint(checkpoint)
        model.load_state_dict(checkpoint["state_dict"])
        return model


class LightningDataModule(HyperparametersMixin):
    """``prepare_data``/``setup`` and the dataloaders."""

    def __init__(self) -> None:
        self.trainer: Optional["Trainer"] = None

    def prepare_data(self) -> None:
        pass

    def setup(self, stage: str) -> None:
        pass

    def val_dataloader(self) -> Iterable[Any]:
        return []

    def predict_dataloader(self) -> Iterable[Any]:
        return []

    def teardown(self, stage: str) -> None:
        pass


class Callback:
    """No-op hooks; subclasses override the ones they need."""

    @property
    def state_key(self) -> str:
        return type(self).__qualname__

    def state_dict(self) -> Dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        pass

    def on_validation_start(self, trainer: "Trainer", pl_module: LightningModule) -> None:
        pass

    def on_validation_batch_start(self, trainer: "Trainer", pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        pass

    def on_validation_end(self, trainer: "Trainer", pl_module: LightningModule) -> None:
        pass

    def on_predict_start(self, trainer: "Trainer", pl_module: LightningModule) -> None:
        pass

    def on_predict_epoch_start(self, trainer: "Trainer", pl_module: LightningModule) -> None:
        pass

    def on_predict_batch_start(self, trainer: "Trainer", pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        pass

    def on_predict_batch_end(self, trainer: "Trainer", pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        pass

    def on_predict_end(self, trainer: "Trainer", pl_module: LightningModule) -> None:
        pass

    def on_save_checkpoint(self, trainer: "Trainer", pl_module: LightningModule, checkpoint: Dict[str, Any]) -> None:
        pass

    def on_load_checkpoint(self, trainer: "Trainer", pl_module: LightningModule, checkpoint: Dict[str, Any]) -> None:
        pass


class Trainer:
    """A single-device Trainer with the validate and predict loops."""

    def __init__(
        self,
        precision: Any = "32-true",
        callbacks: Optional[List[Callback]] = None,
        default_root_dir: Optional[str] = None,
        limit_val_batches: Optional[int] = None,
        limit_predict_batches: Optional[int] = None,
        accelerator: str = "cpu",
        devices: int = 1,
    ) -> None:
        self.precision_plugin: Precision = _select_precision(precision)
        self.callbacks: List[Callback] = list(callbacks or [])
        self.default_root_dir = default_root_dir or os.getcwd()
        self.limit_val_batches = limit_val_batches
        self.limit_predict_batches = limit_predict_batches
        self.accelerator = accelerator
        self.lightning_module: Optional[LightningModule] = None
        self.datamodule: Optional[LightningDataModule] = None
        self.current_epoch = 0
        self.global_step = 0
        self.validating = False
        self.predicting = False

    @property
    def precision(self) -> str:
        return self.precision_plugin.precision

    # plumbing ---------------------------------------------------------------------------------
    def _call_callback_hooks(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(self, self.lightning_module, *args)

    def _call_lightning_module_hook(self, hook: str, *args: Any) -> Any:
        return getattr(self.lightning_module, hook)(*args)

    def _setup(self, model: LightningModule, datamodule: Optional[LightningDataModule], stage: str, ckpt_path: Optional[str]) -> None:
        model.trainer = self
        self.lightning_module = model
        if datamodule is not None:
            datamodule.trainer = self
            self.datamodule = datamodule
            datamodule.prepare_data()
            datamodule.setup(stage)
        with self.precision_plugin.module_init_context():
            model.configure_model()
        self.lightning_module = self.precision_plugin.convert_module(model)
        if ckpt_path is not None:
            self._restore(ckpt_path)

    def _restore(self, ckpt_path: str) -> None:
        checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        self._call_lightning_module_hook("on_load_checkpoint", checkpoint)
        self.lightning_module.load_state_dict(checkpoint["state_dict"])
        for callback in self.callbacks:
            callback.on_load_checkpoint(self, self.lightning_module, checkpoint)
            state = checkpoint.get("callbacks", {}).get(callback.state_key)
            if state is not None:
                callback.load_state_dict(state)
        self.global_step = checkpoint.get("global_step", 0)
        self.current_epoch = checkpoint.get("epoch", 0)

    def _limited(self, batches: Iterable[Any], limit: Optional[int]) -> Iterable[Any]:
        for index, batch in enumerate(batches):
            if limit is not None and index >= limit:
                return
            yield batch

    # loops ------------------------------------------------------------------------------------
    def validate(self, model: LightningModule, datamodule: Optional[LightningDataModule] = None, ckpt_path: Optional[str] = None) -> List[Dict[str, float]]:
        self._setup(model, datamodule, "validate", ckpt_path)
        module = self.lightning_module
        self.validating = True
        self._call_callback_hooks("on_validation_start")
        self._call_lightning_module_hook("on_validation_start")
        module.eval()
        with torch.no_grad():
            for batch_idx, batch in enumerate(self._limited(self.datamodule.val_dataloader(), self.limit_val_batches)):
                batch = self.precision_plugin.convert_input(batch)
                self._call_callback_hooks("on_validation_batch_start", batch, batch_idx, 0)
                with self.precision_plugin.forward_context():
                    module.validation_step(batch, batch_idx)
        self._call_callback_hooks("on_validation_end")
        self._call_lightning_module_hook("on_validation_end")
        self.validating = False
        return [dict(module._logged)]

    def predict(self, model: LightningModule, datamodule: Optional[LightningDataModule] = None, ckpt_path: Optional[str] = None, return_predictions: bool = True) -> Optional[List[Any]]:
        self._setup(model, datamodule, "predict", ckpt_path)
        module = self.lightning_module
        self.predicting = True
        self._call_callback_hooks("on_predict_start")
        self._call_lightning_module_hook("on_predict_start")
        self._call_callback_hooks("on_predict_epoch_start")
        self._call_lightning_module_hook("on_predict_epoch_start")
        module.eval()
        predictions = []
        with torch.no_grad():
            for batch_idx, batch in enumerate(self._limited(self.datamodule.predict_dataloader(), self.limit_predict_batches)):
                batch = self.precision_plugin.convert_input(batch)
                self._call_callback_hooks("on_predict_batch_start", batch, batch_idx, 0)
                self._call_lightning_module_hook("on_predict_batch_start", batch, batch_idx, 0)
                with self.precision_plugin.forward_context():
                    output = module.predict_step(batch, batch_idx)
                output = self.precision_plugin.convert_output(output)
                self._call_callback_hooks("on_predict_batch_end", output, batch, batch_idx, 0)
                predictions.append(output)
        self._call_callback_hooks("on_predict_end")
        self._call_lightning_module_hook("on_predict_end")
        self.predicting = False
        return predictions if return_predictions else None

    def save_checkpoint(self, filepath: str) -> None:
        module = self.lightning_module
        checkpoint: Dict[str, Any] = {
            "epoch": self.current_epoch,
            "global_step": self.global_step,
            "pytorch-lightning_version": PL_VERSION,
            "state_dict": module.state_dict(),
            "hyper_parameters": dict(module.hparams),
            "precision_plugin": self.precision_plugin.state_dict(),
            "callbacks": {},
        }
        for callback in self.callbacks:
            checkpoint["callbacks"][callback.state_key] = callback.state_dict()
            callback.on_save_checkpoint(self, module, checkpoint)
        module.on_save_checkpoint(checkpoint)
        os.makedirs(os.path.dirname(os.path.abspath(filepath)), exist_ok=True)
        torch.save(checkpoint, filepath)
