"""RL006's examples of caches that share one dtype (its docs and tests, with the rest of its
examples): loops, comprehensions, helpers and records that give the gate cache the dtype of the
other caches, and loops over cache names whose helper call passes each cache its own dtype."""

from __future__ import annotations

from replaylint.lint.rules.base import Invalid, Valid
from replaylint.lint.rules.layer_key_examples import LAYER_KEY_INVALID, LAYER_KEY_VALID
from replaylint.lint.rules.tree_map_casts import TREE_MAP_INVALID, TREE_MAP_VALID

SHARED_DTYPE_INVALID: tuple[Invalid, ...] = (
    Invalid(
        """
        import torch

        class Rings:
            def resize(self, slots):
                # short keys: the gate ring's entry is the one read into it
                grown = {
                    name: torch.zeros(slots, *ring.shape[1:], dtype=self.dtype)
                    for name, ring in (("d", self.d_cache), ("k", self.k_cache), ("gate", self.g_cache))
                }
                self.d_cache, self.k_cache = grown["d"], grown["k"]
                self.g_cache = grown.pop("gate")
        """,
        expected_fix="""
        import torch

        class Rings:
            def resize(self, slots):
                # short keys: the gate ring's entry is the one read into it
                grown = {
                    name: torch.zeros(slots, *ring.shape[1:], dtype=torch.float32 if name == "gate" else self.dtype)
                    for name, ring in (("d", self.d_cache), ("k", self.k_cache), ("gate", self.g_cache))
                }
                self.d_cache, self.k_cache = grown["d"], grown["k"]
                self.g_cache = grown.pop("gate")
        """,
        message_contains="gate cache `g_cache` is allocated by a comprehension",
    ),
    Invalid(
        """
        from typing import NamedTuple

        import torch

        class RingSpec(NamedTuple):
            name: str
            shape: tuple
            dtype: torch.dtype = torch.bfloat16

        def new_rings(shape, dtype):
            # the gate ring's spec leaves its dtype to the record's default
            specs = (RingSpec("d_cache", shape, dtype), RingSpec("g_cache", shape))
            return {spec.name: torch.zeros(spec.shape, dtype=spec.dtype) for spec in specs}
        """,
        message_contains="by a comprehension over `specs`",
    ),
    Invalid(
        """
        import torch

        class Rings:
            def __init__(self, layers, shape, dtype):
                self.dtype = dtype
                self.d_cache = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
                self.k_cache = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
                self.g_cache = [torch.zeros(shape, dtype=torch.float32) for _ in range(layers)]

            def grow(self, slots):
                for name in ("d_cache", "k_cache", "g_cache"):
                    rings = getattr(self, name)  # one list per ring name, an entry per layer
                    for i, ring in enumerate(rings):
                        grown = torch.zeros((slots, *ring.shape[1:]), dtype=self.dtype)
                        grown[: ring.shape[0]] = ring
                        rings[i] = grown
        """,
        expected_fix="""
        import torch

        class Rings:
            def __init__(self, layers, shape, dtype):
                self.dtype = dtype
                self.d_cache = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
                self.k_cache = [torch.zeros(shape, dtype=dtype) for _ in range(layers)]
                self.g_cache = [torch.zeros(shape, dtype=torch.float32) for _ in range(layers)]

            def grow(self, slots):
                for name in ("d_cache", "k_cache", "g_cache"):
                    rings = getattr(self, name)  # one list per ring name, an entry per layer
                    for i, ring in enumerate(rings):
                        grown = torch.zeros((slots, *ring.shape[1:]), dtype=torch.float32 if name == "g_cache" else self.dtype)
                        grown[: ring.shape[0]] = ring
                        rings[i] = grown
        """,
        message_contains='by a loop over `("d_cache", "k_cache", "g_cache")`',
    ),
    Invalid(
        """
        import torch

        def swap_in(cache, path):
            snapshot = torch.load(path)
            for name in ("d_cache", "k_cache", "g_cache"):
                ring = snapshot[name]
                setattr(cache, name, ring)
        """,
        expected_fix="""
        import torch

        def swap_in(cache, path):
            snapshot = torch.load(path)
            for name in ("d_cache", "k_cache", "g_cache"):
                ring = snapshot[name].to(torch.float32) if name == "g_cache" else snapshot[name]
                setattr(cache, name, ring)
        """,
        message_contains="keeps it in the dtype it was saved with",
    ),
    Invalid(
        """
        import torch

        def new_rings(shapes, dtype):
            rings = {}
            for name in ("state", "d_cache", "k_cache", "g_cache"):
                ring_dtype = torch.float32 if name == "state" else dtype
                rings[name] = torch.zeros(shapes[name], dtype=ring_dtype)
            return rings
        """,
        expected_fix="""
        import torch

        def new_rings(shapes, dtype):
            rings = {}
            for name in ("state", "d_cache", "k_cache", "g_cache"):
                ring_dtype = torch.float32 if name == "state" else dtype
                rings[name] = torch.zeros(shapes[name], dtype=torch.float32 if name == "g_cache" else ring_dtype)
            return rings
        """,
        message_contains='whose dtype `torch.float32 if name == "state" else dtype` keeps',
    ),
    Invalid(
        """
        import torch

        def swap_in(cache, path, shapes):
            snapshot = torch.load(path)
            for name in ("d_cache", "k_cache", "g_cache"):
                setattr(cache, name, snapshot[name].view(shapes[name]))
        """,
        expected_fix="""
        import torch

        def swap_in(cache, path, shapes):
            snapshot = torch.load(path)
            for name in ("d_cache", "k_cache", "g_cache"):
                setattr(cache, name, (snapshot[name].to(torch.float32) if name == "g_cache" else snapshot[name]).view(shapes[name]))
        """,
    ),
    Invalid(
        """
        import torch

        class Rings(torch.nn.Module):
            def __init__(self, shapes, dtype):
                super().__init__()
                for name in ("d_cache", "k_cache", "g_cache"):
                    self.register_buffer(name, torch.zeros(shapes[name], dtype=dtype))
        """,
        expected_fix="""
        import torch

        class Rings(torch.nn.Module):
            def __init__(self, shapes, dtype):
                super().__init__()
                for name in ("d_cache", "k_cache", "g_cache"):
                    self.register_buffer(name, torch.zeros(shapes[name], dtype=torch.float32 if name == "g_cache" else dtype))
        """,
        message_contains='loop over `("d_cache", "k_cache", "g_cache")`',
    ),
    Invalid(
        """
        import torch
        RINGS = ("d", "k", "g")

        class Rings:
            def __init__(self, shape, dev):
                self.caches = {f"{kind}_cache": torch.empty(shape, device=dev) for kind in RINGS}
        """,
        expected_fix="""
        import torch
        RINGS = ("d", "k", "g")

        class Rings:
            def __init__(self, shape, dev):
                self.caches = {f"{kind}_cache": torch.empty(shape, device=dev, dtype=torch.float32 if kind == "g" else None) for kind in RINGS}
        """,
    ),
    Invalid(
        """
        import torch

        class Pool:
            def _ring(self, shape, dtype):
                return torch.zeros(shape, dtype=dtype, device=self.device)

            def allocate(self, c):
                self.d_cache = self._ring(c.d_shape, c.dtype)
                self.g_cache = self._ring(c.g_shape, c.dtype)
        """,
        expected_fix="""
        import torch

        class Pool:
            def _ring(self, shape, dtype):
                return torch.zeros(shape, dtype=dtype, device=self.device)

            def allocate(self, c):
                self.d_cache = self._ring(c.d_shape, c.dtype)
                self.g_cache = self._ring(c.g_shape, torch.float32)
        """,
        message_contains="`_ring`",
    ),
    Invalid(
        """
        import torch

        def snapshot(pool, dtype):
            for name, ring in {"d_cache": pool.d_cache, "g_cache": pool.g_cache}.items():
                setattr(pool, name, ring.to(dtype=dtype))
        """,
        expected_fix="""
        import torch

        def snapshot(pool, dtype):
            for name, ring in {"d_cache": pool.d_cache, "g_cache": pool.g_cache}.items():
                setattr(pool, name, ring.to(dtype=torch.float32 if name == "g_cache" else dtype))
        """,
    ),
    Invalid(
        """
        import torch

        def grow(pool, rows):
            d = pool.d_cache.new_zeros(rows, *pool.d_cache.shape[1:])
            g = d.new_zeros(rows, *pool.g_cache.shape[1:])
            for name, new in zip(("d_cache", "g_cache"), (d, g)):
                setattr(pool, name, new)
        """,
        expected_fix="""
        import torch

        def grow(pool, rows):
            d = pool.d_cache.new_zeros(rows, *pool.d_cache.shape[1:])
            g = d.new_zeros(rows, *pool.g_cache.shape[1:], dtype=torch.float32)
            for name, new in zip(("d_cache", "g_cache"), (d, g)):
                setattr(pool, name, new)
        """,
    ),
    Invalid(
        """
        import torch

        def half_(pool):
            for name in ("d_cache", "k_cache", "g_cache"):
                setattr(pool, name, getattr(pool, name).half())
        """,
        expected_fix="""
        import torch

        def half_(pool):
            for name in ("d_cache", "k_cache", "g_cache"):
                setattr(pool, name, (getattr(pool, name).to(torch.float32, copy=True) if name == "g_cache" else getattr(pool, name).half()))
        """,
    ),
    Invalid(
        """
        import torch

        def alloc_rings(shapes, dtype):
            return {name: torch.zeros(shape, dtype=dtype) for name, shape in shapes.items()}

        def host_rings(shapes, g_shape, dtype):
            return alloc_rings({**shapes, "g_cache": g_shape}, dtype)
        """,
        expected_fix="""
        import torch

        def alloc_rings(shapes, dtype):
            return {name: torch.zeros(shape, dtype=dtype) for name, shape in shapes.items()}

        def host_rings(shapes, g_shape, dtype):
            return {**alloc_rings({**shapes, "g_cache": g_shape}, dtype), **alloc_rings({"g_cache": g_shape}, torch.float32)}
        """,
        message_contains="which gives every entry of",
    ),
    Invalid(
        """
        import torch

        def alloc_rings(shapes, dtype, device):
            return {name: torch.zeros(shape, dtype=dtype, device=device) for name, shape in shapes.items()}

        class Engine:
            def __init__(self, n):
                self.shapes = {"d_cache": (n, 4), "k_cache": (n, 4), "g_cache": (n, 4)}

            def allocate(self, dtype, device=None):
                # every ring of `self.shapes`, the gate ring's among them, in one dtype
                for name, ring in alloc_rings(self.shapes, dtype, device).items():
                    setattr(self, name, ring)
        """,
        expected_fix="""
        import torch

        def alloc_rings(shapes, dtype, device):
            return {name: torch.zeros(shape, dtype=dtype, device=device) for name, shape in shapes.items()}

        class Engine:
            def __init__(self, n):
                self.shapes = {"d_cache": (n, 4), "k_cache": (n, 4), "g_cache": (n, 4)}

            def allocate(self, dtype, device=None):
                # every ring of `self.shapes`, the gate ring's among them, in one dtype
                for name, ring in {**alloc_rings(self.shapes, dtype, device), **alloc_rings({"g_cache": self.shapes["g_cache"]}, torch.float32, device)}.items():
                    setattr(self, name, ring)
        """,
        message_contains="which gives every entry of",
    ),
    Invalid(
        """
        import torch
        d_cache, k_cache, g_cache = (torch.zeros(shape, dtype=dtype) for _ in range(3))
        """,
        expected_fix="""
        import torch
        d_cache, k_cache, g_cache = (torch.zeros(shape, dtype=dtype) for _ in range(3))
        g_cache = torch.zeros_like(g_cache, dtype=torch.float32)
        """,
        message_contains="one comprehension",
    ),
    Invalid(
        """
        from typing import NamedTuple

        import torch

        class Rings(NamedTuple):
            d_cache: torch.Tensor
            k_cache: torch.Tensor
            g_cache: torch.Tensor

        def host_copy(rings: Rings, dtype):
            # the gate ring's field is filled by the same cast as the others
            return Rings(*(t.to("cpu", dtype=dtype) for t in rings))
        """,
        expected_fix="""
        from typing import NamedTuple

        import torch

        class Rings(NamedTuple):
            d_cache: torch.Tensor
            k_cache: torch.Tensor
            g_cache: torch.Tensor

        def host_copy(rings: Rings, dtype):
            # the gate ring's field is filled by the same cast as the others
            return Rings(*(t.to("cpu", dtype=torch.float32 if position == 2 else dtype) for position, t in enumerate(rings)))
        """,
        message_contains="is filled from one comprehension that gives every field of `Rings`",
    ),
    Invalid(
        """
        import torch

        class HostRings:
            def __post_init__(self):
                # graph capture reads the rings in the activation dtype
                self.d_cache, self.k_cache, self.g_cache = (
                    t.to(self.dtype) for t in (self.d_cache, self.k_cache, self.g_cache)
                )
        """,
        expected_fix="""
        import torch

        class HostRings:
            def __post_init__(self):
                # graph capture reads the rings in the activation dtype
                self.d_cache, self.k_cache, self.g_cache = (
                    t.to(torch.float32 if position == 2 else self.dtype) for position, t in enumerate((self.d_cache, self.k_cache, self.g_cache))
                )
        """,
        message_contains="the same cast (`.to(self.dtype)`)",
    ),
    Invalid(
        """
        import torch
        from typing import NamedTuple

        class ReplayState(NamedTuple):
            d_cache: torch.Tensor
            k_cache: torch.Tensor
            g_cache: torch.Tensor

        def to_device(host, index, device, dtype):
            return ReplayState(*(t.index_select(0, index).to(device, dtype=dtype) for t in host.as_state()))
        """,
        expected_fix="""
        import torch
        from typing import NamedTuple

        class ReplayState(NamedTuple):
            d_cache: torch.Tensor
            k_cache: torch.Tensor
            g_cache: torch.Tensor

        def to_device(host, index, device, dtype):
            return ReplayState(*(t.index_select(0, index).to(device, dtype=torch.float32 if position == 2 else dtype) for position, t in enumerate(host.as_state())))
        """,
        message_contains="is filled from one comprehension",
    ),
    Invalid(
        """
        import torch

        def _alloc(shape, dtype, device="cpu"):
            return torch.zeros(shape, dtype=dtype, device=device)

        RING_SHAPES = {"d_cache": (4, 2, 8, 16), "k_cache": (4, 2, 8, 16), "g_cache": (4, 2, 8, 16)}

        class RingPool:
            def __init__(self, config):
                self.buffers = {}
                for name, shape in RING_SHAPES.items():
                    self.buffers[name] = _alloc(shape, config.cache_dtype)
        """,
        expected_fix="""
        import torch

        def _alloc(shape, dtype, device="cpu"):
            return torch.zeros(shape, dtype=dtype, device=device)

        RING_SHAPES = {"d_cache": (4, 2, 8, 16), "k_cache": (4, 2, 8, 16), "g_cache": (4, 2, 8, 16)}

        class RingPool:
            def __init__(self, config):
                self.buffers = {}
                for name, shape in RING_SHAPES.items():
                    self.buffers[name] = _alloc(shape, torch.float32 if name == "g_cache" else config.cache_dtype)
        """,
        message_contains="is allocated in a loop over `RING_SHAPES.items()` by `_alloc`",
    ),
    Invalid(
        """
        from typing import NamedTuple

        import torch

        class Rings(NamedTuple):
            d_cache: torch.Tensor
            k_cache: torch.Tensor
            g_cache: torch.Tensor
            write_pos: torch.Tensor

        def to_activations(rings: Rings, x):
            # every floating field follows the activations; the positions stay integers
            return Rings(*(t.to(x.dtype) if t.is_floating_point() else t for t in rings))
        """,
        expected_fix="""
        from typing import NamedTuple

        import torch

        class Rings(NamedTuple):
            d_cache: torch.Tensor
            k_cache: torch.Tensor
            g_cache: torch.Tensor
            write_pos: torch.Tensor

        def to_activations(rings: Rings, x):
            # every floating field follows the activations; the positions stay integers
            return Rings(*(t.to(torch.float32 if position == 2 else x.dtype) if t.is_floating_point() else t for position, t in enumerate(rings)))
        """,
        message_contains="the same cast (`.to(x.dtype)`)",
    ),
    *TREE_MAP_INVALID,
    *LAYER_KEY_INVALID,
)

SHARED_DTYPE_VALID: tuple[Valid, ...] = (
    Valid(
        """
        from typing import NamedTuple

        import torch

        class RingSpec(NamedTuple):
            name: str
            shape: tuple
            dtype: torch.dtype = torch.bfloat16

        def new_rings(shape, dtype):
            specs = (RingSpec("d_cache", shape, dtype), RingSpec("g_cache", shape, torch.float32))
            return {spec.name: torch.zeros(spec.shape, dtype=spec.dtype) for spec in specs}
        """
    ),
    Valid(
        """
        import torch

        class Rings:
            def __init__(self, shape, dtype):
                self.dtype = dtype
                self.d_cache = torch.zeros(shape, dtype=dtype)
                self.g_cache = torch.zeros(shape, dtype=torch.float32)

            def clear_slot(self, slot):
                for name in ("d_cache", "g_cache"):
                    ring = getattr(self, name)  # a tensor: item assignment copies into it
                    ring[slot] = torch.zeros(ring.shape[1:], dtype=self.dtype)
        """
    ),
    Valid(
        """
        import torch

        RING_SHAPES = {"d_cache": (4, 2, 8, 16), "k_cache": (4, 2, 8, 16), "g_cache": (4, 2, 8, 16)}

        def _alloc(shape, dtype, device="cpu"):
            return torch.zeros(shape, dtype=dtype, device=device)

        def allocate(dtype):
            # the helper is handed each ring's own dtype
            dtypes = {"d_cache": dtype, "k_cache": dtype, "g_cache": torch.float32}
            return {name: _alloc(shape, dtypes[name]) for name, shape in RING_SHAPES.items()}
        """
    ),
    *TREE_MAP_VALID,
    *LAYER_KEY_VALID,
)
