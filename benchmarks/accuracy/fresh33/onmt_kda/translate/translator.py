#!/usr/bin/env python
"""Translator: generation from a decoder-only KDA model, batch by batch."""

import os

import torch

from onmt_kda import model_builder
from onmt_kda.decoders import ensemble
from onmt_kda.decoders.kda_decoder import RING_KEYS
from onmt_kda.models import model_saver
from onmt_kda.modules import replayssm
from onmt_kda.translate.decode_strategy import BeamSearch, GreedySearch
from onmt_kda.utils import misc


def _translator_from_opt(opt, report_score=True, logger=None, out_file=None):
    load_test_model = ensemble.load_test_model if len(opt.models) > 1 else model_builder.load_test_model
    vocab, model, model_opt = load_test_model(opt)
    return Translator.from_opt(model, vocab, opt, model_opt, report_score=report_score, logger=logger)


build_translator = _translator_from_opt


class Translator(object):
    """Translate a batch of sentences with a saved model."""

    def __init__(self, model, vocab, gpu=-1, n_best=1, min_length=0, max_length=100, beam_size=30,
                 parallel_prefill=False, keep_state=False, precision="", seed=-1, report_score=True, logger=None):
        self.model, self.vocab = model, vocab
        self._pad, self._bos, self._eos = vocab.index("<blank>"), vocab.index("<s>"), vocab.index("</s>")
        self._use_cuda = gpu > -1
        self._dev = torch.device("cuda", gpu) if self._use_cuda else torch.device("cpu")
        self.n_best, self.min_length, self.max_length, self.beam_size = n_best, min_length, max_length, beam_size
        self.parallel_prefill, self.keep_state, self.precision = parallel_prefill, keep_state, precision
        self.report_score, self.logger = report_score, logger
        self._carry = None
        misc.set_random_seed(seed, self._use_cuda)

    @classmethod
    def from_opt(cls, model, vocab, opt, model_opt, report_score=True, logger=None):
        return cls(model, vocab, gpu=opt.gpu, n_best=opt.n_best, min_length=opt.min_length, max_length=opt.max_length,
                   beam_size=opt.beam_size, parallel_prefill=opt.parallel_prefill, keep_state=opt.keep_state,
                   precision=opt.precision or model_opt.model_dtype, seed=opt.seed, report_score=report_score, logger=logger)

    @property
    def _dtype(self):
        return self.model.decoder.dtype

    def translate(self, src, batch_size=None):
        """Generates continuations of ``src`` (token lists); returns ``(all_scores, all_predictions)``."""
        batch_size = batch_size or len(src)
        all_scores, all_predictions = [], []
        for start in range(0, len(src), batch_size):
            ids = [[self.vocab.index(t) if t in self.vocab else 0 for t in x] for x in src[start:start + batch_size]]
            width = max(len(x) for x in ids)
            batch = {"src": torch.tensor([[self._pad] * (width - len(x)) + x for x in ids], device=self._dev),
                     "srclen": torch.tensor([len(x) for x in ids])}
            results = self.translate_batch(batch)
            all_scores += results["scores"]
            all_predictions += [[[self.vocab[t] for t in pred] for pred in preds] for preds in results["predictions"]]
        return all_scores, all_predictions

    def translate_batch(self, batch):
        batch_size = len(batch["srclen"])
        if self.beam_size == 1:
            decode_strategy = GreedySearch(self._pad, self._bos, self._eos, batch_size, self.n_best, self.min_length, self.max_length)
        else:
            decode_strategy = BeamSearch(self.beam_size, batch_size, self._pad, self._bos, self._eos, self.n_best,
                                         self.min_length, self.max_length)
        with torch.no_grad():
            return self._translate_batch_with_strategy(batch, decode_strategy)

    def _run_prompt(self, src):
        decoder = self.model.decoder
        if self.keep_state and self._carry is not None:
            self._extend_carry(src.size(0))
            decoder.state = {"src": src, "slot_idx": None, "cache": self._carry}
        else:
            decoder.init_state(src, None, None)
        if self.parallel_prefill and hasattr(decoder, "prefill") and src.size(1) < decoder.ring_len:
            dec_out, _ = decoder.prefill(src)
        else:
            dec_out, _ = decoder(src)
        if isinstance(dec_out, ensemble.EnsembleDecoderOutput):
            return self.model.generator(ensemble.EnsembleDecoderOutput([out[:, -1] for out in dec_out.model_dec_outs]))
        return self.model.generator(dec_out[:, -1])

    def _decode_and_generate(self, decoder_in, step):
        dec_out, dec_attn = self.model.decoder(decoder_in.view(-1, 1), step=step)
        return self.model.generator(dec_out.squeeze(1))

    def _translate_batch_with_strategy(self, batch, decode_strategy):
        log_probs = self._run_prompt(batch["src"])
        fn_map_state = decode_strategy.initialize(batch["src"], batch["srclen"], device=self._dev)
        if fn_map_state is not None:
            log_probs = fn_map_state(log_probs, 0)
            self.model.decoder.map_state(fn_map_state)
        for step in range(decode_strategy.max_length):
            decode_strategy.advance(log_probs)
            if decode_strategy.done:
                break
            select_indices = decode_strategy.select_indices
            if decode_strategy.parallel_paths > 1:
                self.model.decoder.map_state(lambda state, dim: state.index_select(dim, select_indices))
            log_probs = self._decode_and_generate(decode_strategy.current_predictions, step)
        if self.keep_state:
            self._carry = self.model.decoder.state["cache"]
        return {"scores": decode_strategy.scores, "predictions": decode_strategy.predictions, "batch": batch}

    def _extend_carry(self, batch_size):
        """New streams in a batch start from zeros next to the carried ones."""
        for layer_cache in self._carry.values():
            delta = layer_cache["delta_mem"]
            if batch_size > delta.size(0):
                for key, t in list(layer_cache.items()):
                    blank = (delta if t.is_floating_point() else t).new_zeros((batch_size - delta.size(0), *t.shape[1:]))
                    layer_cache[key] = torch.cat([t, blank])

    def save_state(self, path):
        """Writes the carried decoder state (``-keep_state``) for a later run to resume from."""
        model_saver.save_decode_state(path, self._carry, half=self.precision == "fp16")

    def load_state(self, path):
        cache = model_saver.load_decode_state(path)
        for layer_cache in cache.values():
            if layer_cache["delta_mem"].dtype != self._dtype:
                # saved by a run in another precision
                for key in RING_KEYS:
                    layer_cache[key] = layer_cache[key].to(self._dtype)  # expect-bug: cast
        self._carry = cache  # expect-bug: load id=half-state

    def continue_slots(self, src, slot_idx, max_length=None):
        """Feeds ``src [B, T]`` on slots ``slot_idx`` of the slot caches, then decodes greedily."""
        with torch.no_grad():
            self.model.decoder.bind_slots(slot_idx)
            dec_out, _ = self.model.decoder(src)
            log_probs, preds = self.model.generator(dec_out[:, -1]), []
            for step in range(max_length or self.max_length):
                preds.append(log_probs.argmax(-1))
                log_probs = self._decode_and_generate(preds[-1], step)
        return torch.stack(preds, 1)


PROMPTS = [list("abc"), list("dce")]


def _translator(tmp_dir, ckpt=None, **kwargs):
    path = ckpt or model_builder.write_tiny_checkpoint(tmp_dir)
    return build_translator(model_builder.translate_opt(path, max_length=4, **kwargs), report_score=False)


def build_translate_bf16(tmp_dir):
    """bf16 beam search, a float32 parallel prefill, a bf16 stream carried over two calls, and a
    float32 stream saved and resumed."""
    beam = _translator(tmp_dir, precision="bf16", beam_size=2)
    beam.translate(PROMPTS)
    prefill = _translator(tmp_dir, beam_size=1, parallel_prefill=True)
    prefill.translate(PROMPTS)
    stream = _translator(tmp_dir, precision="bf16", beam_size=1, keep_state=True)
    stream.translate(PROMPTS[:1])
    stream.translate(PROMPTS)
    saved = _translator(tmp_dir, beam_size=1, keep_state=True)
    saved.translate(PROMPTS)
    saved.save_state(os.path.join(tmp_dir, "stream.pt"))
    resumed = _translator(tmp_dir, beam_size=1, keep_state=True)
    resumed.load_state(os.path.join(tmp_dir, "stream.pt"))
    resumed.translate(PROMPTS)
    return {"beam": beam.model.decoder.state["cache"], "prefill": prefill.model.decoder.state["cache"],
            "stream": stream._carry, "resumed": resumed._carry, "decode": dict(replayssm.last_call())}


def build_translate_legacy_fp16(tmp_dir):
    """An fp16 checkpoint saved by an older version, decoded with beam search."""
    translator = _translator(tmp_dir, ckpt=model_builder.write_tiny_checkpoint(tmp_dir, legacy=True, model_dtype="fp16"), beam_size=2)
    translator.translate(PROMPTS)
    return translator.model.decoder.state


def build_translate_resume_fp16(tmp_dir):
    """fp16 streams resumed from a state saved in fp16, and from one saved by a float32 run."""
    carried = {}
    for name, precision in (("fp16", "fp16"), ("fp32", "fp32")):
        saved = _translator(tmp_dir, precision=precision, beam_size=1, keep_state=True)
        saved.translate(PROMPTS)
        saved.save_state(os.path.join(tmp_dir, f"{name}.pt"))
        resumed = _translator(tmp_dir, precision="fp16", beam_size=1, keep_state=True)
        resumed.load_state(os.path.join(tmp_dir, f"{name}.pt"))
        resumed.translate(PROMPTS)
        carried[name] = resumed._carry
    return carried


def build_translate_fp32_rings_bf16(tmp_dir):
    """bf16 greedy decoding with float32 delta/key rings (``-ring_dtype fp32``)."""
    translator = _translator(tmp_dir, precision="bf16", beam_size=1, ring_dtype="fp32")
    translator.translate(PROMPTS)
    return {"cache": translator.model.decoder.state["cache"], "decode": dict(replayssm.last_call())}
