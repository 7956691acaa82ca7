from .cache import ExLlamaV2Cache, ExLlamaV2Cache_8bit, ExLlamaV2Cache_CPU, ExLlamaV2Cache_Q4, ExLlamaV2CacheBase
from .config import ExLlamaV2Config
from .model import ExLlamaV2
