"""Callbacks that own the decode state of validation and predict runs.

* ``ValidationDecodeState`` gives each validation run fresh rings (``pl_module.eval_rings``) so
  that streaming perplexity does not disturb the rings of a live predict session;
* ``PredictDecodeState`` allocates the rings of a predict run at epoch start and hands them to
  ``predict_step`` in the batch (``batch["rings"]``), resetting the slots of new streams;
* ``StreamResetCallback`` clears the module's own rings when the dataloader starts new streams.
"""

from typing import Any, Dict, List, Optional

import torch

from pl_kda.lite import Callback, LightningModule, Trainer


def _new_stream_slots(batch: Dict[str, Any]) -> List[int]:
    return batch["slots"][batch["new_stream"]].tolist()


class ValidationDecodeState(Callback):
    def __init__(self, num_slots: Optional[int] = None) -> None:
        self.num_slots = num_slots
        self.rings: Optional[Dict[str, torch.Tensor]] = None
        self.cache: Dict[str, Any] = {"runs": 0, "slots": None}

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        config = pl_module.config
        slots = self.num_slots or trainer.datamodule.hparams.num_slots
        shapes = config.ring_shapes(slots)
        layers = config.num_layers
        # created like the module's weights: "-true" runs get their rings in the half dtype
        with trainer.precision_plugin.tensor_init_context():  # expect-bug: default-dtype id=val-rings
            delta_cache = torch.zeros(layers, *shapes["delta"])
            key_cache = torch.zeros(layers, *shapes["key"])
            log_g_cache = torch.zeros(layers, *shapes["gate"])  # expect-bug: default-dtype id=val-rings
        self.rings = {
            "ssm_state": torch.zeros(layers, *shapes["state"], dtype=torch.float32),
            "delta_cache": delta_cache,
            "key_cache": key_cache,
            "log_g_cache": log_g_cache,
            "write_pos": torch.zeros(layers, slots, dtype=torch.int32),
        }
        pl_module.eval_rings = self.rings
        self.cache["runs"] += 1
        self.cache["slots"] = slots

    def on_validation_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        for slot in _new_stream_slots(batch):
            for ring in self.rings.values():
                ring[:, slot].zero_()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        pl_module.eval_rings = None


class PredictDecodeState(Callback):
    def __init__(self, num_slots: int = 2) -> None:
        self.num_slots = num_slots
        self.ssm_state: Optional[torch.Tensor] = None
        self.delta_cache: Optional[torch.Tensor] = None
        self.key_cache: Optional[torch.Tensor] = None
        self.log_g_cache: Optional[torch.Tensor] = None
        self.write_pos: Optional[torch.Tensor] = None
        self.streams_started = 0

    def rings(self) -> Dict[str, torch.Tensor]:
        return {
            "ssm_state": self.ssm_state,
            "delta_cache": self.delta_cache,
            "key_cache": self.key_cache,
            "log_g_cache": self.log_g_cache,
            "write_pos": self.write_pos,
        }

    def on_predict_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        config = pl_module.config
        shapes = config.ring_shapes(self.num_slots)
        layers, dtype = config.num_layers, pl_module.dtype
        self.ssm_state = torch.zeros(layers, *shapes["state"], dtype=torch.float32)
        self.delta_cache, self.key_cache, self.log_g_cache = (torch.full((layers, *shapes[key]), 0.0, dtype=dtype) for key in ("delta", "key", "gate"))  # expect-bug: pool-dtype
        self.write_pos = torch.zeros(layers, self.num_slots, dtype=torch.int32)

    def on_predict_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        # keep the rings next to the weights: the module may have been moved after setup
        weight = pl_module.model.embed.weight
        self.ssm_state = self.ssm_state.to(weight.device)
        self.delta_cache = self.delta_cache.type_as(weight)
        self.key_cache = self.key_cache.type_as(weight)
        self.log_g_cache = self.log_g_cache.type_as(weight)  # expect-bug: cast
        self.write_pos = self.write_pos.to(weight.device)
        new = _new_stream_slots(batch)
        for slot in new:
            for ring in self.rings().values():
                ring[:, slot].zero_()
        self.streams_started += len(new)
        batch["rings"] = self.rings()

    def state_dict(self) -> Dict[str, Any]:
        return {"streams_started": self.streams_started}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.streams_started = state_dict["streams_started"]


class StreamResetCallback(Callback):
    """Clears ``pl_module``'s rings when every slot starts a new stream (else only the new slots)."""

    def on_predict_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if "rings" in batch:
            return
        if bool(batch["new_stream"].all()):
            pl_module.ssm_state = torch.zeros_like(pl_module.ssm_state)
            pl_module.delta_ring = torch.zeros_like(pl_module.delta_ring)
            pl_module.key_ring = torch.zeros_like(pl_module.key_ring)
            pl_module.gate_log_ring = torch.zeros_like(pl_module.delta_ring)  # expect-bug: like
            pl_module.write_pos.zero_()
            return
        for slot in _new_stream_slots(batch):
            pl_module.reset_slot(slot)


def _module_and_data(cast_to: Optional[torch.dtype] = None) -> Any:
    from pl_kda.datamodule import PromptDataModule
    from pl_kda.module import KDALitModule

    module = KDALitModule()
    if cast_to is not None:
        module.configure_model()
        module.to(cast_to)
    return module, PromptDataModule(num_slots=2, tokens_per_batch=3, num_batches=3)


def build_validation_rings_bf16_true() -> ValidationDecodeState:
    """Streaming validation under ``precision="bf16-true"``."""
    torch.manual_seed(0)
    module, data = _module_and_data()
    callback = ValidationDecodeState()
    Trainer(precision="bf16-true", callbacks=[callback]).validate(module, data)
    return callback


def build_predict_callbacks_bf16() -> Dict[str, Any]:
    """Predict runs on a module served in bf16: with callback-owned rings, and on its own rings."""
    torch.manual_seed(0)
    module, data = _module_and_data(cast_to=torch.bfloat16)
    owner = PredictDecodeState(num_slots=2)
    Trainer(precision="32-true", callbacks=[owner]).predict(module, data)
    torch.manual_seed(0)
    module, data = _module_and_data(cast_to=torch.bfloat16)
    Trainer(precision="32-true", callbacks=[StreamResetCallback()]).predict(module, data)
    return {"predict_state": owner, "module": module}


def build_callbacks_full_precision() -> Dict[str, Any]:
    """The three callbacks with float32 weights: mixed-precision validation and predict runs."""
    torch.manual_seed(0)
    module, data = _module_and_data()
    validation = ValidationDecodeState(num_slots=2)
    Trainer(precision="bf16-mixed", callbacks=[validation]).validate(module, data)
    torch.manual_seed(0)
    module, data = _module_and_data()
    owner = PredictDecodeState(num_slots=2)
    Trainer(precision="16-mixed", callbacks=[owner]).predict(module, data)
    torch.manual_seed(0)
    module, data = _module_and_data()
    Trainer(precision="32-true", callbacks=[StreamResetCallback()]).predict(module, data)
    return {"validation": validation, "predict_state": owner, "module": module}
