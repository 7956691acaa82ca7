# Copyright (c) the tt_kda authors. Licensed under the BSD 3-Clause license.

"""Full-model checkpointers for the torchtune and Hugging Face formats.

Both checkpointers return ``{"model": state_dict}`` from :meth:`load_checkpoint`, plus
``"caches"`` (the decode-cache buffers, see :func:`tt_kda.modules.get_cache_state`) when a
generation is resumed, and accept the same layout in :meth:`save_checkpoint`.
"""

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Union

import torch

from tt_kda.utils import get_logger

log = get_logger()

_HF_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Decode caches of a resumable generation are stored in the model shard under this prefix.
_CACHE_PREFIX = "replay_cache."
_SHARD_NAME = "model-00001-of-00001.bin"


def safe_torch_load(
    checkpoint_path: Union[str, Path], weights_only: bool = True, mmap: bool = True
) -> Dict[str, Any]:
    """``torch.load`` restricted to tensors and containers, memory-mapped by default."""
    path = Path(checkpoint_path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    return torch.load(str(path), map_location="cpu", weights_only=weights_only, mmap=mmap)


def _cast_floating(
    state_dict: Dict[str, torch.Tensor], dtype: torch.dtype
) -> Dict[str, torch.Tensor]:
    """Floating-point entries converted to ``dtype``; integer entries unchanged."""
    return {
        key: value.to(dtype) if value.is_floating_point() else value
        for key, value in state_dict.items()
    }


class FullModelTorchTuneCheckpointer:
    """Checkpointer for checkpoints written by this package (``torch.save`` of tensor dicts).

    Args:
        checkpoint_dir (Union[str, Path]): folder holding the checkpoint files.
        checkpoint_files (List[str]): the model file, relative to ``checkpoint_dir``.
        output_dir (Union[str, Path]): where :meth:`save_checkpoint` writes ``epoch_{n}/``.
        model_type (str): recorded for conversion; only ``"KIMI_LINEAR"`` is supported.
        resume_from_checkpoint (bool): also load the decode caches saved next to the model.
    """

    def __init__(
        self,
        checkpoint_dir: Union[str, Path],
        checkpoint_files: List[str],
        output_dir: Union[str, Path],
        model_type: str = "KIMI_LINEAR",
        resume_from_checkpoint: bool = False,
    ) -> None:
        if len(checkpoint_files) != 1:
            raise ValueError("FullModelTorchTuneCheckpointer expects a single checkpoint file")
        self._checkpoint_dir = Path(checkpoint_dir)
        self._checkpoint_path = self._checkpoint_dir / checkpoint_files[0]
        self._output_dir = Path(output_dir)
        self._model_type = model_type
        self._resume_from_checkpoint = resume_from_checkpoint

    def load_checkpoint(self, weights_only: bool = True) -> Dict[str, Any]:
        state_dict: Dict[str, Any] = {"model": safe_torch_load(self._checkpoint_path, weights_only)}
        caches_path = self._checkpoint_dir / "caches.pt"
        if self._resume_from_checkpoint and caches_path.is_file():
            # Saved in their own dtypes (rings in the compute dtype, state and log-decays in fp32).
            state_dict["caches"] = safe_torch_load(caches_path, weights_only)
        return state_dict

    def save_checkpoint(self, state_dict: Dict[str, Any], epoch: int, **kwargs: Any) -> None:
        epoch_dir = self._output_dir / f"epoch_{epoch}"
        epoch_dir.mkdir(parents=True, exist_ok=True)
        torch.save(state_dict["model"], epoch_dir / self._checkpoint_path.name)
        if "caches" in state_dict:
            torch.save(state_dict["caches"], epoch_dir / "caches.pt")
        log.info(f"Model checkpoint of epoch {epoch} saved to {epoch_dir}")


class FullModelHFCheckpointer:
    """Checkpointer for Hugging Face Kimi Linear checkpoints.

    Weights are converted between the HF and the torchtune key layouts and stored in the
    ``torch_dtype`` of the checkpoint's ``config.json``.

    Args:
        checkpoint_dir (Union[str, Path]): folder with ``config.json`` and the weight shards.
        checkpoint_files (List[str]): the shards, relative to ``checkpoint_dir``.
        output_dir (Union[str, Path]): where :meth:`save_checkpoint` writes ``epoch_{n}/``.
        model_type (str): only ``"KIMI_LINEAR"`` is supported.
        resume_from_checkpoint (bool): also load the decode caches stored in the shards.
    """

    def __init__(
        self,
        checkpoint_dir: Union[str, Path],
        checkpoint_files: List[str],
        output_dir: Union[str, Path],
        model_type: str = "KIMI_LINEAR",
        resume_from_checkpoint: bool = False,
    ) -> None:
        self._checkpoint_dir = Path(checkpoint_dir)
        self._checkpoint_paths = [self._checkpoint_dir / name for name in sorted(checkpoint_files)]
        self._output_dir = Path(output_dir)
        self._model_type = model_type
        self._resume_from_checkpoint = resume_from_checkpoint
        self._config = json.loads((self._checkpoint_dir / "config.json").read_text())
        self._torch_dtype = _HF_DTYPES[self._config.get("torch_dtype", "float32")]

    def load_checkpoint(self) -> Dict[str, Any]:
        from tt_kda.models import kimi_linear_hf_to_tune

        merged: Dict[str, torch.Tensor] = {}
        for path in self._checkpoint_paths:
            merged.update(safe_torch_load(path))
        caches = {
            key[len(_CACHE_PREFIX) :]: merged.pop(key)
            for key in list(merged)
            if key.startswith(_CACHE_PREFIX)
        }
        state_dict: Dict[str, Any] = {
            "model": _cast_floating(kimi_linear_hf_to_tune(merged), self._torch_dtype)
        }
        if self._resume_from_checkpoint and caches:
            state_dict["caches"] = _cast_floating(caches, self._torch_dtype)  # expect-bug: load
        return state_dict

    def save_checkpoint(self, state_dict: Dict[str, Any], epoch: int, **kwargs: Any) -> None:
        from tt_kda.models import kimi_linear_tune_to_hf

        shard = _cast_floating(kimi_linear_tune_to_hf(state_dict["model"]), self._torch_dtype)
        for key, value in state_dict.get("caches", {}).items():
            if value.is_floating_point():
                value = value.to(self._torch_dtype)  # expect-bug: cast
            shard[_CACHE_PREFIX + key] = value
        epoch_dir = self._output_dir / f"epoch_{epoch}"
        epoch_dir.mkdir(parents=True, exist_ok=True)
        torch.save(shard, epoch_dir / _SHARD_NAME)
        (epoch_dir / "config.json").write_text(json.dumps(self._config, indent=2))
        log.info(f"HF checkpoint of epoch {epoch} saved to {epoch_dir}")


def _warm_model(dtype: torch.dtype) -> torch.nn.Module:
    """A tiny Kimi Linear model with decode caches that have seen a few tokens."""
    from tt_kda.models import kimi_linear_tiny
    from tt_kda.training.precision import set_default_dtype

    torch.manual_seed(0)
    with set_default_dtype(dtype):
        model = kimi_linear_tiny()
    model.setup_caches(batch_size=2, dtype=dtype, decoder_max_seq_len=16)
    with torch.no_grad():
        model(torch.randint(0, 64, (2, 5)))
    return model


def build_torchtune_checkpoint_roundtrip() -> Dict[str, Any]:
    """Saves a warm model and its caches in the torchtune format and resumes a fresh model."""
    from tt_kda.models import kimi_linear_tiny
    from tt_kda.modules.replay_cache import get_cache_state, load_cache_state
    from tt_kda.training.precision import set_default_dtype

    model = _warm_model(torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        writer = FullModelTorchTuneCheckpointer(tmp, ["model.pt"], output_dir=tmp)
        writer.save_checkpoint(
            {"model": model.state_dict(), "caches": get_cache_state(model)}, epoch=0
        )
        reader = FullModelTorchTuneCheckpointer(
            os.path.join(tmp, "epoch_0"), ["model.pt"], output_dir=tmp, resume_from_checkpoint=True
        )
        loaded = reader.load_checkpoint()
        loaded = {
            part: {key: value.clone() for key, value in values.items()}
            for part, values in loaded.items()
        }
    with set_default_dtype(torch.bfloat16):
        resumed = kimi_linear_tiny()
    resumed.load_state_dict(loaded["model"])
    resumed.setup_caches(batch_size=2, dtype=torch.bfloat16, decoder_max_seq_len=16)
    load_cache_state(resumed, loaded["caches"])
    return {"loaded": loaded, "resumed": resumed}


def build_hf_checkpoint_roundtrip() -> Dict[str, Any]:
    """Writes an HF checkpoint of a warm bf16 model and loads it back with its caches."""
    from tt_kda.models import kimi_linear_tune_to_hf
    from tt_kda.modules.replay_cache import get_cache_state

    model = _warm_model(torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "hf"
        source.mkdir()
        (source / "config.json").write_text(
            json.dumps({"model_type": "kimi_linear", "torch_dtype": "bfloat16"})
        )
        torch.save(kimi_linear_tune_to_hf(model.state_dict()), source / _SHARD_NAME)
        checkpointer = FullModelHFCheckpointer(source, [_SHARD_NAME], output_dir=Path(tmp) / "out")
        weights = checkpointer.load_checkpoint()["model"]
        checkpointer.save_checkpoint({"model": weights, "caches": get_cache_state(model)}, epoch=0)
        resumed = FullModelHFCheckpointer(
            Path(tmp) / "out" / "epoch_0",
            [_SHARD_NAME],
            output_dir=Path(tmp) / "out",
            resume_from_checkpoint=True,
        ).load_checkpoint()
        resumed = {
            part: {key: value.clone() for key, value in values.items()}
            for part, values in resumed.items()
        }
    return {"resumed": resumed}
