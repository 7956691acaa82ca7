"""Model repository builder (``python -m tritonpy_kda.export /models``). Tensors are saved as ``.npy``,
or raw ``.bin`` for bf16 (numpy has none), with a ``manifest.json`` of their dtypes and shapes."""

import json
import sys
from pathlib import Path

import numpy as np
import torch

from . import triton_utils as pb_utils
from .kda_ops import KDAStack
from .state import RingGeometry, SequenceStatePool, default_state_specs

def make_model_config(name: str = "kda_decode", data_type: str = "TYPE_BF16", state_mode: str = "slots",
                      ring_layout: str = "replay", num_layers: int = 2, max_sequences: int = 2) -> dict:
    params = {"activation_type": data_type, "state_mode": state_mode, "ring_layout": ring_layout, "num_layers": num_layers}
    controls = [("START", "CONTROL_SEQUENCE_START"), ("END", "CONTROL_SEQUENCE_END"), ("CORRID", "CONTROL_SEQUENCE_CORRID")]
    batching = {"direct": {}, "max_sequence_idle_microseconds": 5000000, "control_input": [
        {"name": input_name, "control": [{"kind": kind, "int32_false_true": [0, 1]}]} for input_name, kind in controls]}
    if state_mode == "implicit":
        batching["state"] = [spec.to_config() for spec in default_state_specs(RingGeometry(), num_layers)]
    return {"name": name, "backend": "python", "max_batch_size": max_sequences, "sequence_batching": batching,
            "input": [{"name": "INPUT_IDS", "data_type": "TYPE_INT32", "dims": [1]}],
            "output": [{"name": "HIDDEN", "data_type": "TYPE_FP32", "dims": [8]}],
            "parameters": {key: {"string_value": str(value)} for key, value in params.items()}}

def state_dtype(config: dict) -> torch.dtype:
    """dtype of the sequence state a model config declares: its activation type."""
    return pb_utils.TYPE_TO_TORCH[pb_utils.get_model_param(config, "activation_type", "TYPE_FP32")]  # expect-bug: imported-policy id=state-dtype

def save_tensors(directory: Path, tensors: dict[str, torch.Tensor]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for name, tensor in tensors.items():
        tensor, raw = tensor.detach().contiguous(), tensor.dtype == torch.bfloat16
        file = directory / f"{name}.{'bin' if raw else 'npy'}"
        if raw:
            file.write_bytes(tensor.view(torch.int16).numpy().tobytes())
        else:
            np.save(file, tensor.numpy())
        manifest[name] = {"file": file.name, "dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape)}
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1))

def load_tensors(directory: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for name, entry in json.loads((directory / "manifest.json").read_text()).items():
        path = directory / entry["file"]
        if path.suffix == ".bin":
            raw = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.int16)
            tensors[name] = raw.view(getattr(torch, entry["dtype"])).reshape(entry["shape"])
        else:
            tensors[name] = torch.from_numpy(np.load(path))
    return tensors

def export_repository(repo: Path, config: dict) -> Path:
    """Writes config.json, 1/model.py, 1/weights/ and the ``model_warmup`` snapshot 1/warmup/."""
    version, params = repo / config["name"] / "1", {k: e["string_value"] for k, e in config["parameters"].items()}
    (version / "weights").mkdir(parents=True)
    (version.parent / "config.json").write_text(json.dumps(config, indent=1))
    (version / "model.py").write_text("from tritonpy_kda.model import TritonPythonModel  # noqa: F401\n")
    geometry, num_layers = RingGeometry(), int(params["num_layers"])
    torch.manual_seed(0)
    # weights and warm-up data are created in the served type: no fp32 copy of every weight
    torch.set_default_dtype(pb_utils.TYPE_TO_TORCH[params["activation_type"]])  # expect-bug: default-dtype id=warm-ramp
    try:
        stack = KDAStack(geometry, num_layers, hidden=8, slots=1)
        ramp = torch.linspace(-0.5, -0.05, geometry.ring_len)  # expect-bug: default-dtype id=warm-ramp
        dims = geometry.ring_dims()
        warm = {f"{i}.{kind}": torch.zeros(dims[kind]) for i in range(num_layers) for kind in ("delta", "key")}
        warm.update({f"{i}.decay_log": ramp.view(1, -1, 1).expand(dims["decay_log"]).contiguous() for i in range(num_layers)})
    finally:
        torch.set_default_dtype(torch.float32)
    save_tensors(version / "weights", stack.state_dict())
    save_tensors(version / "warmup", warm)
    return version

def load_engine_dump(dump_dir: Path, num_layers: int, pool: SequenceStatePool | None = None, slot: int = 0) -> list:
    """Rings dumped by the prefill engine (``--dump-state``: fp16 ``<kind>_<layer>.npy``), returned,
    or copied into ``slot`` of ``pool`` to replay a reported generation."""
    layers = []
    for layer in range(num_layers):
        rings = {kind: torch.from_numpy(np.load(dump_dir / f"{kind}_{layer}.npy")) for kind in ("delta", "key")}
        rings["decay_log"] = torch.from_numpy(np.load(dump_dir / f"decay_log_{layer}.npy"))  # expect-bug: load id=engine-dump
        if pool is not None:
            for kind, tensor in rings.items():
                pool.layers[layer][kind][slot].copy_(tensor[0])
        layers.append(rings)
    return layers if pool is None else pool.layers

def load_client_state(path: Path, data_type: str) -> list[dict[str, torch.Tensor]]:
    """State saved by ``kda_client --save-state`` (an fp32 ``.npz``), in the instance's served type."""
    np_type, layers = pb_utils.TYPE_TO_NUMPY[data_type], []
    with np.load(path) as archive:
        for layer in range(len([name for name in archive.files if name.startswith("delta_")])):
            delta = torch.from_numpy(archive[f"delta_{layer}"].astype(np_type))
            key = torch.from_numpy(archive[f"key_{layer}"].astype(np_type))
            decay = torch.from_numpy(archive[f"decay_log_{layer}"].astype(np_type))  # expect-bug: cast id=client-astype
            layers.append({"delta": delta, "key": key, "decay_log": decay})
    return layers

def _fixtures(root: Path) -> Path:
    """What the prefill engine (fp16) and the client tool (fp32) write."""
    dims, rng = RingGeometry().ring_dims(), np.random.default_rng(5)
    (root / "dump").mkdir()
    for name, shape in ((f"{kind}_{layer}", shape) for layer in range(2) for kind, shape in dims.items()):
        np.save(root / "dump" / f"{name}.npy", rng.standard_normal([1, *shape]).astype(np.float16))
    np.savez(root / "client.npz", **{f"{k}_{i}": rng.standard_normal(s, dtype=np.float32) for k, s in dims.items() for i in range(2)})
    return root

def build_repository_roundtrip(tmp_dir: str) -> dict:
    """bf16 weights saved and reloaded into a fresh stack, a pool saved and reloaded, a slot seeded from a dump."""
    root = _fixtures(Path(tmp_dir))
    torch.manual_seed(1)
    save_tensors(root / "weights", KDAStack(RingGeometry(), 2, 8, slots=1, dtype=torch.bfloat16).state_dict())
    reloaded = KDAStack(RingGeometry(), 2, 8, slots=1, dtype=torch.bfloat16)
    reloaded.load_state_dict(load_tensors(root / "weights"))
    pool = SequenceStatePool(RingGeometry(), 2, 2, torch.bfloat16, pb_utils.replay_ring_dtypes("TYPE_BF16"))
    save_tensors(root / "pool", {f"{i}.{kind}": t for i, rings in enumerate(pool.layers) for kind, t in rings.items()})
    return {"stack": reloaded, "snapshot": load_tensors(root / "pool"), "pool": load_engine_dump(root / "dump", 2, pool, 1)}

def build_engine_import(tmp_dir: str) -> dict:
    """An engine dump and a client state file loaded as rings, and an exported repository's warm-up snapshot."""
    root = _fixtures(Path(tmp_dir))
    version = export_repository(root / "models", make_model_config(data_type="TYPE_BF16"))
    return {"engine": load_engine_dump(root / "dump", 2), "client": load_client_state(root / "client.npz", "TYPE_FP16"),
            "warm": load_tensors(version / "warmup")}

if __name__ == "__main__":
    print(export_repository(Path(sys.argv[1]), make_model_config(*sys.argv[2:])))
