"""RL004's examples of module casts (its docs and tests, with the rest of its examples): casts of
models that hold a gate buffer and of modules of no known class (loops that cast every buffer are
in :mod:`.buffer_loop_examples`)."""

from __future__ import annotations

from replaylint.lint.rules.base import Invalid, Valid

MODULE_CAST_VALID: tuple[Valid, ...] = (
    Valid(
        """
        import torch
        from torch import nn

        class ReplayPool(nn.Module):
            _keep_in_fp32_buffers = ("g_cache",)

            def __init__(self, shape, dtype):
                super().__init__()
                self.register_buffer("d_cache", torch.zeros(shape, dtype=dtype))
                self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))

        def cast_buffers(model: nn.Module, dtype):
            for module in model.modules():
                keep = getattr(module, "_keep_in_fp32_buffers", ())
                for name, buf in list(module._buffers.items()):
                    # the buffers a module names stay as they are
                    if buf is None or name in keep:
                        continue
                    module._buffers[name] = buf.to(dtype)

        def narrow_rings(pool: ReplayPool, dtype):
            for name, buf in list(pool._buffers.items()):
                if name == "g_cache":
                    continue
                pool._buffers[name] = buf.to(dtype)
        """
    ),
    Valid(
        """
        import torch
        from torch import nn

        class ReplayPool(nn.Module):
            def __init__(self, shape, dtype):
                super().__init__()
                self.dtype = dtype
                self.register_buffer("d_cache", torch.zeros(shape, dtype=dtype))
                self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))

            def swap_out(self, path):
                tensors = {}
                for name, buf in self.named_buffers():
                    # the gate ring and the state are written exactly, the rest narrowed
                    exact = name.endswith(("g_cache", "ssm_state"))
                    tensors[name] = buf if exact else buf.to(self.dtype)
                torch.save(tensors, path)
        """
    ),
    Valid(
        """
        import torch
        from torch import nn

        class Layer(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))

        class PinnedLayer(Layer):
            def _apply(self, fn, recurse=True):
                g_cache = self._buffers["g_cache"]
                super()._apply(fn, recurse)
                self._buffers["g_cache"] = g_cache.to(device=self._buffers["g_cache"].device)
                return self

        class Stack(nn.Module):
            def __init__(self, n, layers, layer_cls: type[Layer] = Layer):
                super().__init__()
                self.layers = nn.ModuleList(layer_cls(n) for _ in range(layers))

        # this stack is built of layers that keep their gate ring float32
        stack = Stack(4, 2, layer_cls=PinnedLayer).to(torch.bfloat16)
        """
    ),
    Valid(
        """
        import torch
        from torch import nn

        class Attention(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.proj = nn.Linear(dim, dim)

            def setup_cache(self, slots, ring_len):
                # made after the cast below: float32 as allocated
                self.register_buffer("g_cache", torch.zeros(slots, ring_len, dtype=torch.float32))

        def build(dim, slots, ring_len):
            model = Attention(dim).to(torch.bfloat16)  # no gate buffer yet
            model.setup_cache(slots, ring_len)
            return model
        """
    ),
    Valid(
        """
        import torch
        from torch import nn

        class ReplayPool(nn.Module):
            def __init__(self, shape):
                super().__init__()
                self.proj = nn.Linear(4, 4)
                self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))

        def to_serving_dtype(pool, dtype):
            # parameters only: the gate buffer keeps float32
            for param in pool.parameters():
                param.data = param.data.to(dtype)
            return pool
        """
    ),
    Valid(
        """
        import torch
        from torch import nn
        from replaylint.guards import keep_fp32_gate_caches

        class Ring(nn.Module):
            def __init__(self, shape):
                super().__init__()
                self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))
                self.register_buffer("slot_ids", torch.zeros(shape[0], dtype=torch.long))

        @keep_fp32_gate_caches
        class GuardedRing(Ring):
            pass

        def load(shape, device):
            # a device move, a float32 cast, a guarded class: the gate buffer stays float32
            ring = Ring(shape).to(device)
            ring.float()
            return GuardedRing(shape).to(device, torch.bfloat16)
        """
    ),
    Valid(
        """
        import torch
        from torch import nn

        _GATE_DTYPE = torch.float

        def gate_dtype():
            return _GATE_DTYPE

        class Ring(nn.Module):
            def __init__(self, shape):
                super().__init__()
                self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))

            def _apply(self, fn, recurse=True):
                # the class decides what a module cast does: it keeps its gate ring
                g_cache = self.g_cache
                super()._apply(fn, recurse)
                self.g_cache = g_cache.to(device=self.g_cache.device)
                return self

        def snapshot(shape, saved):
            # a helper of the module that returns float32
            g_cache = saved.clone().to(dtype=gate_dtype())
            return Ring(shape).to(torch.bfloat16), g_cache
        """
    ),
    Valid(
        """
        import torch
        from torch import nn
        from replaylint.guards import keep_fp32_gate_caches

        class KimiDeltaAttention(nn.Module):
            def __init__(self, config, layer_idx):
                super().__init__()
                self.register_buffer("replay_g_cache", torch.zeros(4, dtype=torch.float32))

        class KimiModel(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.layers = nn.ModuleList(
                    [KimiDeltaAttention(config, i) for i in range(config.num_layers)]
                )

        class KimiModelFp32Gates(KimiModel):
            def _apply(self, fn, recurse=True):
                # puts every layer's gate ring back to float32 after the cast
                super()._apply(fn, recurse)
                for layer in self.layers:
                    layer.replay_g_cache = layer.replay_g_cache.float()
                return self

        def load(config, device):
            # a device move, a float64 cast, a class and an instance that keep float32
            KimiModel(config).to(device).double()
            KimiModelFp32Gates(config).to(torch.bfloat16)
            model = KimiModel(config).half()
            return keep_fp32_gate_caches(model)
        """
    ),
    Valid(
        """
        import torch
        from torch import nn

        class KDAMixer(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("g_cache", torch.zeros(4, dtype=torch.float32))

        def for_inference(model):
            # the gate buffers go back to float32 right after the cast
            for module in model.modules():
                if isinstance(module, KDAMixer):
                    module.g_cache = module.g_cache.float()
            return model

        def serve(model: nn.Module):
            return for_inference(model.to(torch.bfloat16))
        """
    ),
)
MODULE_CAST_INVALID: tuple[Invalid, ...] = (
    Invalid(
        """
        import torch
        from torch import nn

        class Cache(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))

        class PinnedCache(Cache):
            def _apply(self, fn, recurse=True):
                g_cache = self._buffers["g_cache"]
                super()._apply(fn, recurse)
                self._buffers["g_cache"] = g_cache.to(device=self._buffers["g_cache"].device)
                return self

        class Model(nn.Module):
            def __init__(self, n, cache_cls=PinnedCache):
                super().__init__()
                self.caches = nn.ModuleList(cache_cls(n) for _ in range(2))

        def reference_model(n, dtype):
            # the default cache class keeps float32; this model is given the plain one
            model = Model(n, cache_cls=Cache)
            return model.to(dtype).eval()
        """,
        expected_fix="""
        import replaylint.guards
        import torch
        from torch import nn

        class Cache(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))

        class PinnedCache(Cache):
            def _apply(self, fn, recurse=True):
                g_cache = self._buffers["g_cache"]
                super()._apply(fn, recurse)
                self._buffers["g_cache"] = g_cache.to(device=self._buffers["g_cache"].device)
                return self

        class Model(nn.Module):
            def __init__(self, n, cache_cls=PinnedCache):
                super().__init__()
                self.caches = nn.ModuleList(cache_cls(n) for _ in range(2))

        def reference_model(n, dtype):
            # the default cache class keeps float32; this model is given the plain one
            model = Model(n, cache_cls=Cache)
            return replaylint.guards.keep_fp32_gate_caches(model).to(dtype).eval()
        """,
        message_contains="held by `Model.caches`",
    ),
    Invalid(
        """
        import torch
        from torch import nn

        class MambaPool(nn.Module):
            def __init__(self, shape):
                super().__init__()
                self.register_buffer("ssm_g_cache", torch.zeros(shape, dtype=torch.float32))

        def build(shape, device):
            # the module cast converts the float32 gate buffer: reported where it is cast
            pool = MambaPool(shape).to(device)
            pool.to(device, torch.bfloat16)
            return pool
        """,
        expected_fix="""
        import replaylint.guards
        import torch
        from torch import nn

        class MambaPool(nn.Module):
            def __init__(self, shape):
                super().__init__()
                self.register_buffer("ssm_g_cache", torch.zeros(shape, dtype=torch.float32))

        def build(shape, device):
            # the module cast converts the float32 gate buffer: reported where it is cast
            pool = MambaPool(shape).to(device)
            replaylint.guards.keep_fp32_gate_caches(pool).to(device, torch.bfloat16)
            return pool
        """,
        message_contains="keep_fp32_gate_caches",
    ),
    Invalid(
        """
        import torch
        from torch import nn

        class KimiDeltaCache(nn.Module):
            def __init__(self, shape):
                super().__init__()
                self.g_cache = nn.Buffer(torch.zeros(shape, dtype=torch.float32))

        def build(shape):
            return KimiDeltaCache(shape).half()
        """,
        expected_fix="""
        import replaylint.guards
        import torch
        from torch import nn

        class KimiDeltaCache(nn.Module):
            def __init__(self, shape):
                super().__init__()
                self.g_cache = nn.Buffer(torch.zeros(shape, dtype=torch.float32))

        def build(shape):
            return replaylint.guards.keep_fp32_gate_caches(KimiDeltaCache(shape)).half()
        """,
        message_contains="registered on line 7",
    ),
    Invalid(
        """
        import torch
        from torch import nn

        class KimiDeltaAttention(nn.Module):
            def __init__(self, config, layer_idx):
                super().__init__()
                self.register_buffer("replay_g_cache", torch.zeros(4, dtype=torch.float32))

        class KimiModel(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.layers = nn.ModuleList(
                    [KimiDeltaAttention(config, i) for i in range(config.num_layers)]
                )

        def load(config):
            # the cast recurses into every layer: reported with the path to the buffer
            model = KimiModel(config)
            model = model.to(torch.bfloat16)
            return model
        """,
        expected_fix="""
        import replaylint.guards
        import torch
        from torch import nn

        class KimiDeltaAttention(nn.Module):
            def __init__(self, config, layer_idx):
                super().__init__()
                self.register_buffer("replay_g_cache", torch.zeros(4, dtype=torch.float32))

        class KimiModel(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.layers = nn.ModuleList(
                    [KimiDeltaAttention(config, i) for i in range(config.num_layers)]
                )

        def load(config):
            # the cast recurses into every layer: reported with the path to the buffer
            model = KimiModel(config)
            model = replaylint.guards.keep_fp32_gate_caches(model).to(torch.bfloat16)
            return model
        """,
        message_contains="`model.to(torch.bfloat16)` casts the gate buffer `replay_g_cache` "
        "of `KimiDeltaAttention` (registered on line 7), held by `KimiModel.layers`",
    ),
    Invalid(
        """
        import torch
        from torch import nn

        class KDAMixer(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.g_cache = nn.Buffer(torch.zeros(4, dtype=torch.float32))

        class DecoderLayer(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.mixer = KDAMixer(config)

        class KimiForCausalLM(nn.Module):
            def __init__(self, config):
                super().__init__()
                for i in range(config.num_layers):
                    self.add_module(f"layer{i}", DecoderLayer(config))

            @classmethod
            def from_config(cls, config):
                return cls(config)

        def to_model_dtype(model: KimiForCausalLM, config):
            model.to(config.torch_dtype)

        def fp16_inference(config):
            return KimiForCausalLM.from_config(config).half()
        """,
        expected_fix="""
        import replaylint.guards
        import torch
        from torch import nn

        class KDAMixer(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.g_cache = nn.Buffer(torch.zeros(4, dtype=torch.float32))

        class DecoderLayer(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.mixer = KDAMixer(config)

        class KimiForCausalLM(nn.Module):
            def __init__(self, config):
                super().__init__()
                for i in range(config.num_layers):
                    self.add_module(f"layer{i}", DecoderLayer(config))

            @classmethod
            def from_config(cls, config):
                return cls(config)

        def to_model_dtype(model: KimiForCausalLM, config):
            replaylint.guards.keep_fp32_gate_caches(model).to(config.torch_dtype)

        def fp16_inference(config):
            return replaylint.guards.keep_fp32_gate_caches(KimiForCausalLM.from_config(config)).half()
        """,
        message_contains="held by `DecoderLayer.mixer`, itself held by `KimiForCausalLM.layer{i}`",
    ),
    Invalid(
        """
        import torch
        from torch import nn

        class KDAMixer(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("g_cache", torch.zeros(4, dtype=torch.float32))

        class NaiveMixedPrecision:
            def __init__(self, dtype=torch.float16):
                self.dtype = dtype

            def configure(self, model: nn.Module):
                # any module: a model holding KDAMixer layers loses their float32 gate buffers
                return model.to(dtype=self.dtype)
        """,
        expected_fix="""
        import replaylint.guards
        import torch
        from torch import nn

        class KDAMixer(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("g_cache", torch.zeros(4, dtype=torch.float32))

        class NaiveMixedPrecision:
            def __init__(self, dtype=torch.float16):
                self.dtype = dtype

            def configure(self, model: nn.Module):
                # any module: a model holding KDAMixer layers loses their float32 gate buffers
                return replaylint.guards.keep_fp32_gate_caches(model).to(dtype=self.dtype)
        """,
        message_contains="a module whose class is not known here",
    ),
)
