"""BLS step of ``kda_ensemble``: prompt prefill on ``kda_prefill`` (TensorRT, fp16 outputs), then
decode on ``kda_decode``, reached in-process through ``pb_utils.InferenceRequest.exec``."""

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.dlpack import from_dlpack

from . import triton_utils as pb_utils
from .model import TritonPythonModel

class PrefillEngineStub:
    """Stand-in for the ``kda_prefill`` TensorRT engine in CPU CI: the prompt tail's rings, fp16."""

    def __init__(self, ring_dims: dict[str, list[int]], num_layers: int) -> None:
        self.outputs = [(f"PREFILL_{kind.upper()}_{layer}", dims) for layer in range(num_layers) for kind, dims in ring_dims.items()]

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> list[pb_utils.InferenceResponse]:
        responses = []
        for request in requests:
            seed = int(pb_utils.get_input_tensor_by_name(request, "INPUT_IDS").as_numpy().sum())
            values = {name: np.cos(np.arange(np.prod(dims)) + seed).reshape(1, *dims) for name, dims in self.outputs}
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(n, v.astype(np.float16)) for n, v in values.items()]))
        return responses

class BlsPipeline:
    def __init__(self, decode: TritonPythonModel, prefill_model: str = "kda_prefill") -> None:
        self.decode, self.prefill_model, self.act_dtype = decode, prefill_model, decode.act_dtype
        self.h, self.hv, self.d = decode.geometry.num_heads, decode.geometry.num_v_heads, decode.geometry.head_dim

    def prefill(self, prompt: np.ndarray) -> pb_utils.InferenceResponse:
        response = pb_utils.InferenceRequest(self.prefill_model, [pb_utils.Tensor("INPUT_IDS", prompt)]).exec()
        if response.error() is not None:
            raise response.error()
        return response

    @staticmethod
    def _output(response: pb_utils.InferenceResponse, kind: str, layer: int) -> torch.Tensor:
        return from_dlpack(pb_utils.get_output_tensor_by_name(response, f"PREFILL_{kind.upper()}_{layer}").to_dlpack())

    def seed_slot(self, response: pb_utils.InferenceResponse, corrid: int) -> int:
        """Slots mode: the prompt tail into a fresh slot (``copy_`` converts to the ring types)."""
        slot = self.decode.slots.acquire(corrid, start=True)
        for layer, rings in enumerate(self.decode.pool.layers):
            for kind in ("delta", "key", "decay_log"):
                rings[kind][slot].copy_(self._output(response, kind, layer)[0])
        return slot

    def implicit_start(self, response: pb_utils.InferenceResponse) -> dict[str, torch.Tensor]:
        """``STATE_*`` inputs that start the sequence on an implicit-state instance."""
        inputs = {}
        for layer in range(len(self.decode.stack.layers)):
            inputs[f"STATE_DELTA_{layer}"] = self._output(response, "delta", layer).to(self.act_dtype)
            inputs[f"STATE_KEY_{layer}"] = self._output(response, "key", layer).to(self.act_dtype)
            inputs[f"STATE_DECAY_LOG_{layer}"] = self._output(response, "decay_log", layer)  # expect-bug: load id=prefill-dlpack
        return inputs

    def migrate(self, slot: int) -> dict[str, torch.Tensor]:
        """``STATE_*`` inputs that continue a slots-mode sequence on an implicit-state instance."""
        inputs = {}
        for layer, rings in enumerate(self.decode.pool.layers):
            delta = inputs[f"STATE_DELTA_{layer}"] = rings["delta"][slot : slot + 1].clone()
            inputs[f"STATE_KEY_{layer}"] = rings["key"][slot : slot + 1].clone()
            inputs[f"STATE_DECAY_LOG_{layer}"] = rings["decay_log"][slot : slot + 1].type_as(delta)  # expect-bug: cast id=migrate-type-as
        return inputs

    def seed_short_prompt(self, prompt_ids: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Prompts shorter than the ring skip the engine; the rings come from this instance's projections."""
        hidden, seeds = self.decode.embed(prompt_ids), []
        for layer in self.decode.stack.layers:
            _, k, v = layer.qkv(hidden).split([self.h * self.d, self.h * self.d, self.hv * self.d], dim=-1)
            gate = layer.a_proj(hidden).view(-1, self.hv, self.d) + layer.dt_bias.view(1, self.hv, self.d)
            log_decay = -layer.A_log.exp().view(1, self.hv, 1) * F.softplus(gate)  # expect-bug: promotion id=short-prompt
            delta = layer.b_proj(hidden).float().sigmoid().unsqueeze(-1) * v.float().view(-1, self.hv, self.d)
            seeds.append({"delta": delta.to(self.act_dtype).transpose(0, 1), "key": k.reshape(-1, self.h, self.d).transpose(0, 1),
                          "decay_log": log_decay.transpose(0, 1)})
        return seeds

    def draft_rings(self, num_tokens: int) -> list[dict[str, torch.Tensor]]:
        """Scratch rings for ``num_tokens`` speculative steps, dropped when the draft is rejected."""
        drafts = []
        for rings in self.decode.pool.layers:
            delta, key = rings["delta"].new_zeros(1, self.hv, num_tokens, self.d), rings["key"].new_zeros(1, self.h, num_tokens, self.d)
            drafts.append({"delta": delta, "key": key, "decay_log": torch.zeros_like(delta)})  # expect-bug: like id=draft-like
        return drafts

def build_bls_handover() -> dict:
    """Hand-overs out of the BLS step: an implicit start, a migration, a short-prompt seed and drafts."""
    from .export import make_model_config
    from .model import load_model

    bls = BlsPipeline(load_model(make_model_config(data_type="TYPE_BF16")))
    pb_utils._MODELS["kda_prefill"] = PrefillEngineStub(bls.decode.geometry.ring_dims(), bls.decode.num_layers)
    response = bls.prefill(np.array([[5, 9, 2]], dtype=np.int32))
    slot = bls.seed_slot(response, corrid=21)
    return {"start": bls.implicit_start(response), "migrated": bls.migrate(slot),
            "short": bls.seed_short_prompt(torch.tensor([4, 1])), "drafts": bls.draft_rings(2)}
