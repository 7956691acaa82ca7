import torch

from . import ext
from .cache import ExLlamaV2Cache, ExLlamaV2Cache_Q4, ExLlamaV2CacheBase
from .config import ExLlamaV2Config, write_tiny_config
from .kda import ExLlamaV2KDA
from .module import ExLlamaV2Embedding, ExLlamaV2Module, ExLlamaV2RMSNorm


class ExLlamaV2:

    modules: list[ExLlamaV2Module]

    def __init__(self, config: ExLlamaV2Config, lazy_load = False):

        self.config = config
        self.modules = [ExLlamaV2Embedding(self, "model.embed_tokens")]
        self.loaded = False

        kda_idx = 0
        for layer_idx in range(config.num_hidden_layers):
            layer_key = f"model.layers.{layer_idx}"
            self.modules.append(ExLlamaV2RMSNorm(self, layer_key + ".input_layernorm"))
            if layer_idx in config.kda_layer_idx:
                self.modules.append(ExLlamaV2KDA(self, layer_key + ".self_attn", layer_idx, kda_idx))
                kda_idx += 1
        self.modules.append(ExLlamaV2RMSNorm(self, "model.norm"))
        self.modules_dict = {module.key: module for module in self.modules}

    def kda_modules(self) -> list[ExLlamaV2KDA]:
        return [m for m in self.modules if isinstance(m, ExLlamaV2KDA)]

    def load(self, gpu_split = None, lazy = False, stats = False, callback = None, callback_gen = None, progress = False):
        for _ in self.load_gen(gpu_split, lazy, stats, callback, callback_gen):
            pass

    def load_gen(self, gpu_split = None, lazy = False, stats = False, callback = None, callback_gen = None, cache = None):

        with torch.inference_mode():

            # Weights and scratch tensors are created at load time. Build them in half precision
            # directly instead of materializing fp32 and converting, which doubles peak memory
            saved_dtype = torch.get_default_dtype()
            torch.set_default_dtype(torch.half)  # expect-bug: default-dtype id=load-default
            try:
                for idx, module in enumerate(self.modules):
                    if callback is not None: callback(idx, len(self.modules))
                    if callback_gen is not None: yield from callback_gen(idx, len(self.modules))
                    module.load()
                    yield idx, len(self.modules)

                # Lazy caches are allocated once the split is known
                if cache is not None and cache.lazy:
                    cache.create_state_tensors(None)
            finally:
                torch.set_default_dtype(saved_dtype)

        self.loaded = True

    def load_autosplit(self, cache: ExLlamaV2CacheBase, reserve_vram = None, last_id_only = False, callback = None,
                       callback_gen = None, progress = False):
        assert cache.lazy, "load_autosplit requires a cache created with lazy = True"
        for _ in self.load_gen(callback = callback, callback_gen = callback_gen, cache = cache):
            pass

    @torch.inference_mode()
    def forward(self, input_ids, cache = None, attn_params = None, **kwargs):
        """One decode step, input_ids: (batch, 1)"""
        x = input_ids
        for module in self.modules:
            x = module.forward(x, cache = cache, attn_params = attn_params)
        return x


def _decode_once(model, cache):
    bsz = cache.batch_size
    params = ExLlamaV2KDA.Params(bsz, slots = torch.arange(bsz, dtype = torch.int32))
    model.forward((torch.arange(bsz) * 3 + 1).unsqueeze(1), cache, params)
    return dict(ext.LAST_CALL)


def build_model_decode(tmp_dir):
    model = ExLlamaV2(ExLlamaV2Config(write_tiny_config(tmp_dir)))
    cache = ExLlamaV2Cache(model, batch_size = 2, lazy = True)
    model.load_autosplit(cache)
    return {"cache": cache, "decode": _decode_once(model, cache)}


def build_model_decode_q4_cache(tmp_dir):
    model = ExLlamaV2(ExLlamaV2Config(write_tiny_config(tmp_dir)))
    cache = ExLlamaV2Cache_Q4(model, batch_size = 2, lazy = True)
    model.load_autosplit(cache)
    return {"cache": cache, "decode": _decode_once(model, cache)}


def build_model_cacheless(tmp_dir):
    config = ExLlamaV2Config(write_tiny_config(tmp_dir))
    config.kda_cacheless = True
    model = ExLlamaV2(config)
    model.load()
    model.forward(torch.tensor([[5]]))
    rings = {m.key: {"state": m.nc_state, "d": m.nc_d, "k": m.nc_k, "decay": m.nc_decay} for m in model.kda_modules()}
    return {"rings": rings, "decode": dict(ext.LAST_CALL)}
