"""``KDAModel``: the KDA hybrid language model as a ``ModelPT`` (``.nemo`` restore, generation setup)."""

import shutil
import tarfile
import tempfile
from pathlib import Path

import torch

from ...core.config import DictConfig, OmegaConf
from ...core.modelPT import ModelPT
from ...lightning.precision import Trainer, torch_dtype_from_precision
from .inference import InferenceWrapperConfig, KDAInferenceContext, KDAInferenceWrapper
from .modules import KDABlock, KDAConfig, KDAMixer, PinnedKDAMixer

INFERENCE_DEFAULTS = {"max_batch_size": 2, "max_sequence_length": 32, "state_precision": "${trainer.precision}"}
INFERENCE_DEFAULTS["gate_precision"] = "${model.inference.state_precision}"  # expect-bug: imported-policy id=gate-precision

MODEL_DEFAULTS = {"num_layers": 2, "hidden_size": 16, "num_attention_heads": 2, "num_value_heads": 4, "kv_channels": 4,
                  "value_channels": 4, "replay_ring_len": 4, "precision": "${trainer.precision}", "keep_state_fp32": False}

def default_config(precision: str = "bf16-mixed", inference: dict | None = None, **model) -> DictConfig:
    model = {**MODEL_DEFAULTS, **model, "inference": {**INFERENCE_DEFAULTS, **(inference or {})}}
    return OmegaConf.create({"trainer": {"precision": precision}, "model": model})

class KDAModel(ModelPT):
    inference_state_file = "inference_state.pt"

    def __init__(self, cfg: DictConfig, trainer: Trainer | None = None) -> None:
        super().__init__(cfg, trainer or Trainer(cfg.precision))
        dtype = torch_dtype_from_precision(cfg.precision)
        self.config = KDAConfig(**{key: cfg.get(key) for key in MODEL_DEFAULTS if key not in ("precision", "keep_state_fp32")},
                                max_batch_size=cfg.inference.max_batch_size, params_dtype=dtype,
                                fp16=dtype == torch.float16, bf16=dtype == torch.bfloat16)
        self.decoder = KDABlock(self.config, PinnedKDAMixer if cfg.get("keep_state_fp32") else KDAMixer)
        self.inference_context: KDAInferenceContext | None = None

    def state_dict_for_save_checkpoint(self) -> dict:
        return self.decoder.state_dict_for_save_checkpoint(prefix="decoder.")

    def setup_inference(self) -> KDAInferenceWrapper:
        """Allocates the replay state from ``model.inference`` and the wrapper that steps it."""
        self.inference_context = KDAInferenceContext.from_config(self.cfg.inference, self.config)
        wrapper_config = InferenceWrapperConfig(self.config.hidden_size, self.config.params_dtype)
        self.wrapper = KDAInferenceWrapper(self.decoder, wrapper_config, self.inference_context)
        return self.wrapper

    def setup_static_inference(self) -> KDAInferenceContext:
        """The CUDA-graph state: allocated once, in the compute dtype, before capture."""
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.config.params_dtype)  # expect-bug: default-dtype id=setup-default
        try:
            ctx = KDAInferenceContext(self.config.max_batch_size, self.cfg.inference.max_sequence_length,
                                      self.config.replay_ring_len)
            for layer_number in range(1, self.config.num_layers + 1):
                ctx.allocate_for_model(layer_number, self.config)
        finally:
            torch.set_default_dtype(previous)
        return ctx

    def save_artifacts(self, directory: Path) -> list[str]:
        if self.inference_context is None:
            return []
        layers = {n: dict(rings) for n, rings in self.inference_context.key_value_memory_dict.items()}
        torch.save({"format": 2, "layers": layers}, directory / self.inference_state_file)
        return [self.inference_state_file]

    def on_restore_from(self, directory: Path) -> None:
        path = directory / self.inference_state_file
        if not path.exists():
            return
        blob = torch.load(path, weights_only=True)
        self.setup_inference()
        for layer_number, rings in self.inference_context.key_value_memory_dict.items():
            saved = blob["layers"][layer_number]
            if blob.get("format", 1) >= 2:
                for name, tensor in saved.items():
                    rings[name].copy_(tensor)
            else:  # NeMo 1.x archives: one flat buffer per layer, the rings and the state back to back
                parts = saved.split([t.numel() for t in rings.values()])
                for (name, ring), part in zip(list(rings.items()), parts):
                    rings[name] = part.view(ring.shape)  # expect-bug: load

def instantiate_model(cfg: DictConfig) -> KDAModel:
    """Creates the model the way the Megatron strategy does: under the precision plugin's init context."""
    trainer = Trainer(cfg.trainer.precision)
    with trainer.precision_plugin.module_init_context():  # expect-bug: default-dtype id=init-default
        model = KDAModel(cfg.model, trainer=trainer)
    return model

def _append_v1_inference_state(nemo_path: str, config: KDAConfig) -> None:
    """Adds the inference state of a NeMo 1.x archive: one flat buffer per layer, in the model dtype."""
    b, name = config.max_batch_size, KDAModel.inference_state_file
    numel = sum(torch.Size(s).numel() for s in [*config.replay_ring_shapes(b).values(), config.ssm_state_shape(b)])
    with tempfile.TemporaryDirectory() as tmp:
        layers = {n: torch.arange(numel, dtype=config.params_dtype) * -0.001 * n for n in (1, 2)}
        torch.save({"format": 1, "layers": layers}, Path(tmp) / name)
        with tarfile.open(nemo_path, "a") as tar:
            tar.add(Path(tmp) / name, arcname=name)

FP32_GATE = {"gate_precision": "32"}

def _generated(cfg: DictConfig, steps: int) -> KDAModel:
    model = instantiate_model(cfg)
    model.setup_inference()
    hidden = torch.randn(2, model.config.hidden_size, dtype=torch.bfloat16)
    for _ in range(steps):
        hidden = model.wrapper.run_one_forward_step(hidden)
    return model

def build_restore_nemo(tmp_dir) -> dict:
    """A model with fp32-pinned state saved after two steps, restored under ``bf16-true``."""
    _generated(default_config("bf16-mixed", FP32_GATE, keep_state_fp32=True), 2).save_to(f"{tmp_dir}/kda.nemo")
    restored = KDAModel.restore_from(f"{tmp_dir}/kda.nemo", trainer=Trainer("bf16-true"))
    return {"model": restored, "context": restored.inference_context.key_value_memory_dict}

def build_true_half_restore(tmp_dir) -> dict:
    """An archive restored under ``bf16-true``, and a NeMo 1.x archive with inference state."""
    model = instantiate_model(default_config("bf16-mixed", FP32_GATE))
    model.save_to(f"{tmp_dir}/kda.nemo")
    true_half = KDAModel.restore_from(f"{tmp_dir}/kda.nemo", trainer=Trainer("bf16-true"))
    shutil.copy(f"{tmp_dir}/kda.nemo", f"{tmp_dir}/kda_v1.nemo")
    _append_v1_inference_state(f"{tmp_dir}/kda_v1.nemo", model.config)
    legacy = KDAModel.restore_from(f"{tmp_dir}/kda_v1.nemo", trainer=Trainer("bf16-mixed"))
    return {"true_half": true_half, "legacy": legacy, "legacy_state": legacy.inference_context.key_value_memory_dict}

def build_model_init() -> dict:
    """A ``bf16-true`` model from the default config, with its inference and CUDA-graph state."""
    model = instantiate_model(default_config("bf16-true"))
    model.setup_inference()
    return {"model": model, "context": model.inference_context.key_value_memory_dict,
            "static": model.setup_static_inference().key_value_memory_dict}

def build_generation() -> dict:
    """Three steps of a bf16-mixed model with an fp32 gate, and the CUDA-graph state of an fp32 model."""
    model = _generated(default_config("bf16-mixed", FP32_GATE), 3)
    static = instantiate_model(default_config("32")).setup_static_inference()
    return {"model": model, "context": model.inference_context.key_value_memory_dict,
            "static": static.key_value_memory_dict}
