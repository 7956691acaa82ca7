"""ReplaySSM decoding for Kimi Delta Attention, organised the way diffusers organises models and pipelines."""

__version__ = "0.1.0.dev0"

from .configuration_utils import ConfigMixin, register_to_config
from .models import KDATransformerModel, ModelMixin
from .pipelines import DiffusionPipeline, KDADecodePipeline
