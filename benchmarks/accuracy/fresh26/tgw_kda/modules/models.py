"""Model loading: ``load_model`` picks a loader and fills ``shared.model``/``shared.tokenizer``.

Each loader reads a folder under ``--model-dir`` (``config.json`` and the weights) and builds the
backend object: the plain torch model (Transformers), the ExLlama-style model with its own
cache (ExLlamaKDA), or the HF-style wrapper (ExLlamaKDA_HF, KDA_HF).
"""

import gc
import json
import logging
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import torch

from tgw_kda.modules import extensions, shared, utils
from tgw_kda.modules.kda_model import (
    ByteTokenizer,
    KimiLinearConfig,
    KimiLinearForCausalLM,
    load_weights,
    write_tiny_checkpoint,
)

logger = logging.getLogger(__name__)


def load_model(model_name: str, loader: Optional[str] = None) -> Tuple[Any, Any]:
    """Loads ``model_name`` with ``loader`` (or the one its metadata/flags name) into ``shared``."""
    logger.info('Loading "%s"', model_name)
    t0 = time.time()

    shared.is_seq2seq = False
    shared.model_name = model_name
    load_func_map = {
        "Transformers": huggingface_loader,
        "ExLlamaKDA": ExLlamaKDA_loader,
        "ExLlamaKDA_HF": ExLlamaKDA_HF_loader,
        "KDA_HF": KDA_HF_loader,
    }

    metadata = get_model_metadata(model_name)
    if loader is None:
        loader = shared.fix_loader_name(shared.args.loader) or metadata.get("loader") or "Transformers"
    if loader not in load_func_map:
        raise ValueError(f"unknown loader {loader!r}; valid options: {sorted(load_func_map)}")

    shared.args.loader = loader
    output = load_func_map[loader](model_name)
    if type(output) is tuple:
        model, tokenizer = output
    else:
        model = output
        tokenizer = load_tokenizer(model_name)

    shared.model, shared.tokenizer = model, tokenizer
    shared.settings.update({k: metadata[k] for k in metadata if k in shared.settings})
    extensions.apply_extensions("model_loaded", model)
    logger.info("Loaded the model in %.2f seconds.", time.time() - t0)
    return model, tokenizer


def get_model_metadata(model_name: str) -> Dict[str, Any]:
    """Settings the model folder suggests (its loader, its context length)."""
    path = Path(shared.args.model_dir) / model_name
    metadata: Dict[str, Any] = {}
    config_path = path / "config.json"
    if config_path.exists():
        config = json.loads(config_path.read_text(encoding="utf-8"))
        if "ring_len" in config:
            metadata["ring_len"] = config["ring_len"]
        if config.get("quantization_config", {}).get("quant_method") == "exl-kda":
            metadata["loader"] = "ExLlamaKDA"
    settings_path = path / "webui-settings.json"
    if settings_path.exists():
        metadata.update(json.loads(settings_path.read_text(encoding="utf-8")))
    return metadata


def load_tokenizer(model_name: str) -> ByteTokenizer:
    path = Path(shared.args.model_dir) / model_name
    config = KimiLinearConfig.from_json(path / "config.json")
    return ByteTokenizer(config.vocab_size)


def huggingface_loader(model_name: str) -> KimiLinearForCausalLM:
    """The plain torch model; ``--max_slots`` gives it in-model ring caches."""
    path_to_model = Path(shared.args.model_dir) / model_name
    config = KimiLinearConfig.from_json(path_to_model / "config.json")
    if shared.args.ring_len:
        config.ring_len = shared.args.ring_len

    params: Dict[str, Any] = {"low_cpu_mem_usage": True}
    if shared.args.cpu:
        params["torch_dtype"] = torch.float32
    elif shared.args.load_in_8bit:
        params["torch_dtype"] = utils.str_to_torch_dtype(shared.args.compute_dtype)
    else:
        params["torch_dtype"] = torch.bfloat16 if shared.args.bf16 else torch.float16

    model = KimiLinearForCausalLM(config)
    model.load_state_dict(load_weights(path_to_model), strict=False)
    if shared.args.max_slots > 0:
        model.attach_caches(shared.args.max_slots)
    model = model.to(dtype=params["torch_dtype"])  # expect-bug: module-cast
    model.eval()
    return model


def ExLlamaKDA_loader(model_name: str) -> Tuple[Any, ByteTokenizer]:
    from tgw_kda.modules.exllama_kda import ExllamaKDAModel

    dtype = utils.get_torch_dtype(shared.args)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # expect-bug: default-dtype id=exl-default-dtype
    try:
        model, tokenizer = ExllamaKDAModel.from_pretrained(Path(shared.args.model_dir) / model_name)
    finally:
        torch.set_default_dtype(previous)
    return model, tokenizer


def ExLlamaKDA_HF_loader(model_name: str) -> Any:
    from tgw_kda.modules.kda_hf import KDAHF

    return KDAHF.from_pretrained(Path(shared.args.model_dir) / model_name, loader="ExLlamaKDA_HF")


def KDA_HF_loader(model_name: str) -> Any:
    from tgw_kda.modules.kda_hf import KDAHF

    return KDAHF.from_pretrained(Path(shared.args.model_dir) / model_name, loader="KDA_HF")


def clear_torch_cache() -> None:
    gc.collect()


def unload_model(keep_model_name: bool = False) -> None:
    shared.model = shared.tokenizer = None
    shared.chat_states.clear()
    if not keep_model_name:
        shared.model_name = "None"
    clear_torch_cache()


def reload_model() -> None:
    unload_model()
    shared.model, shared.tokenizer = load_model(shared.model_name)


def build_transformers_bf16(tmp_dir: str) -> KimiLinearForCausalLM:
    """Transformers loader, --bf16 --max_slots 2: three decode steps on both slots."""
    write_tiny_checkpoint(tmp_dir, "kimi-linear-tiny")
    with shared.scoped_state(bf16=True, max_slots=2, model_dir=tmp_dir):
        model, _ = load_model("kimi-linear-tiny", "Transformers")
        slots = torch.tensor([0, 1], dtype=torch.int32)
        with torch.no_grad():
            for step in range(3):
                model.decode_step(torch.tensor([4 + step, 7 + step]), slots, model.slot_views())
        return model


def build_exllama_bf16(tmp_dir: str) -> Dict[str, Any]:
    """ExLlamaKDA loader, --bf16 with two slots: a streamed reply."""
    write_tiny_checkpoint(tmp_dir, "kimi-linear-tiny")
    with shared.scoped_state(bf16=True, max_slots=2, model_dir=tmp_dir):
        model, _ = load_model("kimi-linear-tiny", "ExLlamaKDA")
        reply = model.generate("hello", {"max_new_tokens": 4, "ban_eos_token": True})
        return {"cache": model.cache, "model": model.model, "reply_length": len(reply)}


def build_exllama_cache_8bit_loader(tmp_dir: str) -> Dict[str, Any]:
    """ExLlamaKDA loader, --bf16 --cache_8bit: a streamed reply on the 8-bit cache."""
    write_tiny_checkpoint(tmp_dir, "kimi-linear-tiny")
    with shared.scoped_state(bf16=True, cache_8bit=True, model_dir=tmp_dir):
        model, _ = load_model("kimi-linear-tiny", "ExLlamaKDA")
        model.generate("hi there", {"max_new_tokens": 3, "ban_eos_token": True})
        return {"cache": model.cache}
