from .dynamic import CachePage, ExLlamaV2DynamicGenerator, ExLlamaV2DynamicJob
