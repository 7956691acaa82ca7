from .attention_processor import KDAAttention, KDAReplayCacheProcessor, KDAReplayProcessor, StaticKDAReplayProcessor
from .modeling_utils import ModelMixin
from .transformer_kda import KDATransformerModel, ReplayCaches, ReplayStateCache, Transformer2DModelOutput
