"""Model and architecture registries, and the base classes of models and decoders
(``fairseq/models/__init__.py``, ``fairseq_decoder.py``, ``fairseq_incremental_decoder.py`` and
``fairseq_model.py``, trimmed to what fs_kda uses)."""

import argparse
import logging
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

import torch
from torch import Tensor, nn

from fs_kda import utils
from fs_kda.utils import with_incremental_state

logger = logging.getLogger(__name__)

MODEL_REGISTRY: Dict[str, Type] = {}
ARCH_MODEL_REGISTRY: Dict[str, Type] = {}
ARCH_MODEL_NAME_REGISTRY: Dict[str, str] = {}
ARCH_MODEL_INV_REGISTRY: Dict[str, list] = {}
ARCH_CONFIG_REGISTRY: Dict[str, Callable[[argparse.Namespace], None]] = {}


def create_model(args: argparse.Namespace, task=None):
    """Applies the architecture defaults of ``args.arch`` and builds the model."""
    if args.arch in ARCH_CONFIG_REGISTRY:
        ARCH_CONFIG_REGISTRY[args.arch](args)
    model_cls = ARCH_MODEL_REGISTRY[args.arch]
    return model_cls.build_model(args, task)


def register_model(name: str):
    """New model types can be added to fs_kda with the :func:`register_model` function decorator."""

    def register_model_cls(cls):
        if name in MODEL_REGISTRY:
            raise ValueError("Cannot register duplicate model ({})".format(name))
        MODEL_REGISTRY[name] = cls
        return cls

    return register_model_cls


def register_model_architecture(model_name: str, arch_name: str):
    """New model architectures can be added with the :func:`register_model_architecture` decorator.

    The decorated function takes a single argument *args*, an :class:`argparse.Namespace`, and
    modifies it in-place to match the desired architecture.
    """

    def register_model_arch_fn(fn):
        if model_name not in MODEL_REGISTRY:
            raise ValueError("Cannot register model architecture for unknown model type ({})".format(model_name))
        if arch_name in ARCH_MODEL_REGISTRY:
            raise ValueError("Cannot register duplicate model architecture ({})".format(arch_name))
        if not callable(fn):
            raise ValueError("Model architecture must be callable ({})".format(arch_name))
        ARCH_MODEL_REGISTRY[arch_name] = MODEL_REGISTRY[model_name]
        ARCH_MODEL_NAME_REGISTRY[arch_name] = model_name
        ARCH_MODEL_INV_REGISTRY.setdefault(model_name, []).append(arch_name)
        ARCH_CONFIG_REGISTRY[arch_name] = fn
        return fn

    return register_model_arch_fn


class FairseqDecoder(nn.Module):
    """Base class for decoders."""

    def __init__(self, padding_idx: int):
        super().__init__()
        self.padding_idx = padding_idx
        self.onnx_trace = False

    def forward(self, prev_output_tokens, encoder_out=None, **kwargs):
        x, extra = self.extract_features(prev_output_tokens, encoder_out=encoder_out, **kwargs)
        x = self.output_layer(x)
        return x, extra

    def extract_features(self, prev_output_tokens, encoder_out=None, **kwargs):
        raise NotImplementedError

    def output_layer(self, features, **kwargs):
        raise NotImplementedError

    def get_normalized_probs(
        self,
        net_output: Tuple[Tensor, Optional[Dict[str, List[Optional[Tensor]]]]],
        log_probs: bool,
        sample: Optional[Dict[str, Tensor]] = None,
    ) -> Tensor:
        logits = net_output[0]
        if log_probs:
            return utils.log_softmax(logits, dim=-1)
        return torch.softmax(logits.float(), dim=-1)

    def max_positions(self) -> int:
        return int(1e6)


@with_incremental_state
class FairseqIncrementalDecoder(FairseqDecoder):
    """Base class for incremental decoders.

    Incremental decoding is a special mode at inference time where the Model only receives a
    single timestep of input corresponding to the previous output token (for teacher forcing)
    and must produce the next output *incrementally*. Thus the model must cache any long-term
    state that is needed about the sequence, e.g., hidden states, convolutional states, etc.
    """

    def __init__(self, padding_idx: int):
        super().__init__(padding_idx)

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **kwargs):
        raise NotImplementedError

    def reorder_incremental_state(
        self,
        incremental_state: Dict[str, Dict[str, Optional[Tensor]]],
        new_order: Tensor,
    ):
        """Reorder incremental state.

        This will be called when the order of the input has changed from the previous time
        step. A typical use case is beam search, where the input order changes between time
        steps based on the selection of beams.
        """
        pass

    def reorder_incremental_state_scripting(
        self,
        incremental_state: Dict[str, Dict[str, Optional[Tensor]]],
        new_order: Tensor,
    ):
        """Main entry point for reordering the incremental state.

        Due to limitations in TorchScript, we call this function in
        :class:`fairseq.sequence_generator.SequenceGenerator` instead of calling
        :func:`reorder_incremental_state` directly.
        """
        for module in self.modules():
            if hasattr(module, "reorder_incremental_state"):
                result = module.reorder_incremental_state(incremental_state, new_order)
                if result is not None:
                    incremental_state = result

    def set_beam_size(self, beam_size: int):
        """Sets the beam size in the decoder and all children."""
        if getattr(self, "_beam_size", -1) != beam_size:
            seen = set()

            def apply_set_beam_size(module):
                if module != self and hasattr(module, "set_beam_size") and module not in seen:
                    seen.add(module)
                    module.set_beam_size(beam_size)

            self.apply(apply_set_beam_size)
            self._beam_size = beam_size


class BaseFairseqModel(nn.Module):
    """Base class for fairseq models."""

    def __init__(self):
        super().__init__()
        self._is_generation_fast = False

    @classmethod
    def add_args(cls, parser: argparse.ArgumentParser) -> None:
        """Add model-specific arguments to the parser."""
        pass

    @classmethod
    def build_model(cls, args: argparse.Namespace, task: Any = None):
        """Build a new model instance."""
        raise NotImplementedError("Model must implement the build_model method")

    def get_normalized_probs(self, net_output, log_probs: bool, sample=None) -> Tensor:
        if hasattr(self, "decoder"):
            return self.decoder.get_normalized_probs(net_output, log_probs, sample)
        raise NotImplementedError

    def max_positions(self):
        return None

    def prepare_for_inference_(self, args: argparse.Namespace) -> None:
        """Prepare model for inference."""
        self.make_generation_fast_()

    def make_generation_fast_(self, **kwargs):
        if self._is_generation_fast:
            return
        self._is_generation_fast = True
        self.eval()


class FairseqLanguageModel(BaseFairseqModel):
    """Base class for decoder-only models."""

    def __init__(self, decoder: FairseqIncrementalDecoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, src_tokens, **kwargs):
        return self.decoder(src_tokens, **kwargs)

    def forward_decoder(self, prev_output_tokens, **kwargs):
        return self.decoder(prev_output_tokens, **kwargs)

    def extract_features(self, src_tokens, **kwargs):
        return self.decoder.extract_features(src_tokens, **kwargs)

    def max_positions(self):
        return self.decoder.max_positions()

    @property
    def supported_targets(self):
        return {"future"}


# fairseq imports every module of the directory; there is one model here
from fs_kda.models import kda_lm  # noqa: E402,F401
