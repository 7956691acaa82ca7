"""Saving and loading of checkpoints, and of decoder states that streams resume from."""

import json
import logging
import os
import struct

import torch

from onmt_kda.utils import misc

logger = logging.getLogger(__name__)

_RAW = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32}
_RAW_NAMES = {dtype: name for name, dtype in _RAW.items()}


def load_checkpoint(ckpt_path):
    """Load checkpoint from `ckpt_path` if any else return `None`."""
    checkpoint = None
    if ckpt_path:
        logger.info("Loading checkpoint from %s", ckpt_path)
        checkpoint = torch.load(ckpt_path, map_location=lambda storage, loc: storage, weights_only=False)
    return checkpoint


class ModelSaver(object):
    """Simple model saver to filesystem"""

    def __init__(self, base_path, model, model_opt, vocab, optim, keep_checkpoint=-1):
        self.base_path, self.model, self.model_opt = base_path, model, model_opt
        self.vocab, self.optim, self.keep_checkpoint = vocab, optim, keep_checkpoint

    def save(self, step):
        """Main entry point for model saver; returns the path of the checkpoint."""
        checkpoint = {
            "model": self.model.decoder.state_dict(),
            "generator": self.model.generator.state_dict(),
            "vocab": self.vocab,
            "opt": self.model_opt,
            "optim": self.optim.state_dict() if self.optim is not None else None,
        }
        checkpoint_path = "%s_step_%d.pt" % (self.base_path, step)
        logger.info("Saving checkpoint %s", checkpoint_path)
        torch.save(checkpoint, checkpoint_path)
        return checkpoint_path


def save_decode_state(path, cache, half=False, model_dtype="fp32"):
    """Writes ``decoder.state["cache"]``: a torch file, or raw bytes when ``path`` ends in ``.raw``."""
    if path.endswith(".raw"):
        header, chunks, offset = {"model_dtype": model_dtype, "tensors": {}}, [], 0
        for name, layer_cache in cache.items():
            for key, t in layer_cache.items():
                data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
                header["tensors"][f"{name}/{key}"] = {"dtype": _RAW_NAMES[t.dtype], "shape": list(t.shape),
                                                      "offsets": [offset, offset + data.numel()]}
                chunks.append(data.numpy().tobytes())
                offset += data.numel()
        blob = json.dumps(header).encode("utf-8")
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(blob)) + blob + b"".join(chunks))
        return path
    payload = {}
    for name, layer_cache in cache.items():
        payload[name] = {key: t.detach().cpu().half() if half and t.is_floating_point() else t.detach().cpu() for key, t in layer_cache.items()}  # expect-bug: load id=half-state
    torch.save(payload, path)
    return path


def load_decode_state(path, into=None):
    """A saved decoder cache; with ``into`` (a live cache) it is copied into those tensors."""
    if not path.endswith(".raw"):
        payload = torch.load(path, map_location="cpu", weights_only=True)
        if into is None:
            return payload
        for name, layer_cache in payload.items():
            for key, t in layer_cache.items():
                into[name][key].copy_(t)
        return into
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length].decode("utf-8"))
    body = memoryview(data)[8 + length:]
    if into is None:
        dtype, into = misc.str2dtype(header["model_dtype"]), {}
        for key, info in header["tensors"].items():
            name, field = key.split("/")
            into.setdefault(name, {})[field] = torch.empty(info["shape"], dtype=torch.int32 if field == "write_pos" else dtype)  # expect-bug: pool-dtype
    for key, info in header["tensors"].items():
        name, field = key.split("/")
        start, end = info["offsets"]
        into[name][field].copy_(torch.frombuffer(bytearray(body[start:end]), dtype=_RAW[info["dtype"]]).reshape(info["shape"]))
    return into


def _bf16_decoder(src):
    from onmt_kda.decoders.kda_decoder import Embeddings, KDADecoder

    torch.manual_seed(0)
    decoder = KDADecoder(2, 16, 2, 4, 8, 8, 32, 4, Embeddings(16, 24, 1)).to(torch.bfloat16)
    with torch.no_grad():
        decoder.init_state(src)
        decoder(src)
    return decoder


def build_decode_state_roundtrip(tmp_dir):
    """A bf16 decoder's state through a torch file, and through a raw file copied into a live cache."""
    cache = _bf16_decoder(torch.tensor([[4, 5, 6, 7, 8], [9, 10, 11, 12, 13]])).state["cache"]
    reloaded = load_decode_state(save_decode_state(os.path.join(tmp_dir, "state.pt"), cache))
    raw_path = save_decode_state(os.path.join(tmp_dir, "state.raw"), cache, model_dtype="bf16")
    live = _bf16_decoder(torch.tensor([[4], [5]])).state["cache"]
    return {"pt": reloaded, "raw_into_live": load_decode_state(raw_path, into=live)}


def build_decode_state_raw(tmp_dir):
    """A bf16 decoder's state through a raw file, loaded on its own."""
    cache = _bf16_decoder(torch.tensor([[4, 5, 6, 7, 8], [9, 10, 11, 12, 13]])).state["cache"]
    return load_decode_state(save_decode_state(os.path.join(tmp_dir, "state.raw"), cache, model_dtype="bf16"))
