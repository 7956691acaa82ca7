"""RL004's module casts: ``model.to(torch.bfloat16)`` converts the gate buffers a model holds.

One question per cast call, answered from the most to the least that is known of the receiver:
an instance of a gate-buffer class of this module (or of a class that holds one through its
submodules), an instance of such a class imported from another module of the project, a module
handed a gate-buffer submodule in the function that casts it (``draft.cache = Cache(...)``), and a
module of no known class (``model: nn.Module``, ``self`` in a mixin) in a project or module
whose classes hold a gate buffer. A guarded instance is never reported, nor a cast whose result
goes straight into a function that puts the gate buffer back to float32 (:mod:`replaylint.lint.dataflow.recasts`).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.facts import DtypeFact
from replaylint.lint.dataflow.given_submodules import given_gate_holder
from replaylint.lint.dataflow.imported_modules import imported_gate_buffer
from replaylint.lint.dataflow.modules import module_cast, module_cast_dtypes
from replaylint.lint.dataflow.provenance import Provenance
from replaylint.lint.dataflow.recasts import undone_for
from replaylint.lint.dataflow.submodules import (
    GateBufferHolders,
    gate_buffer_holders,
    guarded_instance,
    held_module_cast,
)
from replaylint.lint.dataflow.unknown_modules import chain_root, unknown_module
from replaylint.lint.fixes.drafts import FixDraft
from replaylint.lint.fixes.guard import protect_before_cast
from replaylint.lint.rules.base import Invalid, Valid
from replaylint.lint.rules.buffer_loops import as_module_cast, buffer_loop_cast
from replaylint.lint.rules.wording import (
    given_holder_cast_message,
    imported_cast_message,
    module_cast_message,
    unknown_module_cast_message,
)
from replaylint.lint.syntax.nodes import one_line
from replaylint.lint.syntax.sites import Site


@dataclass(frozen=True)
class ModuleCastFinding:
    message: str
    fix: FixDraft | None


class ModuleCasts:
    """Answers for the module casts of one file (the module's holders are read once)."""

    def __init__(self, context: FileContext, prov: Provenance) -> None:
        self._context = context
        self._prov = prov
        self._holders: GateBufferHolders | None = None
        self._bases: frozenset[str] | None = None
        self._index = prov.project.index if prov.project is not None else None

    def finding(self, call: cst.Call, site: Site) -> ModuleCastFinding | None:
        """The finding for ``call`` when it casts a module holding a float32 gate buffer to a
        dtype not provably float32, and the module is not guarded."""
        prov, module = self._prov, self._context.module
        if self._holders is None:
            self._holders = gate_buffer_holders(prov, prov.gate_buffers())
        holders = self._holders
        if not isinstance(call.func, cst.Attribute):
            return None
        if holders.buffers:
            cast = module_cast(prov, call, site, holders.buffers) or held_module_cast(
                prov, call, site, holders
            )
            if cast is not None:
                if guarded_instance(prov, call, site) or undone_for(
                    prov, call, site, cast.buffer.name
                ):
                    return None
                fix = protect_before_cast(module, call, cast.buffer.name)
                return ModuleCastFinding(module_cast_message(self._context, call, cast), fix)
        imports_holder = prov.imports_gate_buffer_holder()
        index = self._index
        if not (holders.buffers or imports_holder or (index is not None and index.holder_names)):
            return None  # no gate-buffer class this cast could convert: its dtype is not asked
        dtypes = module_cast_dtypes(prov, call, site)
        if dtypes is None or guarded_instance(prov, call, site):
            return None
        if imports_holder:
            imported = imported_gate_buffer(prov, call.func.value, site)
            if imported is not None and not undone_for(prov, call, site, imported.name):
                message = imported_cast_message(module, call, imported, dtypes)
                return ModuleCastFinding(message, protect_before_cast(module, call, imported.name))
        given = given_gate_holder(prov, chain_root(call.func.value), site)
        if given is not None and not undone_for(prov, call, site, given.buffer):
            registered = given.registered
            where = (
                registered
                if isinstance(registered, str)
                else f"line {self._context.line_of(registered)}"
            )
            line = self._context.line_of(given.assignment)
            message = given_holder_cast_message(module, call, given, line, where, dtypes)
            return ModuleCastFinding(message, protect_before_cast(module, call, given.buffer))
        return self._unknown_class(call, call.func.value, holders, site, dtypes)

    def buffer_loop_finding(self, loop: cst.For, site: Site) -> tuple[cst.Call, str] | None:
        """``for buf in model.buffers(): buf.data = buf.data.half()`` (or ``named_buffers()``,
        ``.to(dtype)``): the cast of every buffer of ``model``, reported like ``model.half()``
        at the cast in the loop, without a fix (a guard would go before the loop)."""
        found = buffer_loop_cast(loop)
        if found is None:
            return None
        owner, cast = found
        whole = as_module_cast(owner, cast)  # `model.half()`
        finding = self.finding(whole, site)
        if finding is None:
            return None
        module = self._context.module
        written = f"`{one_line(module, whole)}`"
        loop_text = f"`{one_line(module, cast)}` over `{one_line(module, loop.iter)}`"
        return cast, finding.message.replace(written, loop_text, 1)

    def _unknown_class(
        self,
        call: cst.Call,
        receiver: cst.BaseExpression,
        holders: GateBufferHolders,
        site: Site,
        dtypes: tuple[DtypeFact, ...],
    ) -> ModuleCastFinding | None:
        """A cast of ``model: nn.Module`` or of ``self`` in a base of a gate-buffer class."""
        prov, module, index = self._prov, self._context.module, self._index
        local = next(iter(holders.buffers.values()), None)
        if not unknown_module(prov, receiver, site, self._holder_bases(holders)):
            return None
        if local is not None:
            holder, name = local.cls.name.value, local.name
            where = f"on line {self._context.line_of(local.node)}"
        elif index is not None and index.holder_example is not None:
            example = index.holder_example
            holder, name = example.cls, example.name
            where = f"at {example.origin.path}:{example.origin.line}"
            owner = index.module_of(example.origin.path)
            if owner is not None:
                index.summary(owner)  # the finding depends on the holder's module
        else:
            return None
        if undone_for(prov, call, site, name):
            return None
        others = {buffer.name for buffer in holders.buffers.values()}
        if index is not None:
            others |= index.holder_buffers
        message = unknown_module_cast_message(module, call, holder, name, where, dtypes)
        fix = protect_before_cast(module, call, name, sorted(others - {name}))
        return ModuleCastFinding(message, fix)

    def _holder_bases(self, holders: GateBufferHolders) -> frozenset[str]:
        """The classes gate-buffer classes derive from: of this module, and of the project."""
        if self._bases is None:
            bases = {
                base.name.value
                for name in holders.buffers
                for base in holders.classes.mro(holders.classes.by_name[name])[1:]
            }
            if self._index is not None:
                bases |= self._index.holder_bases
            self._bases = frozenset(bases)
        return self._bases


# RL004's examples of module casts (its docs and tests, with the rest of its examples)
MODULE_CAST_VALID: tuple[Valid, ...] = (
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

        class Ring(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.register_buffer("d_cache", torch.zeros(n))
                self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))

        def export(ring: Ring, dtype=None):
            # every floating buffer narrowed for the transfer, the gate ring's too
            tensors = {}
            for name, buf in ring.named_buffers():
                if dtype is not None and buf.is_floating_point():
                    buf = buf.to(dtype)
                tensors[name] = buf
            return tensors
        """,
        message_contains="`buf.to(dtype)` over `ring.named_buffers()` casts every floating buffer",
    ),
    Invalid(
        """
        import copy

        import torch
        from torch import nn

        class ReplayPool(nn.Module):
            def __init__(self, shape):
                super().__init__()
                self.register_buffer("g_cache", torch.zeros(shape, dtype=torch.float32))

        def serving_copy(shape, dtype):
            # casting every buffer in a loop is the module cast written out
            replica = copy.deepcopy(ReplayPool(shape))
            for name, buf in replica.named_buffers():
                if buf.is_floating_point():
                    buf.data = buf.data.to(dtype)
            return replica
        """,
        message_contains="over `replica.named_buffers()` casts every floating buffer",
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
