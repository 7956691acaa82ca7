"""RL006's examples of loops over the rings and their layers (its docs and tests, with the rest
of its examples): entries keyed by a ring's name and a layer's index, and lists that take each
ring cast in turn."""

from __future__ import annotations

from replaylint.lint.rules.base import Invalid, Valid

LAYER_KEY_INVALID: tuple[Invalid, ...] = (
    Invalid(
        """
        import torch

        RINGS = ("d_cache", "k_cache", "g_cache")

        def host_arrays(pool):
            # one entry per ring and layer, keyed `"g_cache/0"`, `"g_cache/1"`, ...
            arrays = {}
            for name in RINGS:
                for layer, ring in enumerate(getattr(pool, name)):
                    arrays[f"{name}/{layer}"] = ring.cpu().half().numpy()
            return arrays
        """,
        expected_fix="""
        import torch

        RINGS = ("d_cache", "k_cache", "g_cache")

        def host_arrays(pool):
            # one entry per ring and layer, keyed `"g_cache/0"`, `"g_cache/1"`, ...
            arrays = {}
            for name in RINGS:
                for layer, ring in enumerate(getattr(pool, name)):
                    arrays[f"{name}/{layer}"] = (ring.cpu().to(torch.float32, copy=True) if name == "g_cache" else ring.cpu().half()).numpy()
            return arrays
        """,
        message_contains="the same cast (`.half()`)",
    ),
    Invalid(
        """
        import torch

        RINGS = ("d_cache", "k_cache", "g_cache")

        def pinned_copies(pool):
            # one host copy per ring, in the order of RINGS
            copies = []
            for name in RINGS:
                copies.append(getattr(pool, name).cpu().half())
            return copies
        """,
        expected_fix="""
        import torch

        RINGS = ("d_cache", "k_cache", "g_cache")

        def pinned_copies(pool):
            # one host copy per ring, in the order of RINGS
            copies = []
            for name in RINGS:
                copies.append((getattr(pool, name).cpu().to(torch.float32, copy=True) if name == "g_cache" else getattr(pool, name).cpu().half()))
            return copies
        """,
        message_contains="is cast by a loop over `RINGS`",
    ),
)

LAYER_KEY_VALID: tuple[Valid, ...] = (
    Valid(
        """
        import torch

        RINGS = ("d_cache", "k_cache", "g_cache")

        def ring_scales(pool, dtype):
            # `"g_cache.scale/0"` is a scale kept beside the ring, not the ring
            scales = {}
            for name in RINGS:
                for layer, ring in enumerate(getattr(pool, name)):
                    scales[f"{name}.scale/{layer}"] = ring.abs().amax().to(dtype)
            return scales
        """
    ),
    Valid(
        """
        import torch

        RINGS = ("d_cache", "k_cache", "g_cache")

        def ring_norms(pool):
            # a float32 reduction of each ring, the gate ring's included, is no cast of a ring
            return [getattr(pool, name).float().norm() for name in RINGS]
        """
    ),
)
