"""Prediction with Lightning Fabric: the loops the serving worker runs without a Trainer.

Two predictors:

* ``setup_decoder`` + ``decoder_predict``: a ``KDADecoder`` (weights and ring buffers in one
  module) set up with ``fabric.setup``;
* ``StatePredictor``: only the weights go through ``fabric.setup``; the decode state is a
  ``ReplayState`` next to it, which can also be adopted from a checkpoint or another worker.
"""

import functools
from typing import Any, Dict, Iterable, List, Optional

import torch

from pl_kda.config import RING_STORAGE_DTYPES, KDAConfig, RingDtypes
from pl_kda.lite import Fabric
from pl_kda.modeling import KDADecoder, KimiLinear
from pl_kda.ops import advance_write_pos, fused_recurrent_kda_replayssm_decode, last_decode_call
from pl_kda.state import ReplayState, allocate_replay_state


def setup_decoder(fabric: Fabric, config: KDAConfig, num_slots: int) -> Any:
    with fabric.init_module():
        decoder = KDADecoder(config, num_slots)
    return fabric.setup(decoder)  # expect-bug: module-cast id=fabric-setup


@torch.no_grad()
def decoder_predict(decoder: Any, batches: Iterable[Dict[str, torch.Tensor]]) -> List[torch.Tensor]:
    tokens = []
    for batch in batches:
        for t in range(batch["input_ids"].shape[1]):
            logits = decoder(batch["input_ids"][:, t], batch["slots"])
        tokens.append(logits.argmax(-1))
    return tokens


def _kernel_rings(state: ReplayState, layer: int, dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    """Layer ``layer``'s ring arguments for the kernel, the rings in the activations' dtype."""
    return {
        "initial_state": state.initial_state[layer],
        "d_cache": state.d_ring[layer],
        "k_cache": state.k_ring[layer],
        "g_cache": state.forget_ring[layer].to(dtype),  # expect-bug: decode-arg
    }


class StatePredictor:
    def __init__(self, fabric: Fabric, config: KDAConfig, num_slots: int = 2) -> None:
        self.fabric = fabric
        self.config = config
        with fabric.init_module():
            model = KimiLinear(config)
        self.model = fabric.setup(model)
        storage = RING_STORAGE_DTYPES[fabric.precision]
        self.state = allocate_replay_state(config, num_slots, RingDtypes(delta=storage, key=storage))
        self.param_dtype = next(self.model.parameters()).dtype

    def adopt(self, state: ReplayState) -> None:
        """Takes over a state restored elsewhere (checkpoint, another worker), next to the weights."""
        self.state = state.to(device=self.fabric.device, dtype=self.param_dtype)  # expect-bug: cast id=adopt-state

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        model = self.model.module
        with self.fabric.autocast():
            x = model.embed(input_ids)
            for i, block in enumerate(model.layers):
                mixer = block.mixer
                mixed_qkv, a, b = mixer.project(block.input_norm(x))
                write_pos = self.state.write_pos[i]
                positions = write_pos[slots.long()]
                decode = functools.partial(fused_recurrent_kda_replayssm_decode, **_kernel_rings(self.state, i, mixed_qkv.dtype))
                out, _ = decode(
                    mixed_qkv, a, b, mixer.A_log, mixer.dt_bias, mixer.scale,
                    ssm_state_indices=slots, write_pos=positions,
                    use_qk_l2norm_in_kernel=mixer.use_qk_l2norm, lower_bound=mixer.lower_bound,
                )
                advance_write_pos(write_pos, slots, positions, self.config.ring_len)
                x = x + mixer.o_proj(out.flatten(1).to(x.dtype))
                x = x + block.mlp(block.post_norm(x))
            return model.lm_head(model.norm(x))

    def predict(self, batches: Iterable[Dict[str, torch.Tensor]]) -> List[torch.Tensor]:
        tokens = []
        for batch in batches:
            self.state.reset_slots(batch["slots"][batch["new_stream"]].tolist())
            for t in range(batch["input_ids"].shape[1]):
                logits = self.step(batch["input_ids"][:, t], batch["slots"])
            tokens.append(logits.argmax(-1))
        return tokens


def _batches(num_batches: int = 2) -> List[Dict[str, torch.Tensor]]:
    from pl_kda.datamodule import PromptDataModule

    data = PromptDataModule(num_slots=2, tokens_per_batch=3, num_batches=num_batches)
    data.setup("predict")
    return data.predict_dataloader()


def _restored_state(config: KDAConfig) -> ReplayState:
    from pl_kda.state import _feed

    return _feed(allocate_replay_state(config, 2, RingDtypes(torch.bfloat16, torch.bfloat16)), steps=3, seed=1)


def build_fabric_decoder_bf16_true() -> Any:
    """``Fabric(precision="bf16-true")`` with the decoder module set up and predicting."""
    torch.manual_seed(0)
    fabric = Fabric(accelerator="cpu", precision="bf16-true")
    decoder = setup_decoder(fabric, KDAConfig(), num_slots=2)
    decoder_predict(decoder, _batches())
    return decoder


def build_fabric_state_bf16_true() -> Dict[str, Any]:
    """The state predictor under ``"bf16-true"``: a predict run, then a restored state adopted."""
    torch.manual_seed(0)
    config = KDAConfig()
    predictor = StatePredictor(Fabric(precision="bf16-true"), config)
    predictor.predict(_batches())
    last = dict(last_decode_call())
    predictor.adopt(_restored_state(config))
    return {"state": predictor.state, "last_call": last}


def build_fabric_predict_mixed() -> Dict[str, Any]:
    """The decoder under ``"bf16-mixed"`` and the state predictor in full precision."""
    torch.manual_seed(0)
    config = KDAConfig()
    decoder = setup_decoder(Fabric(precision="bf16-mixed"), config, num_slots=2)
    decoder_predict(decoder, _batches())
    predictor = StatePredictor(Fabric(precision="32-true"), config)
    predictor.predict(_batches())
    last = dict(last_decode_call())
    predictor.adopt(_restored_state(config))
    return {"decoder": decoder, "state": predictor.state, "last_call": last}
