"""The rule unit: one self-contained class of code, message, rationale, fix and examples.

A rule's code and name come from its module's name (``rl001_explicit_non_fp32_dtype.py`` holds
``RL001``, ``explicit-non-fp32-dtype``); its class attributes are its documentation
(``replaylint rule RL001`` and ``docs/rules/`` are generated from them) and its ``VALID`` /
``INVALID`` examples are its tests. Every enabled rule of a run sees a file in one shared
traversal: :meth:`Rule.check_binding` receives each gate-cache binding the
:class:`~replaylint.lint.gatecache.bindings.BindingWalker` finds, and a rule may visit other nodes
(``visit_For``, ``visit_Call``) as a libcst visitor does.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import libcst as cst

from replaylint.lint.context import FileContext
from replaylint.lint.dataflow.callables import element_facts
from replaylint.lint.dataflow.dtype_tables import table_entry_facts
from replaylint.lint.dataflow.facts import CastValue, Float32Target, SetDtype, TensorFact
from replaylint.lint.dataflow.provenance import Provenance
from replaylint.lint.dataflow.text_settings import float32_text
from replaylint.lint.fixes.drafts import FixDraft, Replace
from replaylint.lint.fixes.float32 import Float32Edits
from replaylint.lint.gatecache.bindings import GateCacheBinding
from replaylint.lint.model import Applicability
from replaylint.lint.rules.catalogue import rule_identity, rule_url
from replaylint.lint.rules.wording import gate_cache_subject
from replaylint.lint.syntax.sites import Site
from replaylint.lint.syntax.traversal import Visitor


@dataclass(frozen=True)
class Valid:
    """Code the rule must accept without a finding."""

    code: str

    @property
    def source(self) -> str:
        return textwrap.dedent(self.code).lstrip("\n")


@dataclass(frozen=True)
class Invalid:
    """Code the rule must flag; ``expected_fix`` is the source after ``--fix --unsafe-fixes``.

    ``expected_fix=None`` states that the finding has no fix.
    """

    code: str
    expected_fix: str | None = None
    message_contains: str | None = None

    @property
    def source(self) -> str:
        return textwrap.dedent(self.code).lstrip("\n")

    @property
    def fixed_source(self) -> str | None:
        if self.expected_fix is None:
            return None
        return textwrap.dedent(self.expected_fix).lstrip("\n")


class Rule(Visitor):
    """Base class of every lint rule. Subclasses set the class attributes and check bindings."""

    CODE: ClassVar[str]
    """``RL001``; taken from the module name for the rules in this package."""
    NAME: ClassVar[str]
    """Short kebab-case name, e.g. ``explicit-non-fp32-dtype``; from the module name too."""
    SUMMARY: ClassVar[str]
    """What the rule finds, one sentence."""
    RATIONALE: ClassVar[str]
    """Why it matters (markdown)."""
    FIX: ClassVar[str]
    """What the fix does, or why there is none (markdown)."""
    FIX_APPLICABILITY: ClassVar[Applicability | None]
    """Applicability of the rule's fixes; ``None`` when it offers none."""
    VALID: ClassVar[Sequence[Valid]]
    INVALID: ClassVar[Sequence[Invalid]]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        identity = rule_identity(cls.__module__)
        if identity is None:
            return  # a rule defined elsewhere (a plugin, a test) states CODE and NAME itself
        for attribute, value in zip(("CODE", "NAME"), identity, strict=True):
            stated = cls.__dict__.get(attribute)
            if stated is not None and stated != value:
                raise TypeError(
                    f"{cls.__qualname__}.{attribute} is {stated!r} but its module "
                    f"{cls.__module__} names it {value!r}: the module name defines it"
                )
            setattr(cls, attribute, value)

    def __init__(self, context: FileContext) -> None:
        super().__init__()
        self.context = context

    @classmethod
    def wants_bindings(cls) -> bool:
        """Whether the rule overrides :meth:`check_binding` (the walker skips it otherwise)."""
        return cls.check_binding is not Rule.check_binding

    def check_binding(self, binding: GateCacheBinding) -> None:
        """Called for every gate-cache binding of the file, in source order."""

    @classmethod
    def wants_writes(cls) -> bool:
        """Whether the rule overrides :meth:`check_write`."""
        return cls.check_write is not Rule.check_write

    def check_write(self, binding: GateCacheBinding) -> None:
        """Called for every value copied into a gate cache (``g_cache[slot] = x``,
        ``g_cache.copy_(x)``), in source order."""

    def report(self, node: cst.CSTNode, message: str, *, fix: FixDraft | None = None) -> None:
        """Record a finding located at ``node`` (the smallest expression it is about)."""
        self.context.add_finding(self.CODE, node, message, fix)

    @classmethod
    def url(cls) -> str:
        return rule_url(cls.CODE)

    # ------------------------------------------------------------------- shared questions
    def site(self) -> Site:
        """Where the traversal is now."""
        return self.context.site()

    @property
    def provenance(self) -> Provenance:
        return self.context.provenance

    def covered(self, node: cst.CSTNode) -> bool:
        """Whether a finding so far (of any rule) lies inside ``node`` or around it."""
        within = self.provenance.within
        return any(within(d.node, node) or within(node, d.node) for d in self.context.drafts)

    def facts(self, binding: GateCacheBinding) -> tuple[TensorFact, ...]:
        """How the value bound to the gate cache got its dtype, one fact per way; none when the
        module uses the name as a mapping (a compiled-graph cache named like a gate cache)."""
        if self.provenance.is_mapping(binding.name, binding.site, binding.display):
            return ()
        if binding.element is not None:
            if isinstance(binding.value, (cst.ListComp, cst.GeneratorExp)):
                return ()  # `d, k, g_cache = (... for ...)`: RL006 judges the one expression
            facts = element_facts(self.provenance, binding.value, binding.element, binding.site)
            return facts or ()
        entry = table_entry_facts(self.provenance, binding.statement, binding.value, binding.site)
        if entry is not None:  # `{"d_cache": dtype, "g_cache": dtype}`: a dtype policy
            return entry
        return self.provenance.tensor_facts(binding.value, binding.site)

    def subject(self, binding: GateCacheBinding) -> str:
        return gate_cache_subject(self.context.gate_caches, binding)

    def float32(self, site: Site | None = None) -> str:
        """``torch.float32`` as this module spells it at ``site`` (default: where we are)."""
        return self.context.spelling.float32_at(site or self.site())

    def setting_fix(self, value: cst.BaseExpression, site: Site) -> FixDraft | None:
        """The unsafe fix that makes a dtype setting's ``value`` float32 where it is written
        (unsafe: whatever else reads the setting sees float32 too)."""
        text = float32_text(self.provenance, value, site)
        if text is not None:  # `os.environ.get("GATE_DTYPE", ring_dtype)`: a dtype's name
            spelled = f'"{text}"'
            edit = Replace(value, spelled)
            return FixDraft(f"Make it {spelled}", (edit,), Applicability.UNSAFE)
        made = self.context.spelling.edits_for(SetDtype(value), site)
        return made and FixDraft(f"Make it {self.float32(site)}", made[0], Applicability.UNSAFE)

    def fix_for(
        self,
        binding: GateCacheBinding,
        fact: TensorFact,
        target: Float32Target | None,
        message: str,
        applicability: Applicability = Applicability.SAFE,
    ) -> FixDraft | None:
        """The fix for ``fact`` found at ``binding``; ``{float32}`` in ``message`` is spelled.

        Withheld (None; :meth:`withheld` says why) when the value is shared: bound to another
        cache in the same statement, or a view of a local that other tensors use. A fact reached
        through a local that is read elsewhere too (``ring = ...`` used for more than this gate
        cache) is not fixed where the local is made — that would change its other uses — but by
        a cast where it becomes the gate cache; that cast makes a copy, so the gate cache stops
        sharing storage with the local's other uses, and the fix is unsafe. Every such cast of
        one binding is the same edit, so several findings on one binding do not stack casts.
        """
        if self.withheld(binding, fact):
            return None
        casts_the_value = bool(fact.via) and not all(
            self.context.index.read_once(b) for b in fact.via
        )
        if binding.element is not None and (
            casts_the_value or (isinstance(target, CastValue) and target.node is binding.value)
        ):
            return None  # the value holds more than the gate cache: a cast of it is no fix
        spelling = self.context.spelling
        site = binding.site
        made: Float32Edits | None
        if casts_the_value:
            made = spelling.cast_at(binding.value, site)
            message = "Cast it to {float32} where it becomes the gate cache"
            applicability = Applicability.UNSAFE
        elif target is None:
            return None
        elif isinstance(target, CastValue) and target.node is binding.value:
            made = spelling.cast_at(binding.value, site)
        else:
            made = spelling.edits_for(target, site)
        if made is None:
            return None
        edits, safe = made
        return FixDraft(
            message.format(float32=self.float32(site)),
            edits,
            applicability if safe else Applicability.UNSAFE,
        )

    def withheld(self, binding: GateCacheBinding, fact: TensorFact) -> str:
        """Why no fix is offered for ``fact`` (a clause for the message), or ``""``."""
        if binding.shared_with:
            others = ", ".join(f"`{other}`" for other in binding.shared_with)
            return (
                f"; the same tensor is bound to {others}, which a dtype change would change too: "
                "allocate the gate cache on its own"
            )
        if fact.via and fact.uses and fact.uses[0] is not binding.value:
            local = fact.via[0]
            if not self.context.index.read_once(local):
                return (
                    f"; it is a view of `{local.name}`, which other tensors share, and a cast would "
                    "copy it out of that storage: allocate the gate cache on its own"
                )
        return ""
