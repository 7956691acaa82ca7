"""Ensemble decoding.

Decodes using multiple models simultaneously,
combining their prediction distributions by averaging.
All models in the ensemble must share a target vocabulary.
"""

import torch
import torch.nn as nn

from onmt_kda import model_builder
from onmt_kda.decoders.kda_decoder import DecoderBase


class EnsembleDecoderOutput(object):
    """Wrapper around multiple decoder final hidden states."""

    def __init__(self, model_dec_outs):
        self.model_dec_outs = tuple(model_dec_outs)

    def squeeze(self, dim=None):
        """Delegate squeeze to avoid modifying Translator.translate_batch()."""
        return EnsembleDecoderOutput([x.squeeze(dim) for x in self.model_dec_outs])

    def __getitem__(self, index):
        return self.model_dec_outs[index]


def _blank_like(layer_cache):
    """A zeroed layer cache with the layout of ``layer_cache``."""
    state, delta = layer_cache["ssm_state"], layer_cache["delta_mem"]
    return {
        "ssm_state": state.new_zeros(state.shape),
        "delta_mem": delta.new_zeros(delta.shape),
        "key_mem": delta.new_zeros(layer_cache["key_mem"].shape),
        "log_forget": delta.new_zeros(layer_cache["log_forget"].shape),  # expect-bug: like
        "write_pos": layer_cache["write_pos"].new_zeros(layer_cache["write_pos"].shape),
    }


class EnsembleDecoder(DecoderBase):
    """Dummy Decoder that delegates to individual real Decoders."""

    def __init__(self, model_decoders):
        super(EnsembleDecoder, self).__init__()
        self.model_decoders = nn.ModuleList(model_decoders)

    @property
    def dtype(self):
        return self.model_decoders[0].dtype

    def forward(self, tgt, enc_out=None, src_len=None, step=None, **kwargs):
        """See :func:`onmt.decoders.decoder.DecoderBase.forward()`."""
        dec_outs, attns = zip(*[model_decoder(tgt, None, step=step, **kwargs) for model_decoder in self.model_decoders])
        return EnsembleDecoderOutput(dec_outs), {}

    def init_state(self, src, enc_out=None, enc_final_hs=None):
        """The first member allocates its cache; the others (same architecture) get a blank copy."""
        first = self.model_decoders[0]
        first.init_state(src, enc_out, enc_final_hs)
        for model_decoder in self.model_decoders[1:]:
            cache = {name: _blank_like(layer_cache) for name, layer_cache in first.state["cache"].items()}
            model_decoder.state = {"src": src, "slot_idx": None, "cache": cache}
            if model_decoder.dtype != first.dtype:
                model_decoder.map_state(lambda state, dim: state.to(model_decoder.dtype) if state.is_floating_point() else state)  # expect-bug: cast

    def map_state(self, fn):
        for model_decoder in self.model_decoders:
            model_decoder.map_state(fn)


class EnsembleGenerator(nn.Module):
    """Dummy Generator that delegates to individual real Generators,
    and then averages the resulting target distributions.
    """

    def __init__(self, model_generators, raw_probs=False):
        super(EnsembleGenerator, self).__init__()
        self.model_generators = nn.ModuleList(model_generators)
        self._raw_probs = raw_probs

    def forward(self, hidden):
        distributions = torch.stack([mg(h) for h, mg in zip(hidden, self.model_generators)])
        if self._raw_probs:
            return torch.log(torch.exp(distributions).mean(0))
        return distributions.mean(0)


class EnsembleModel(nn.Module):
    """Dummy NMTModel wrapping individual real NMTModels."""

    def __init__(self, models, raw_probs=False):
        super(EnsembleModel, self).__init__()
        self.models = nn.ModuleList(models)
        self.decoder = EnsembleDecoder(model.decoder for model in models)
        self.generator = EnsembleGenerator([model.generator for model in models], raw_probs)


def load_test_model(opt, device_id=0):
    """Read in multiple models for ensemble."""
    shared_vocab, shared_model_opt, models = None, None, []
    for model_path in opt.models:
        vocab, model, model_opt = model_builder.load_test_model(opt, device_id, model_path=model_path)
        if shared_vocab is None:
            shared_vocab = vocab
        elif vocab != shared_vocab:
            raise ValueError("Ensemble models must use the same vocabulary")
        models.append(model)
        if shared_model_opt is None:
            shared_model_opt = model_opt
    ensemble_model = EnsembleModel(models, opt.avg_raw_probs)
    return shared_vocab, ensemble_model, shared_model_opt


def _ensemble(tmp_dir, dtypes, **kwargs):
    from onmt_kda.translate.translator import PROMPTS, build_translator

    paths = [model_builder.write_tiny_checkpoint(tmp_dir, name=f"member{i}_{dtype}", model_dtype=dtype)
             for i, dtype in enumerate(dtypes)]
    opt = model_builder.translate_opt(paths[0], max_length=4, **kwargs)
    opt.models = paths
    translator = build_translator(opt, report_score=False)
    translator.translate(PROMPTS)
    return [model_decoder.state["cache"] for model_decoder in translator.model.decoder.model_decoders]


def build_ensemble_fp32(tmp_dir):
    """Two float32 members decoded with beam search."""
    return _ensemble(tmp_dir, ["fp32", "fp32"], beam_size=2)


def build_ensemble_low_precision(tmp_dir):
    """Two bf16 members, and a float32 member ensembled with a bf16 one."""
    return {"bf16": _ensemble(tmp_dir, ["bf16", "bf16"], beam_size=2),
            "mixed": _ensemble(tmp_dir, ["fp32", "bf16"], beam_size=1)}
