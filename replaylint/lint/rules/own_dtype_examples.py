"""RL006's first examples (its docs and tests, with the rest of its examples): loops, tables,
helpers and policies that give each cache its own dtype, the gate cache float32, and a snapshot
written in the storage format the file chooses."""

from __future__ import annotations

from replaylint.lint.rules.base import Valid

OWN_DTYPE_VALID: tuple[Valid, ...] = (
    Valid(
        """
        import torch

        from .policy import restore_dtype

        def load_rings(layers, state_dict, config):
            for index, layer in enumerate(layers):
                for name in ("d_cache", "k_cache", "g_cache"):
                    key = f"layers.{index}.{name}"
                    # one dtype per ring: the policy is asked with the ring's key
                    dtype = restore_dtype(key, config)
                    layer.register_buffer(name, state_dict[key].to(dtype=dtype))
        """
    ),
    Valid(
        """
        import torch

        def save_snapshot(cache, path, dtype):
            # the file's storage format: reading it back is where a cast is needed
            rings = {name: getattr(cache, name).to(dtype) for name in ("d_cache", "g_cache")}
            torch.save({"rings": rings, "pos": cache.pos}, path)
        """
    ),
    Valid(
        """
        import torch

        class Rings(torch.nn.Module):
            def __init__(self, shapes, dtype):
                super().__init__()
                for name in ("d_cache", "k_cache", "g_cache"):
                    ring_dtype = torch.float32 if name == "g_cache" else dtype
                    self.register_buffer(name, torch.zeros(shapes[name], dtype=ring_dtype))
        """
    ),
    Valid(
        """
        import torch
        DTYPES = {"d_cache": torch.bfloat16, "k_cache": torch.bfloat16, "g_cache": torch.float32}
        caches = {name: torch.empty(shape, dtype=DTYPES[name]) for name in DTYPES}
        """
    ),
    Valid(
        """
        import torch

        def _ring(shape, dtype, device):
            return torch.zeros(shape, dtype=dtype, device=device)

        def build(self, c, device):
            self.d_cache = _ring(c.d_shape, c.dtype, device)
            self.k_cache = _ring(c.k_shape, c.dtype, device)
            self.g_cache = _ring(c.g_shape, torch.float32, device)
        """
    ),
    Valid(
        """
        import torch
        # only d and k share the model dtype
        for name in ("d_cache", "k_cache"):
            setattr(pool, name, torch.zeros(shape, dtype=model_dtype))
        pool.g_cache = torch.zeros(shape, dtype=torch.float32)
        """
    ),
    Valid(
        """
        import torch
        NAMES = ("d_cache", "k_cache", "g_cache")
        DTYPES = (torch.bfloat16, torch.bfloat16, torch.float32)

        class Rings(torch.nn.Module):
            def __init__(self, shape):
                super().__init__()
                # a dtype per iteration: the gate cache's is float32
                for name, dtype in zip(NAMES, DTYPES):
                    self.register_buffer(name, torch.zeros(shape, dtype=dtype))
        """
    ),
)
