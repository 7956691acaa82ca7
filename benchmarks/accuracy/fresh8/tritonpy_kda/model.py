"""``model.py`` of ``kda_decode``: one request is one decode step of one sequence; the sequence
batcher (``direct``) sends START/END/CORRID as inputs and, with ``state_mode: implicit``, the state."""

import json

import numpy as np
import torch
from torch.utils.dlpack import from_dlpack, to_dlpack

from . import triton_utils as pb_utils
from .kda_ops import KDAStack
from .state import RingGeometry, SequenceSlots, SequenceStatePool, StateSpec, implicit_state_outputs, read_implicit_state

class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.model_config = cfg = json.loads(args["model_config"])
        self.data_type = pb_utils.get_model_param(cfg, "activation_type", "TYPE_BF16")
        self.act_dtype = pb_utils.TYPE_TO_TORCH[self.data_type]
        self.state_mode = pb_utils.get_model_param(cfg, "state_mode", "slots")
        self.num_layers = int(pb_utils.get_model_param(cfg, "num_layers", "2"))
        self.geometry = RingGeometry(ring_len=int(pb_utils.get_model_param(cfg, "ring_len", "4")))
        hidden, max_sequences = self.geometry.num_v_heads * self.geometry.head_dim, cfg.get("max_batch_size") or 1
        torch.manual_seed(int(pb_utils.get_model_param(cfg, "seed", "0")))
        self.embed = torch.nn.Embedding(32, hidden, dtype=self.act_dtype)
        self.slots = SequenceSlots(max_sequences)
        if self.state_mode == "module":  # the rings are the layer buffers
            self.stack = KDAStack(self.geometry, self.num_layers, hidden, max_sequences)
            self.stack = self.stack.to(self.act_dtype)  # expect-bug: module-cast id=stack-to
        else:
            self.stack = KDAStack(self.geometry, self.num_layers, hidden, 1, dtype=self.act_dtype)
        if self.state_mode == "slots":
            layout = pb_utils.get_model_param(cfg, "ring_layout", "replay")
            policy = pb_utils.compact_ring_dtypes if layout == "compact" else pb_utils.replay_ring_dtypes  # expect-bug: imported-policy id=compact-rings
            self.pool = SequenceStatePool(self.geometry, self.num_layers, max_sequences, self.act_dtype, policy(self.data_type))
        elif self.state_mode == "implicit":
            entries = cfg["sequence_batching"].get("state", [])
            self.state_specs = [StateSpec.from_config(entry) for entry in entries]
        pb_utils._MODELS[cfg["name"]] = self

    @staticmethod
    def _control(request: pb_utils.InferenceRequest, name: str) -> int:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return 0 if tensor is None else int(tensor.as_numpy().reshape(-1)[0])

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> list[pb_utils.InferenceResponse]:
        responses, ring_len = [], self.geometry.ring_len
        for request in requests:
            ids = from_dlpack(pb_utils.get_input_tensor_by_name(request, "INPUT_IDS").to_dlpack()).long().view(-1)
            hidden, outputs, zero = self.embed(ids[:1]), [], torch.zeros(1, dtype=torch.int32)
            if self.state_mode == "implicit":
                state = read_implicit_state(request, self.state_specs)
                for index, layer in enumerate(self.stack.layers):
                    pos = state[index, "pos"].view(-1)
                    rings = tuple(state[index, kind] for kind in ("delta", "key", "decay_log", "ssm"))
                    hidden = layer(hidden, zero, pos, pos == ring_len - 1, rings)
                    pos.copy_((pos + 1) % ring_len)
                outputs = implicit_state_outputs(state, self.state_specs)
            else:
                corrid = self._control(request, "CORRID")
                slot = self.slots.acquire(corrid, start=bool(self._control(request, "START")))
                pos = self.slots.write_pos[slot : slot + 1].clone()
                for index, layer in enumerate(self.stack.layers):
                    rings = None if self.state_mode == "module" else tuple(
                        self.pool.layers[index][kind] for kind in ("delta", "key", "decay_log", "ssm_state"))
                    hidden = layer(hidden, zero + slot, pos, pos == ring_len - 1, rings)
                self.slots.write_pos[slot] = (pos[0] + 1) % ring_len
                if self._control(request, "END"):
                    self.slots.release(corrid)
            outputs.insert(0, pb_utils.Tensor.from_dlpack("HIDDEN", to_dlpack(hidden.float())))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses

    def finalize(self) -> None:
        print("Cleaning up...")

def load_model(config: dict) -> TritonPythonModel:
    model = TritonPythonModel()
    model.initialize({"model_config": json.dumps(config), "model_instance_name": f"{config['name']}_0_0"})
    return model

def run_sequence(model: TritonPythonModel, corrid: int, steps: int) -> pb_utils.InferenceResponse:
    """Drives one sequence like the sequence batcher, carrying ``OUT_STATE_*`` back as ``STATE_*``."""
    carried: list[pb_utils.Tensor] = []
    for step in range(steps):
        controls = {"INPUT_IDS": 3 + step, "START": step == 0, "END": step == steps - 1, "CORRID": corrid}
        inputs = [pb_utils.Tensor(name, np.array([[value]], dtype=np.int32)) for name, value in controls.items()]
        inputs += [pb_utils.Tensor.from_dlpack(t.name().removeprefix("OUT_"), t.to_dlpack()) for t in carried]
        response = model.execute([pb_utils.InferenceRequest(model.model_config["name"], inputs)])[0]
        carried = [t for t in response.output_tensors() if t.name().startswith("OUT_STATE_")]
    return response

def build_backend() -> dict:
    """bf16 instance, slots mode with the replay layout, two sequences."""
    from .export import make_model_config

    model = load_model(make_model_config(data_type="TYPE_BF16"))
    run_sequence(model, corrid=11, steps=3)
    last = run_sequence(model, corrid=12, steps=2)
    return {"pool": model.pool.layers, "slots": model.slots, "stack": model.stack,
            "hidden": from_dlpack(last.output_tensors()[0].to_dlpack())}

def build_backend_variants() -> dict:
    """A compact-layout fp16 instance, a module-mode and an implicit-state bf16 instance, one sequence each."""
    from .export import make_model_config

    compact = load_model(make_model_config(name="kda_compact", data_type="TYPE_FP16", ring_layout="compact"))
    module = load_model(make_model_config(name="kda_module", data_type="TYPE_BF16", state_mode="module"))
    implicit = load_model(make_model_config(name="kda_implicit", data_type="TYPE_BF16", state_mode="implicit"))
    run_sequence(compact, corrid=5, steps=2)
    run_sequence(module, corrid=5, steps=2)
    response = run_sequence(implicit, corrid=3, steps=3)
    return {"compact": compact.pool.layers, "module": module.stack,
            "implicit": {t.name(): from_dlpack(t.to_dlpack()) for t in response.output_tensors()}}
