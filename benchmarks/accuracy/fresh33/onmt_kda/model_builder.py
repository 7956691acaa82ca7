"""
This file is for models creation, which consults options
and creates each encoder and decoder accordingly.
"""

import contextlib
import os

import torch
import torch.nn as nn

from onmt_kda import opts
from onmt_kda.decoders import str2dec
from onmt_kda.decoders.kda_decoder import Embeddings, PinnedSlotCache, SlotCache
from onmt_kda.models.model_saver import ModelSaver, load_checkpoint
from onmt_kda.opts import ArgumentParser
from onmt_kda.utils import misc

# Translation options that override the stored model options.
TRANSLATE_OVERRIDES = ("decay_dtype", "ring_dtype", "max_slots", "pin_decay", "low_mem_init")

DEFAULT_VOCAB = ["<unk>", "<blank>", "<s>", "</s>"] + list("abcdefghijklmnopqrst")


class Cast(nn.Module):
    """Basic layer that casts its input to a specific data type."""

    def __init__(self, dtype):
        super().__init__()
        self._dtype = dtype

    def forward(self, x):
        return x.to(self._dtype)


class LanguageModel(nn.Module):
    """Decoder-only model: ``decoder`` and a ``generator`` returning float32 log-probs."""

    def __init__(self, decoder, generator):
        super().__init__()
        self.decoder, self.generator = decoder, generator

    def forward(self, src, tgt=None, src_len=None, bptt=False, with_align=False):
        if not bptt:
            self.decoder.init_state(src)
        return self.decoder(src)


def _base_model(model_opt, vocab, checkpoint=None):
    """Build a model from opts (and load the checkpoint's weights into it)."""
    dtype = misc.str2dtype(model_opt.model_dtype)
    with misc.default_dtype(dtype) if model_opt.low_mem_init else contextlib.nullcontext():  # expect-bug: default-dtype id=low-mem-init
        embeddings = Embeddings(model_opt.word_vec_size, len(vocab), vocab.index("<blank>"))
        decoder = str2dec[model_opt.decoder_type].from_opt(model_opt, embeddings)
        generator = nn.Sequential(nn.Linear(model_opt.dec_hid_size, len(vocab)), Cast(torch.float32), nn.LogSoftmax(dim=-1))
        model = LanguageModel(decoder, generator)
        if model_opt.max_slots > 0:
            decoder.attach_slots(model_opt.max_slots, cache_cls=PinnedSlotCache if model_opt.pin_decay else SlotCache)
    if checkpoint is not None:
        model.decoder.load_state_dict(checkpoint["model"], strict=False)
        model.generator.load_state_dict(checkpoint["generator"], strict=False)
    return model


# Entry points (onmt.bin.train / onmt.bin.translate) import these names.
build_base_model = build_model = _base_model


def load_test_model(opt, device_id=0, model_path=None):
    checkpoint = load_checkpoint(model_path or opt.models[0])
    model_opt = ArgumentParser.ckpt_model_opts(ArgumentParser.update_model_opts(checkpoint["opt"]))
    for key in TRANSLATE_OVERRIDES:
        if getattr(opt, key, None):
            setattr(model_opt, key, getattr(opt, key))
    vocab = checkpoint["vocab"]
    model = build_base_model(model_opt, vocab, checkpoint)
    precision = opt.precision or model_opt.model_dtype
    if precision != "fp32":
        model.to(misc.str2dtype(precision))  # expect-bug: module-cast
    model.eval()
    return vocab, model, model_opt


def write_tiny_checkpoint(folder, name="kda_lm", legacy=False, **overrides):
    """A randomly initialised checkpoint for smoke tests (``legacy``: options of older versions)."""
    torch.manual_seed(1234)
    model_opt = ArgumentParser.defaults(opts.model_opts)
    model_opt.__dict__.update(overrides)
    model = build_base_model(model_opt, DEFAULT_VOCAB)
    if legacy:
        del model_opt.decay_dtype, model_opt.ring_dtype
    return ModelSaver(os.path.join(folder, name), model, model_opt, DEFAULT_VOCAB, None).save(100)


def translate_opt(model_path, **kwargs):
    argv = ["-model", model_path]
    for key, value in kwargs.items():
        argv += [f"-{key}"] if value is True else [f"-{key}", str(value)]
    return opts.parse_translate_opts(argv)


@torch.no_grad()
def _decode(model, slots=None):
    src = torch.tensor([[4, 5, 6], [7, 8, 9]])
    if slots is None:
        model.decoder.init_state(src)
    else:
        model.decoder.bind_slots(torch.tensor(slots, dtype=torch.int32))
    dec_out, _ = model.decoder(src)
    for _ in range(4):
        dec_out, _ = model.decoder(model.generator(dec_out[:, -1]).argmax(-1, keepdim=True))
    return model.decoder.state["cache"]


def build_lm_fp16(tmp_dir):
    """``-precision fp16`` on a float32 checkpoint: per-batch caches and pinned slot caches."""
    path = write_tiny_checkpoint(tmp_dir)
    _, model, _ = load_test_model(translate_opt(path, precision="fp16"))
    _, slotted, _ = load_test_model(translate_opt(path, precision="fp16", max_slots=3, pin_decay=True))
    return {"cache": _decode(model), "slots": _decode(slotted, slots=[2, 0]), "model": slotted}


def build_lm_fp16_slots(tmp_dir):
    """``-precision fp16 -max_slots 2`` on a float32 checkpoint, decoded on both slots."""
    _, model, _ = load_test_model(translate_opt(write_tiny_checkpoint(tmp_dir), precision="fp16", max_slots=2))
    return {"slots": _decode(model, slots=[0, 1]), "model": model}


def build_lm_low_mem_bf16(tmp_dir):
    """A bf16 checkpoint built directly in bf16 (``-low_mem_init``) with pinned slot caches."""
    path = write_tiny_checkpoint(tmp_dir, model_dtype="bf16")
    _, model, _ = load_test_model(translate_opt(path, max_slots=2, pin_decay=True, low_mem_init=True))
    return {"slots": _decode(model, slots=[1, 0]), "model": model}
