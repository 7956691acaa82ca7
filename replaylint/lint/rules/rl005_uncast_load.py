"""RL005: a gate cache loaded or restored from a checkpoint without a cast to float32."""

from __future__ import annotations

from dataclasses import replace

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.facts import CastValue, Kind
from replaylint.lint.dataflow.imported_modules import assigned_gate_buffer
from replaylint.lint.dataflow.modules import GateBuffer, assigning_load, loads_by_assigning
from replaylint.lint.fixes.conditional import conditional_fix
from replaylint.lint.gatecache.bindings import GateCacheBinding
from replaylint.lint.model import Applicability
from replaylint.lint.rules.base import Invalid, Rule, Valid
from replaylint.lint.rules.loop_treatment import gate_name_test
from replaylint.lint.rules.restored_attributes import restored_by_setattr
from replaylint.lint.rules.unlisted_keys import gate_attributes_read
from replaylint.lint.rules.wording import FIX_SAFETY, WHY, through


class UncastLoad(Rule):
    SUMMARY = "A gate cache is loaded or restored from a checkpoint without a cast to float32."
    RATIONALE = """\
A loaded tensor has the dtype it was saved with. Snapshots of ReplaySSM state (preemption, prefix
caching, disaggregated prefill handing state to a decode server, offloading to host memory) are
often written in the model dtype to save space, or by an older version that kept every ring in
bf16. Binding the loaded tensor as the gate ring then makes the ring bf16 — and the decode kernel
exponentiates prefix sums of its log-decays, so bf16 rounding becomes a ~1.5% relative error in the
decays at ring length 16 that compounds at every flush into the checkpoint.

Recognised loads: `torch.load(...)` and `safetensors.torch.load_file(...)` (directly or through a
local), `safe_open(...).get_tensor(key)`, `state_dict[key]` / `checkpoint.get(key)` / `checkpoint.pop(key)` where the
container was loaded or is a parameter named like a state dict or checkpoint, and
`torch.from_numpy(np.load(...))` (`np.memmap`, `np.fromfile`, and `np.array(...)` /
`np.asarray(...)` of such an array, and its `.astype(dtype)` to a dtype not provably float32,
included), `pickle.load(...)`, a tensor handed over by another library or process
(`torch.utils.dlpack.from_dlpack(...)`, `torch.from_dlpack(...)`), and raw bytes read with
`torch.frombuffer(raw, dtype=...)` in any dtype but float32 (the fix casts the result: reading the
same bytes as float32 would give other numbers). The load is followed through device moves
(`torch.load(path, mmap=True).to(device)`) and into generators and helpers that return or yield
it. Not a finding: copying into an existing float32 gate cache
(`g_cache.copy_(src)`, `g_cache[idx] = src`, `load_state_dict(sd)` with `strict` either way),
which casts on the way in, or a load followed by `.float()` / `.to(torch.float32)` /
`.to(dtype=torch.float32)`. A dict that is merely passed around (`kwargs.get("replayssm_g")`) is
not a checkpoint.

A loop that restores every entry of a loaded mapping as an attribute (`for name, t in
snapshot.items(): setattr(cache, name, t)`) is reported when the object holds a gate cache (the
function, its class or the object's class names `cache.g_cache`; the object's class is also found
for an attribute, `self.pool = RingPool(...)`, and for a loop over a function annotated to return
`Iterator[tuple[str, ReplayCache]]`, in this module or another module of the project): that
attribute comes back as saved. The fix casts the entry for the gate cache's name only (`t.to(torch.float32) if name ==
"g_cache" else t`).

`module.load_state_dict(checkpoint, assign=True)` is the exception: it keeps the loaded tensors
as the module's buffers instead of copying into them (the usual way to fill a module built on the
meta device), so the gate buffer takes the dtype the checkpoint was saved in. It is reported at
the call when the checkpoint is read from disk in the function and the module is an instance of
a class that registers a gate buffer (`register_buffer` or `nn.Buffer`): a class of the module, or
of another module of the project, also a part another class installs on each of its layers
(`b.attention.cache` of `for b in model.layers`), whatever its cast overrides do, unless the
class is guarded with `replaylint.guards.keep_fp32_gate_caches`, or the function replaces
entries of the loaded mapping before the call (`state["g_cache"] = state["g_cache"].float()`).
That finding has no fix: cast the gate entry before loading, or load without `assign=True`.
"""
    FIX = (
        """\
Appends `.to(torch.float32)` to the loaded tensor (spelled with the module's alias for torch;
`import torch` is added when missing). The fix is **safe**: upcasting bf16 or fp16 to float32 is
exact, a float32 tensor is returned as is (no copy, same object), and nothing else about the
loaded value — device, shape, layout — changes.
"""
        + FIX_SAFETY
    )
    FIX_APPLICABILITY = Applicability.SAFE

    VALID = (
        Valid(
            """
            import torch

            def restore(self, path):
                state = torch.load(path, map_location="cpu")
                # copy_ casts into the existing float32 ring
                self.g_cache.copy_(state["g_cache"])
                self.g_cache[:, 0] = state["g_cache_row"]
                self.d_cache = state["d_cache"]
            """
        ),
        Valid(
            """
            import torch
            from safetensors.torch import load_file

            def restore(path, device):
                tensors = load_file(path)
                g_cache = tensors["g_cache"].to(device=device, dtype=torch.float32)
                replayssm_g = tensors["replayssm_g"].float()
                return g_cache, replayssm_g
            """
        ),
        Valid(
            """
            def packed_decode(self, mixed_qkv, **kwargs):
                # a dict of live tensors passed by the caller is not a checkpoint
                replayssm_g = kwargs.get("replayssm_g")
                return self.kernel(mixed_qkv, g_cache=replayssm_g)
            """
        ),
        Valid(
            """
            import torch

            def resume(self, state_dict):
                # loading into the module copies into the float32 buffer
                self.load_state_dict(state_dict)
                self.g_cache = state_dict["g_cache"].to(torch.float32)
            """
        ),
        Valid(
            """
            import numpy as np
            import torch

            def from_peer(raw, path):
                # read as float32 bytes, or converted to float32 on the way
                g_cache = torch.frombuffer(raw, dtype=torch.float32)
                ring = np.memmap(path, dtype=np.float16, mode="r")
                replayssm_g = torch.from_numpy(np.array(ring, dtype=np.float32))
                return g_cache, replayssm_g
            """
        ),
        Valid(
            """
            import torch
            from torch import nn

            class StatePool(nn.Module):
                def __init__(self, shape):
                    super().__init__()
                    self.g_cache = nn.Buffer(torch.zeros(shape, dtype=torch.float32))

            def restore(path, shape):
                pool = StatePool(shape)
                # copies into the float32 buffer, strict or not
                pool.load_state_dict(torch.load(path, mmap=True), strict=False)
                return pool
            """
        ),
        Valid(
            """
            import torch
            from torch import nn

            class StatePool(nn.Module):
                def __init__(self, shape):
                    super().__init__()
                    self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))

            def restore(path, shape):
                with torch.device("meta"):
                    pool = StatePool(shape)
                state = torch.load(path, mmap=True)
                # the gate entry is made float32 before the module adopts the loaded tensors
                state["g_cache"] = state["g_cache"].float()
                pool.load_state_dict(state, assign=True)
                return pool
            """
        ),
        Valid(
            """
            import torch

            class ReplayCache:
                def __init__(self, shape):
                    self.d_cache = torch.zeros(shape, dtype=torch.bfloat16)
                    self.g_cache = torch.zeros(shape, dtype=torch.float32)

            def restore(path, shape):
                cache = ReplayCache(shape)
                for name, ring in torch.load(path)["rings"].items():
                    # copied into the float32 ring: the copy casts
                    getattr(cache, name).copy_(ring)
                return cache
            """
        ),
    )
    INVALID = (
        Invalid(
            """
            import numpy as np
            import torch

            def restore(pool, path):
                for name, array in np.load(path).items():
                    if name == "g_cache":
                        pool.g_cache = torch.from_numpy(array)
            """,
            expected_fix="""
            import numpy as np
            import torch

            def restore(pool, path):
                for name, array in np.load(path).items():
                    if name == "g_cache":
                        pool.g_cache = torch.from_numpy(array).to(torch.float32)
            """,
            message_contains="is loaded from a numpy array read from a file",
        ),
        Invalid(
            """
            import torch

            def restore(self, path):
                state = torch.load(path, map_location="cpu")
                self.g_cache = state["g_cache"]
            """,
            expected_fix="""
            import torch

            def restore(self, path):
                state = torch.load(path, map_location="cpu")
                self.g_cache = state["g_cache"].to(torch.float32)
            """,
            message_contains="`state` (a checkpoint)",
        ),
        Invalid(
            """
            from safetensors import safe_open

            def restore(path):
                with safe_open(path, framework="pt") as f:
                    replayssm_g = f.get_tensor("replayssm_g").cuda()
                return replayssm_g
            """,
            expected_fix="""
            import torch
            from safetensors import safe_open

            def restore(path):
                with safe_open(path, framework="pt") as f:
                    replayssm_g = f.get_tensor("replayssm_g").to(torch.float32).cuda()
                return replayssm_g
            """,
        ),
        Invalid(
            """
            import torch

            class Pool:
                def load_state_dict(self, state_dict):
                    self.g_cache = state_dict.get("g_cache")
            """,
            expected_fix="""
            import torch

            class Pool:
                def load_state_dict(self, state_dict):
                    self.g_cache = state_dict.get("g_cache").to(torch.float32)
            """,
        ),
        Invalid(
            """
            import numpy as np
            import torch as th

            def from_disk(path):
                return {"g_cache": th.from_numpy(np.load(path))}
            """,
            expected_fix="""
            import numpy as np
            import torch as th

            def from_disk(path):
                return {"g_cache": th.from_numpy(np.load(path)).to(th.float32)}
            """,
            message_contains="numpy array read from a file",
        ),
        Invalid(
            """
            import torch
            g_cache = torch.load("g_cache.pt")
            """,
            expected_fix="""
            import torch
            g_cache = torch.load("g_cache.pt").to(torch.float32)
            """,
        ),
        Invalid(
            """
            from safetensors.torch import load_file

            def restore(path):
                g_cache = load_file(path)  # a dict of tensors
                return g_cache
            """,
            expected_fix=None,
            message_contains="cast each one",
        ),
        Invalid(
            """
            import torch

            def from_peer(raw):
                # the bytes are bf16: read them as such, then cast
                g_cache = torch.frombuffer(raw, dtype=torch.bfloat16)
                return g_cache
            """,
            expected_fix="""
            import torch

            def from_peer(raw):
                # the bytes are bf16: read them as such, then cast
                g_cache = torch.frombuffer(raw, dtype=torch.bfloat16).to(torch.float32)
                return g_cache
            """,
            message_contains="raw bytes read as `torch.bfloat16`",
        ),
        Invalid(
            """
            import pickle
            import numpy as np
            import torch

            def restore(handle, path):
                gate_cache = pickle.load(handle)
                g_cache = torch.from_numpy(np.asarray(np.memmap(path, dtype=np.float16)))
                return gate_cache, g_cache
            """,
            expected_fix="""
            import pickle
            import numpy as np
            import torch

            def restore(handle, path):
                gate_cache = pickle.load(handle).to(torch.float32)
                g_cache = torch.from_numpy(np.asarray(np.memmap(path, dtype=np.float16))).to(torch.float32)
                return gate_cache, g_cache
            """,
        ),
        Invalid(
            """
            import torch
            from torch import nn

            class StatePool(nn.Module):
                def __init__(self, shape):
                    super().__init__()
                    self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))

            def restore(path, shape):
                with torch.device("meta"):
                    pool = StatePool(shape)
                pool.load_state_dict(torch.load(path, mmap=True), assign=True)
                return pool
            """,
            message_contains="registered on line 7",
        ),
        Invalid(
            """
            import torch
            from torch import nn

            class StatePool(nn.Module):
                def __init__(self, shape):
                    super().__init__()
                    self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))

            def restore(path, shape, assign: bool = True):
                # the default keeps the memory-mapped storage, and the saved dtype with it
                pool = StatePool(shape)
                pool.load_state_dict(torch.load(path, mmap=True), assign=assign)
                return pool
            """,
            message_contains="assign=True",
        ),
        Invalid(
            """
            import torch

            def restore(self, path):
                state = torch.load(path, map_location="cpu")
                self.g_cache = state.pop("g_cache")
                self.load_state_dict(state)
            """,
            expected_fix="""
            import torch

            def restore(self, path):
                state = torch.load(path, map_location="cpu")
                self.g_cache = state.pop("g_cache").to(torch.float32)
                self.load_state_dict(state)
            """,
        ),
        Invalid(
            """
            import torch

            class ReplayCache:
                def __init__(self, shape):
                    self.d_cache = torch.zeros(shape, dtype=torch.bfloat16)
                    self.g_cache = torch.zeros(shape, dtype=torch.float32)

            def restore(path, shape):
                cache = ReplayCache(shape)
                for name, ring in torch.load(path)["rings"].items():
                    setattr(cache, name, ring)
                return cache
            """,
            expected_fix="""
            import torch

            class ReplayCache:
                def __init__(self, shape):
                    self.d_cache = torch.zeros(shape, dtype=torch.bfloat16)
                    self.g_cache = torch.zeros(shape, dtype=torch.float32)

            def restore(path, shape):
                cache = ReplayCache(shape)
                for name, ring in torch.load(path)["rings"].items():
                    setattr(cache, name, ring.to(torch.float32) if name == "g_cache" else ring)
                return cache
            """,
            message_contains="restored by `setattr` from every entry of",
        ),
        Invalid(
            """
            import torch

            class RingPool:
                def __init__(self, shapes, dtype):
                    for name, shape in shapes.items():
                        kind = torch.float32 if name == "g_cache" else dtype
                        setattr(self, name, torch.zeros(shape, dtype=kind))

                def layer(self, i):
                    return self.d_cache[i], self.k_cache[i], self.g_cache[i]

            class Engine:
                def __init__(self, shapes, dtype):
                    self.pool = RingPool(shapes, dtype)

                def wake_up(self, path):
                    # the pool's class keeps `g_cache`: the loop may replace it
                    for name, tensor in torch.load(path).items():
                        setattr(self.pool, name, tensor.to("cuda"))
            """,
            expected_fix="""
            import torch

            class RingPool:
                def __init__(self, shapes, dtype):
                    for name, shape in shapes.items():
                        kind = torch.float32 if name == "g_cache" else dtype
                        setattr(self, name, torch.zeros(shape, dtype=kind))

                def layer(self, i):
                    return self.d_cache[i], self.k_cache[i], self.g_cache[i]

            class Engine:
                def __init__(self, shapes, dtype):
                    self.pool = RingPool(shapes, dtype)

                def wake_up(self, path):
                    # the pool's class keeps `g_cache`: the loop may replace it
                    for name, tensor in torch.load(path).items():
                        setattr(self.pool, name, tensor.to("cuda").to(torch.float32) if name == "g_cache" else tensor.to("cuda"))
            """,
            message_contains="`self.pool.g_cache`",
        ),
    )

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        self._buffers: dict[str, GateBuffer] | None = None

    def visit_Call(self, node: cst.Call) -> None:
        site = self.site()
        if not loads_by_assigning(self.provenance, node, site):
            return
        assert isinstance(node.func, cst.Attribute)
        receiver = node.func.value
        if self._buffers is None:
            self._buffers = self.provenance.gate_buffers()
        buffer = (
            assigning_load(self.provenance, receiver, site, self._buffers)
            if self._buffers
            else None
        )
        if buffer is not None:
            owner, name = buffer.cls.name.value, buffer.name
            where = f"registered on line {self.context.line_of(buffer.node)}"
        elif (held := assigned_gate_buffer(self.provenance, receiver, site)) is not None:
            # an instance of another module's class that registers a gate buffer
            owner, name = held.cls, held.name
            where = f"registered at {held.origin.path}:{held.origin.line}"
        else:
            return
        self.report(
            node,
            f"`load_state_dict(..., assign=True)` keeps the tensors loaded from disk as the "
            f"buffers of `{owner}`, in the dtype they were saved with, its gate cache "
            f"`{name}` ({where}) included; {WHY}; cast that entry "
            "to float32 before loading, or load without `assign=True` (copying into the float32 "
            "buffer keeps its dtype)",
        )

    def visit_For(self, node: cst.For) -> None:
        site = self.site()

        def read_elsewhere(owner: cst.Name | cst.Attribute) -> set[str]:
            return gate_attributes_read(self.context, owner, site)

        restores = restored_by_setattr(
            self.provenance, self.context.gate_caches, node, site, read_elsewhere
        )
        for restore in restores:
            rings = ", ".join(f"`{restore.owner}.{name}`" for name in restore.gate_caches)
            load = restore.load
            cast = CastValue(restore.value)
            self.report(
                restore.value,
                f"gate cache {rings} is restored by `setattr` from every entry of "
                f"{load.detail}, without a cast to float32; it keeps the dtype it was saved with, "
                f"and {WHY}",
                fix=conditional_fix(
                    self.context.module,
                    self.context.spelling.torch_at(site),
                    replace(load, target=cast),
                    gate_name_test(restore.key, [{restore.key: n} for n in restore.gate_caches])
                    or "",
                ),
            )

    def check_binding(self, binding: GateCacheBinding) -> None:
        for fact in self.facts(binding):
            if fact.kind is not Kind.LOADED:
                continue
            # A dict (safetensors) or a per-layer list (a plural name) has no `.to`.
            container = (
                fact.target is None
                or self.context.gate_caches.is_plural(binding.name)
                or (binding.holds_list and not _built_sequence(binding.value))
                or _sequence_of(binding.value, *(b.value for b in fact.via))
            )
            note = (
                "; it holds several tensors, so cast each one "
                "(`{k: v.float() for k, v in loaded.items()}`, `[g.float() for g in loaded]`)"
                if container and not self.withheld(binding, fact)
                else ""
            )
            self.report(
                fact.node,
                f"{self.subject(binding)} is loaded from {fact.detail} without a cast to float32"
                f"{through(self.context, fact)}; it keeps the dtype it was saved with, and {WHY}{self.withheld(binding, fact)}{note}",
                fix=self.fix_for(
                    binding,
                    fact,
                    None if container else fact.target,
                    "Cast it with .to({float32})",
                    Applicability.SAFE,
                ),
            )


def _built_sequence(value: cst.BaseExpression) -> bool:
    """``[torch.from_numpy(a) for a in arrays]``: a list the statement builds, whose elements
    are cast one by one (a value that is the whole list, loaded, has no ``.to``)."""
    return isinstance(value, (cst.List, cst.ListComp, cst.Tuple, cst.GeneratorExp))


def _sequence_of(*values: cst.BaseExpression | None) -> bool:
    """Whether one of ``values`` is ``list(...)`` or ``tuple(...)``: what was loaded is a
    sequence of tensors (``list(snapshot["decay"])``), which has no ``.to``."""
    return any(
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Name)
        and value.func.value in {"list", "tuple"}
        for value in values
    )
