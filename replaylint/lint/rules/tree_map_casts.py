"""RL006's library maps over the rings: ``tree_map(lambda t: t.to(dtype), self.rings)`` casts
every tensor of the container the same way, the gate ring among them.

The container's keys must be known (a dict literal, a local or ``self`` attribute bound to one,
a function of the project returning one) and one of them a gate cache's. The lambda's body is
evaluated as a cast of the tensor it is handed; a body that keeps float32 tensors as they are
(``t.to(dtype) if t.dtype != torch.float32 else t``) casts no gate ring. There is no fix: the
lambda never sees a key, so it cannot be told which tensor is the gate ring; the message says to
cast the other rings only.
"""

from __future__ import annotations

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.facts import Kind
from replaylint.lint.dataflow.provenance import Provenance
from replaylint.lint.dataflow.strings import mapping_keys
from replaylint.lint.dataflow.tree_maps import tree_map_of
from replaylint.lint.rules.base import Invalid, Valid
from replaylint.lint.rules.loop_treatment import shared_treatment
from replaylint.lint.rules.shared_helpers import HelperFinding
from replaylint.lint.rules.wording import WHY, named_gate_cache
from replaylint.lint.syntax.nodes import one_line
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import descendants

__all__ = ["TREE_MAP_INVALID", "TREE_MAP_VALID", "tree_map_finding"]


def tree_map_finding(
    context: FileContext, prov: Provenance, call: cst.Call, site: Site
) -> HelperFinding | None:
    """The finding for ``call`` when it is a library map that casts a container's gate ring."""
    mapped = tree_map_of(prov.index, call)
    if mapped is None or _picks_by_dtype(mapped.body, mapped.parameter):
        return None
    keys = mapping_keys(prov, mapped.tree, site)
    gates = [key for key in keys or () if context.gate_caches.matches(key)]
    if not gates or keys is None or len(keys) < 2:
        return None
    for fact in prov.tensor_facts(mapped.body, site):
        if fact.kind is not Kind.CAST or not prov.within(fact.node, mapped.body):
            continue
        if fact.dtypes and all(d.is_float32 for d in fact.dtypes):
            continue
        subject = named_gate_cache(context.gate_caches, gates[0])
        tree = one_line(context.module, mapped.tree)
        return HelperFinding(
            fact.node,
            f"{subject} is cast by `{mapped.name}` over `{tree}`, which gives every tensor of "
            f"it {shared_treatment(context.module, fact)}; cast the other rings only, or "
            f"keep float32 tensors as they are ({WHY})",
            None,
        )
    return None


def _picks_by_dtype(body: cst.BaseExpression, parameter: str) -> bool:
    """Whether the lambda's body chooses by the tensor's dtype (``t if t.dtype == torch.float32
    else t.to(dtype)``): what it does to a float32 gate ring is not read."""
    return any(
        isinstance(node, cst.IfExp)
        and any(
            isinstance(read, cst.Attribute)
            and read.attr.value == "dtype"
            and isinstance(read.value, cst.Name)
            and read.value.value == parameter
            for read in descendants(node.test)
        )
        for node in descendants(body)
    )


TREE_MAP_VALID: tuple[Valid, ...] = (
    Valid(
        """
        import torch
        from torch.utils._pytree import tree_map

        class Pool:
            def __init__(self, n, dtype):
                self.rings = {
                    "d_cache": torch.zeros(n, 64, dtype=dtype),
                    "g_cache": torch.zeros(n, 64, dtype=torch.float32),
                }

            def to_device(self, device):
                # a move keeps every ring's dtype
                self.rings = tree_map(lambda t: t.to(device), self.rings)
        """
    ),
    Valid(
        """
        import torch
        from torch.utils._pytree import tree_map

        class Pool:
            def __init__(self, n, dtype):
                self.rings = {
                    "d_cache": torch.zeros(n, 64, dtype=dtype),
                    "g_cache": torch.zeros(n, 64, dtype=torch.float32),
                }

            def compact(self, dtype):
                # float32 tensors, the gate ring among them, are kept as they are
                self.rings = tree_map(
                    lambda t: t if t.dtype == torch.float32 else t.to(dtype), self.rings
                )
        """
    ),
)

TREE_MAP_INVALID: tuple[Invalid, ...] = (
    Invalid(
        """
        import torch
        from torch.utils._pytree import tree_map

        class Pool:
            def __init__(self, n, dtype):
                self.rings = {
                    "d_cache": torch.zeros(n, 64, dtype=dtype),
                    "g_cache": torch.zeros(n, 64, dtype=torch.float32),
                }

            def compact(self, dtype):
                # every ring, the gate ring too, in the activations' dtype
                self.rings = tree_map(lambda t: t.to(dtype), self.rings)
        """,
        message_contains="is cast by `tree_map` over `self.rings`",
    ),
    Invalid(
        """
        import torch
        from lightning_utilities.core.apply_func import apply_to_collection

        def ring_kwargs(pool):
            return {"d_cache": pool.d, "k_cache": pool.k, "g_cache": pool.g}

        def half_rings(pool):
            return apply_to_collection(ring_kwargs(pool), torch.Tensor, lambda t: t.half())
        """,
        message_contains="the same cast (`.half()`)",
    ),
)
