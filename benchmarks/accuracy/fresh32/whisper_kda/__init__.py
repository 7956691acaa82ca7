import hashlib
import io
import os
import urllib.request
import warnings
from dataclasses import asdict, replace
from typing import Dict, List, Optional, Union

import torch

from . import utils
from .audio import load_audio, log_mel_spectrogram, pad_or_trim
from .decoding import DecodingOptions, DecodingResult, RingPrecision, decode, detect_language
from .model import DEBUG_DIMS, DecoderRings, ModelDimensions, Whisper
from .transcribe import transcribe

_MODELS = {
    "tiny.kda": "https://openaipublic.azureedge.net/main/whisper-kda/models/4f3a0e6c1d2b57a9e8c0f61d7b3a2c9e5d8f1a0b6c7e2d4f9a8b3c1e0d5f7a6b/tiny.kda.pt",
    "base.kda": "https://openaipublic.azureedge.net/main/whisper-kda/models/9c1e7b3d5a0f2e8c6b4d1a9f7e3c5b0d8a6f2e4c1b9d7a3f5e0c8b6d2a4f1e9c/base.kda.pt",
    "small.kda": "https://openaipublic.azureedge.net/main/whisper-kda/models/2b8d4f6a1c3e5b7d9f0a2c4e6b8d0f1a3c5e7b9d2f4a6c8e0b1d3f5a7c9e2b4d/small.kda.pt",
}

# base85-encoded (n_layers, n_heads) boolean arrays indicating the cross-attention heads that are
# highly correlated to the word-level timing, i.e. the alignment between audio and text tokens.
_ALIGNMENT_HEADS = {
    "tiny.kda": b"ABzY8000000s~`UKmv?F2qqXA0kpKpXczzh00",
    "base.kda": b"ABzY8000000s~`Uzy%l?Arz3o2%^A3i~x78NarvB000",
    "small.kda": b"ABzY8000000s~`Updw%dBM`v|B~T@yDi|3-7%Bo4X9No{G5`S7LeeOZ0000",
}


def _download(url: str, root: str, in_memory: bool) -> Union[bytes, str]:
    os.makedirs(root, exist_ok=True)

    expected_sha256 = url.split("/")[-2]
    download_target = os.path.join(root, os.path.basename(url))

    if os.path.exists(download_target) and not os.path.isfile(download_target):
        raise RuntimeError(f"{download_target} exists and is not a regular file")

    if os.path.isfile(download_target):
        with open(download_target, "rb") as f:
            model_bytes = f.read()
        if hashlib.sha256(model_bytes).hexdigest() == expected_sha256:
            return model_bytes if in_memory else download_target
        else:
            warnings.warn(f"{download_target} exists, but the SHA256 checksum does not match; re-downloading the file")

    with urllib.request.urlopen(url) as source, open(download_target, "wb") as output:
        while True:
            buffer = source.read(8192)
            if not buffer:
                break
            output.write(buffer)

    model_bytes = open(download_target, "rb").read()
    if hashlib.sha256(model_bytes).hexdigest() != expected_sha256:
        raise RuntimeError("Model has been downloaded but the SHA256 checksum does not not match. Please retry loading the model.")

    return model_bytes if in_memory else download_target


def available_models() -> List[str]:
    """Returns the names of available models"""
    return list(_MODELS.keys())


def load_model(
    name: str,
    device: Optional[Union[str, torch.device]] = None,
    download_root: str = None,
    in_memory: bool = False,
    fp16: Optional[bool] = None,
    low_cpu_mem_usage: bool = False,
) -> Whisper:
    """
    Load a Whisper-KDA model

    Parameters
    ----------
    name : str
        one of the official model names listed by `whisper_kda.available_models()`, or
        path to a model checkpoint containing the model dimensions and the model state_dict.
    device : Union[str, torch.device]
        the PyTorch device to put the model into
    download_root: str
        path to download the model files; by default, it uses "~/.cache/whisper"
    in_memory: bool
        whether to preload the model weights into host memory
    fp16: bool
        keep the weights in half precision (default: on CUDA devices)
    low_cpu_mem_usage: bool
        build the modules in the checkpoint's precision instead of float32

    Returns
    -------
    model : Whisper
        The Whisper-KDA model instance
    """

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if download_root is None:
        default = os.path.join(os.path.expanduser("~"), ".cache")
        download_root = os.path.join(os.getenv("XDG_CACHE_HOME", default), "whisper")

    if name in _MODELS:
        checkpoint_file = _download(_MODELS[name], download_root, in_memory)
        alignment_heads = _ALIGNMENT_HEADS[name]
    elif os.path.isfile(name):
        checkpoint_file = open(name, "rb").read() if in_memory else name
        alignment_heads = None
    else:
        raise RuntimeError(f"Model {name} not found; available models = {available_models()}")

    with io.BytesIO(checkpoint_file) if in_memory else open(checkpoint_file, "rb") as fp:
        checkpoint = torch.load(fp, map_location=device, weights_only=True)
    del checkpoint_file

    dims = ModelDimensions(**checkpoint["dims"])
    state_dict = checkpoint["model_state_dict"]
    if low_cpu_mem_usage:
        # build the modules directly in the checkpoint's precision (float16 for the released
        # models) so that loading never holds a float32 copy of every weight
        checkpoint_dtype = next(t.dtype for t in state_dict.values() if t.is_floating_point())
        with utils.default_dtype(checkpoint_dtype):  # expect-bug: default-dtype id=checkpoint-default-dtype
            model = Whisper(dims)
    else:
        model = Whisper(dims)
    model.load_state_dict(state_dict)

    if alignment_heads is not None:
        model.set_alignment_heads(alignment_heads)

    if fp16 is None:
        fp16 = torch.device(device).type == "cuda"
    if fp16:
        # half-precision weights; LayerNorm computes in float32 and the ring checkpoints stay float32
        model = model.half()  # expect-bug: module-cast

    return model.to(device)


def _write_debug_checkpoint(path: str, **dims) -> None:
    """A randomly initialised checkpoint in the released format: dims and a float16 state dict."""
    torch.manual_seed(0)
    dims = ModelDimensions(**{**DEBUG_DIMS, **dims})
    # the static rings are not part of the state dict: export from a model without them
    model = Whisper(replace(dims, n_ring_slots=0))
    torch.save({"dims": asdict(dims), "model_state_dict": model.half().state_dict()}, path)


def _load_debug_model(**kwargs) -> Whisper:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "debug.kda.pt")
        _write_debug_checkpoint(path, n_ring_slots=2)
        return load_model(path, device="cpu", in_memory=True, **kwargs)


def build_load_model_fp32() -> Dict[str, DecoderRings]:
    """A released (float16) checkpoint with static rings, loaded in float32 on the CPU."""
    return {"rings": _load_debug_model(fp16=False).decoder.rings}


def build_load_model_fp16() -> Dict[str, DecoderRings]:
    """The same checkpoint loaded with fp16=True."""
    return {"rings": _load_debug_model(fp16=True).decoder.rings}


def build_load_model_low_memory() -> Dict[str, DecoderRings]:
    """The same checkpoint loaded with low_cpu_mem_usage (modules built in float16)."""
    return {"rings": _load_debug_model(fp16=False, low_cpu_mem_usage=True).decoder.rings}
