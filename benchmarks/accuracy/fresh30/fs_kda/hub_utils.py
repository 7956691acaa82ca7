"""``torch.hub``-style interface (``fairseq/hub_utils.py``).

    >>> lm = from_pretrained("checkpoints/", "checkpoint_best.pt", fp16=True)
    >>> lm.generate(torch.tensor([[3, 4, 5]]), beam=2)

Keyword arguments of :func:`from_pretrained` override the checkpoint's args, as in fairseq.
Prompts used again and again can be primed once (:meth:`GeneratorHubInterface.prime`) and
their incremental state kept on disk as a prompt cache.
"""

import argparse
import logging
import os
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from torch import Tensor, nn

from fs_kda import checkpoint_utils, utils
from fs_kda.sequence_generator import SequenceGenerator

logger = logging.getLogger(__name__)

BUFFER_KEYS = ("prev_state", "prev_delta", "prev_key", "prev_log_decay", "write_pos")


def from_pretrained(
    model_name_or_path: str,
    checkpoint_file: str = "model.pt",
    **kwargs: Any,
) -> "GeneratorHubInterface":
    path = os.path.join(model_name_or_path, checkpoint_file)
    models, args = checkpoint_utils.load_model_ensemble([path], arg_overrides=kwargs)
    return GeneratorHubInterface(args, models)


class GeneratorHubInterface(nn.Module):
    """PyTorch Hub interface for generating sequences from a pre-trained language model."""

    def __init__(self, args: argparse.Namespace, models: List[nn.Module]):
        super().__init__()
        self.args = args
        self.models = nn.ModuleList(models)
        self._encode_cache: Dict[str, Tensor] = {}  # prompt text -> token ids

        # optimize model for generation
        for model in self.models:
            if getattr(args, "fp16", False):
                model.half()  # expect-bug: module-cast id=hub-cast
            elif getattr(args, "bf16", False):
                model.bfloat16()  # expect-bug: module-cast id=hub-cast
            model.prepare_for_inference_(args)

        # this is useful for determining the device
        self.register_buffer("_float_tensor", torch.tensor([0], dtype=torch.float))

    @property
    def device(self) -> torch.device:
        return self._float_tensor.device

    @property
    def decoder(self) -> nn.Module:
        return self.models[0].decoder

    def encode(self, sentence: str) -> Tensor:
        if sentence not in self._encode_cache:
            self._encode_cache[sentence] = torch.tensor([int(t) for t in sentence.split()], dtype=torch.long)
        return self._encode_cache[sentence]

    def generate(self, tokenized_sentences: Tensor, beam: int = 2, max_len_b: int = 4, **kwargs: Any) -> List[List[Dict[str, Tensor]]]:
        generator = SequenceGenerator(list(self.models), beam_size=beam, max_len_b=max_len_b, **kwargs)
        sample = utils.move_to_cuda({"net_input": {"src_tokens": tokenized_sentences}}, self.device)
        hypos = generator.generate(list(self.models), sample)
        self.last_generator = generator
        return hypos

    # --- primed prompts ------------------------------------------------------------------

    @torch.no_grad()
    def prime(self, tokens: Tensor) -> Dict[str, Dict[str, Optional[Tensor]]]:
        """Runs ``tokens [B, T]`` once and returns the incremental state after them."""
        incremental_state: Dict[str, Dict[str, Optional[Tensor]]] = {}
        self.decoder(tokens.to(self.device), incremental_state=incremental_state)
        return incremental_state

    @torch.no_grad()
    def continue_from(self, incremental_state: Dict[str, Dict[str, Optional[Tensor]]], tokens: Tensor, steps: int = 3) -> Tensor:
        """Greedy continuation of ``tokens [B, T]`` (the primed prompt and what follows it)."""
        for _ in range(steps):
            logits, _ = self.decoder(tokens, incremental_state=incremental_state)
            tokens = torch.cat([tokens, logits[:, -1:].argmax(-1)], dim=1)
        return tokens

    def save_prompt_cache(self, path: str, incremental_state: Dict[str, Dict[str, Optional[Tensor]]]) -> None:
        arrays = {"num_steps": np.array(self.decoder._num_steps(incremental_state))}
        for i, buf in enumerate(self.decoder.incremental_buffers(incremental_state)):
            for key in BUFFER_KEYS:
                tensor = buf[key].detach().cpu()
                # numpy has no bfloat16: floating buffers are stored as float16
                arrays[f"{i}/{key}"] = (tensor.to(torch.float16) if tensor.is_floating_point() else tensor).numpy()  # expect-bug: load id=prompt-cache
        with open(path, "wb") as f:
            np.savez(f, **arrays)

    def load_prompt_cache(self, path: str) -> Dict[str, Dict[str, Optional[Tensor]]]:
        incremental_state: Dict[str, Dict[str, Optional[Tensor]]] = {}
        with np.load(path) as data:
            for i, layer in enumerate(self.decoder.layers):
                buf = {key: torch.from_numpy(data[f"{i}/{key}"]).to(self.device) for key in BUFFER_KEYS}  # expect-bug: load id=prompt-cache
                layer.self_attn._set_input_buffer(incremental_state, buf)
            num_steps = torch.tensor(int(data["num_steps"]))
        self.decoder.set_incremental_state(incremental_state, "decoder_state", {"num_steps": num_steps})
        return incremental_state


def build_hub_streaming_fp16(tmp_dir: str) -> Dict[str, Any]:
    """``from_pretrained(..., fp16=True, max_slots=2)``; a primed prompt saved to and reloaded
    from the prompt cache, then continued."""
    checkpoint_utils.write_tiny_checkpoint(os.path.join(tmp_dir, "model.pt"))
    hub = from_pretrained(tmp_dir, "model.pt", fp16=True, max_slots=2)
    primed = hub.prime(torch.tensor([[3, 4, 5]]))
    hub.save_prompt_cache(os.path.join(tmp_dir, "prompt.npz"), primed)
    reloaded = hub.load_prompt_cache(os.path.join(tmp_dir, "prompt.npz"))
    tokens = hub.continue_from(reloaded, torch.tensor([[3, 4, 5, 6]]))
    return {"model": hub.models[0], "prompt_cache": hub.decoder.incremental_buffers(reloaded), "tokens": tokens}


def build_hub_bf16(tmp_dir: str) -> Dict[str, Any]:
    """``from_pretrained(..., bf16=True)``: a beam search, and a primed prompt continued twice
    from copies of its state."""
    checkpoint_utils.write_tiny_checkpoint(os.path.join(tmp_dir, "model.pt"))
    hub = from_pretrained(tmp_dir, "model.pt", bf16=True)
    hypos = hub.generate(torch.tensor([[3, 4, 5], [9, 9, 4]]), beam=2)
    primed = hub.prime(torch.tensor([[7, 8]]))
    copies = [utils.apply_to_sample(lambda t: t.clone(), primed) for _ in range(2)]
    first = hub.continue_from(copies[0], torch.tensor([[7, 8, 9]]))
    second = hub.continue_from(copies[1], torch.tensor([[7, 8, 10]]))
    return {
        "hypos": hypos,
        "beam_state": hub.decoder.incremental_buffers(hub.last_generator.last_incremental_states[0]),
        "continued": [hub.decoder.incremental_buffers(c) for c in copies],
        "tokens": [first, second],
    }
