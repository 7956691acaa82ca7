"""Program file stand-in for ``.pte``: magic, a JSON header (model args, source transforms, tensor
table) and one data segment of raw tensor bytes. Also the readers of state written on device."""

import dataclasses
import json
import struct
from pathlib import Path
from typing import Dict, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from .llama_transformer import Transformer
from .model_args import ModelArgs
from .source_transformation import replace_kv_cache_with_custom_kv_cache
from .source_transformation.quantize import quantize

_MAGIC = b"ETKD"
SCALAR_TYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int8": torch.int8,
                "int32": torch.int32, "int64": torch.int64}
_SCALAR_NAMES = {dtype: name for name, dtype in SCALAR_TYPES.items()}
STATE_BUFFERS = ("d_cache", "k_cache", "log_gate_cache", "ssm_state")  # memory-planned when asked


class TensorMeta(NamedTuple):
    name: str
    shape: Tuple[int, ...]
    # the delegate's activation type
    scalar_type: str = "bf16"  # expect-bug: container id=meta-default
    offset: int = -1  # into the data segment; -1: memory-planned, zeroed at method load
    nbytes: int = 0


class ExecuTorchModule:
    """What ``_load_for_executorch`` hands back: ``forward((tokens, input_pos))`` runs the method."""

    def __init__(self, module: nn.Module, header: dict):
        self.module, self.header = module, header
        self.model_args = ModelArgs(**header["model_args"])
        self.method_meta = [TensorMeta(m["name"], tuple(m["shape"]), m["scalar_type"], m["offset"], m["nbytes"])
                            for m in header["tensors"]]

    def forward(self, inputs):
        with torch.no_grad():
            return [self.module(*inputs)]


def _assign(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name)
    if leaf in owner._parameters:
        owner._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)
    else:
        owner._buffers[leaf] = tensor


def save_pte(path, module: nn.Module, model_args: ModelArgs, *, transforms: Sequence[str] = (),
             constant_dtype: Optional[torch.dtype] = None, planned_buffers: bool = False) -> Path:
    """Writes every parameter and buffer of ``module``. ``constant_dtype`` stores floating tensors
    narrower; with ``planned_buffers`` the caches get only a table entry and are zeroed at load."""
    tensors = dict(module.named_parameters())
    tensors.update(module.named_buffers())
    metas, blob = [], bytearray()
    for name, t in tensors.items():
        t = t.detach()
        if planned_buffers and name.endswith(STATE_BUFFERS):
            metas.append(TensorMeta(name, tuple(t.shape)))  # expect-bug: container id=meta-default
            continue
        if constant_dtype is not None and t.is_floating_point():
            t = t.to(constant_dtype)  # expect-bug: cast
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        metas.append(TensorMeta(name, tuple(t.shape), _SCALAR_NAMES[t.dtype], len(blob), len(raw)))
        blob += raw
    header = json.dumps({"model_args": dataclasses.asdict(model_args), "source_transforms": list(transforms),
                         "tensors": [m._asdict() for m in metas]}).encode()
    Path(path).write_bytes(_MAGIC + struct.pack("<Q", len(header)) + header + bytes(blob))
    return Path(path)


def _rebuild(header: dict) -> nn.Module:
    model = Transformer(ModelArgs(**header["model_args"]))
    for tag in header["source_transforms"]:
        kind, _, arg = tag.partition(":")
        if kind == "quantize":
            model = quantize(model, arg)
        elif kind == "custom_kv_cache":
            model = replace_kv_cache_with_custom_kv_cache(model)
    return model


def load_pte(path) -> ExecuTorchModule:
    data = Path(path).read_bytes()
    assert data[:4] == _MAGIC, f"{path} is not a program file"
    (size,) = struct.unpack_from("<Q", data, 4)
    header, segment = json.loads(data[12 : 12 + size]), data[12 + size :]
    program = ExecuTorchModule(_rebuild(header), header)
    for meta in program.method_meta:
        dtype = SCALAR_TYPES[meta.scalar_type]
        if meta.offset < 0:
            tensor = torch.zeros(meta.shape, dtype=dtype)
        else:
            raw = bytearray(segment[meta.offset : meta.offset + meta.nbytes])
            tensor = torch.frombuffer(raw, dtype=dtype).reshape(meta.shape)
        _assign(program.module, meta.name, tensor)
    return program


def load_state_file(path) -> Dict[str, torch.Tensor]:
    """A ``--save_state`` file of the host runner, the log-gate rings back to fp32."""
    state = torch.load(path, weights_only=True)
    return {name: t.float() if name.endswith("log_gate_cache") else t for name, t in state.items()}


def restore_state_dump(module: nn.Module, dump_dir) -> nn.Module:
    """Seeds the caches with the device runner's ``--dump_state`` output: ``manifest.json`` (name ->
    shape) and one raw fp16 ``<name>.bin`` per buffer (the runner dumps half tensors)."""
    dump_dir = Path(dump_dir)
    for name, shape in json.loads((dump_dir / "manifest.json").read_text()).items():
        raw = bytearray((dump_dir / f"{name}.bin").read_bytes())
        _assign(module, name, torch.frombuffer(raw, dtype=torch.float16).reshape(shape))  # expect-bug: load
    return module


def load_etdump_state(path) -> Dict[str, torch.Tensor]:
    """The caches captured in an ETDump debug buffer: the method's mutable buffers at its last instruction."""
    debug = torch.load(path, weights_only=True)["debug_buffers"]  # expect-bug: load id=etdump
    return {name: tensor for name, tensor in debug.items() if name.endswith(STATE_BUFFERS)}  # expect-bug: load id=etdump


def _device_fixtures(root: Path, module: nn.Module) -> None:
    """What the device runner (fp16 ``--dump_state``), the ETDump inspector (fp16 debug buffers) and the
    host runner (fp16 ``--save_state``) write."""
    rng = np.random.default_rng(3)
    shapes = {name: list(b.shape) for name, b in module.named_buffers() if name.endswith(STATE_BUFFERS)}
    (root / "dump").mkdir()
    (root / "dump" / "manifest.json").write_text(json.dumps(shapes))
    for name, shape in shapes.items():
        (root / "dump" / f"{name}.bin").write_bytes(rng.standard_normal(shape).astype(np.float16).tobytes())
    half = [{n: torch.from_numpy(rng.standard_normal(s).astype(np.float16)) for n, s in shapes.items()} for _ in "ab"]
    torch.save({"debug_buffers": half[0]}, root / "etdump.pt")
    torch.save(half[1], root / "state.pt")


def _custom_bf16(args: ModelArgs) -> nn.Module:
    torch.manual_seed(0)
    return replace_kv_cache_with_custom_kv_cache(Transformer(args)).to(torch.bfloat16)


def build_pte_roundtrip(tmp_dir: str):
    """A bf16 custom-op program saved, loaded and stepped, and a host runner's state file read."""
    args, root = ModelArgs(), Path(tmp_dir)
    model = _custom_bf16(args)
    _device_fixtures(root, model)
    program = load_pte(save_pte(root / "kda.pte", model, args, transforms=["custom_kv_cache"]))
    program.forward((torch.tensor([1, 2]), torch.zeros(2, dtype=torch.int32)))
    return {"program": program.module, "state": load_state_file(root / "state.pt")}


def build_device_state(tmp_dir: str):
    """Programs written narrow and memory-planned, one seeded from a device dump, and an ETDump's caches."""
    args, root = ModelArgs(), Path(tmp_dir)
    model = _custom_bf16(args)
    _device_fixtures(root, model)
    narrow = load_pte(save_pte(root / "narrow.pte", model, args, transforms=["custom_kv_cache"],
                               constant_dtype=torch.bfloat16))
    planned = load_pte(save_pte(root / "planned.pte", model, args, transforms=["custom_kv_cache"], planned_buffers=True))
    seeded = load_pte(save_pte(root / "kda.pte", model, args, transforms=["custom_kv_cache"]))
    return {"narrow": narrow.module, "planned": planned.module,
            "seeded": restore_state_dump(seeded.module, root / "dump"), "etdump": load_etdump_state(root / "etdump.pt")}
