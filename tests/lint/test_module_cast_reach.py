"""Module casts the analysis follows past the receiver's spelling: lists of caches held by a
property, models handed a gate-buffer submodule, functions annotated ``-> nn.Module``, and loops
that cast every buffer on its way into an export."""

from __future__ import annotations

import textwrap
from pathlib import Path

from project_support import cli_rows, lint_in_project, write_tree

from replaylint.lint.engine import Linter
from replaylint.lint.model import Finding

_CACHE = """
    import torch
    from torch import nn

    class Ring(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.register_buffer("d_cache", torch.zeros(n))
            self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))
    """


def _rows(findings: list[Finding], code: str = "RL004") -> list[int]:
    return sorted(f.location.row for f in findings if f.code == code)


def _check(source: str) -> list[Finding]:
    return Linter().check(textwrap.dedent(source), "example.py")


def test_caches_held_by_a_property_of_another_module(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/cache.py": _CACHE,
        "pkg/runner.py": """
            from typing import List

            from .cache import Ring

            class Runner:
                def __init__(self):
                    self._caches = [Ring(4) for _ in range(2)]

                @property
                def kv_cache(self) -> List[Ring]:
                    return self._caches

                @property
                def caches(self):
                    return self._caches

                def shrink(self):
                    for cache in self.kv_cache:
                        cache.half()
                    for i, cache in enumerate(self.caches):
                        cache.half()
            """,
    }
    assert _rows(lint_in_project(tmp_path, files, "pkg/runner.py")) == [19, 21]


def test_caches_held_by_a_property_of_the_module() -> None:
    source = (
        _CACHE
        + """
    class Runner:
        def __init__(self):
            self._caches = [Ring(4) for _ in range(2)]
            self.names = ["a", "b"]

        @property
        def kv_cache(self):
            return self._caches

        @property
        def labels(self):
            return self.names

        def shrink(self):
            for cache in self.kv_cache:
                cache.half()
            for label in self.labels:
                label.half()  # strings: no module of the project
    """
    )
    assert _rows(_check(source)) == [26]


def test_a_model_handed_a_gate_buffer_submodule(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/cache.py": _CACHE,
        "pkg/draft.py": """
            from .cache import Ring
            from .loader import load_model

            def build_draft(path, fp16):
                draft = load_model(path)
                draft.replay_cache = Ring(4)
                if fp16:
                    draft = draft.half()
                return draft

            def build_plain(path):
                draft = load_model(path)
                draft.lm_head = make_head()
                return draft.half()  # no gate buffer given to it here
            """,
        "pkg/loader.py": """
            def load_model(path):
                raise NotImplementedError(path)
            """,
    }
    found = lint_in_project(tmp_path, files, "pkg/draft.py")
    assert _rows(found) == [8]
    assert "the `Ring` that line 6 makes `draft.replay_cache`" in found[0].message


def test_the_result_of_a_function_annotated_to_return_a_module() -> None:
    source = (
        _CACHE
        + """
    class Agent:
        def __init__(self, config):
            self.config = config
            self.model = self._build_model()
            self.tokenizer = self._build_tokenizer()

        def _build_model(self) -> nn.Module:
            return make_model(self.config)

        def _build_tokenizer(self) -> "Tokenizer":
            return make_tokenizer(self.config)

        def update(self):
            self.model.to(self.config.dtype)
            self.tokenizer.to(self.config.dtype)  # annotated as something else

    def swap_caches(model: nn.Module) -> nn.Module:
        # a transformation of its argument: what it returns may no longer hold the ring
        return replace_caches(model)

    def export(config):
        return swap_caches(make_model(config)).to(torch.bfloat16)
    """
    )
    assert _rows(_check(source)) == [24]


def test_a_model_rebuilt_from_itself_is_followed_without_end() -> None:
    source = (
        _CACHE
        + """
    class Agent:
        def __init__(self):
            self.model = self._build()

        def _build(self) -> nn.Module:
            return Ring(3)

        def shrink(self):
            self.model = self.model.half()
            self.model.to(torch.bfloat16)
    """
    )
    assert _rows(_check(source)) == [19, 20]


def test_export_loops_that_cast_every_buffer() -> None:
    source = (
        _CACHE
        + """
    def export(ring: Ring, dtype):
        out = {}
        for name, buf in ring.named_buffers():
            out[name] = buf.detach().cpu().to("cpu", dtype=dtype)
        return out

    def export_like(ring: Ring, like):
        out = {}
        for name, buf in ring.named_buffers():
            out[name] = buf.detach().type_as(like)
        return out

    def export_moved(ring: Ring):
        out = {}
        for name, buf in ring.named_buffers():
            out[name] = buf.detach().cpu()  # moved, not cast
        return out

    def export_float(ring: Ring):
        out = {}
        for name, buf in ring.named_buffers():
            out[name] = buf.detach().to(torch.float32)
        return out
    """
    )
    findings = _check(source)
    assert _rows(findings) == [14, 20]
    assert "`buf.detach().type_as(like)` over `ring.named_buffers()`" in findings[1].message


def test_export_comprehensions_that_cast_every_buffer() -> None:
    source = (
        _CACHE
        + """
    def export(ring: Ring, dtype):
        return {
            name: buf.detach().to(dtype, copy=True) if buf.is_floating_point() else buf.clone()
            for name, buf in ring.named_buffers()
        }

    def halves(ring: Ring):
        return [buf.half() for buf in ring.buffers()]

    def export_rings(ring: Ring, dtype):
        # the gate buffer is left out
        return {n: b.to(dtype) for n, b in ring.named_buffers() if n != "g_cache"}

    def moved(ring: Ring):
        return {n: b.cpu() for n, b in ring.named_buffers()}
    """
    )
    findings = _check(source)
    assert _rows(findings) == [13, 18]
    assert "over `ring.named_buffers()`" in findings[0].message


def test_a_state_dict_cast_and_assigned_to_a_module() -> None:
    source = (
        _CACHE
        + """
    def load(ring: Ring, state_dict, dtype):
        state_dict = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state_dict.items()}
        ring.load_state_dict(state_dict, assign=True)

    def load_inline(ring: Ring, state_dict):
        ring.load_state_dict({k: v.half() for k, v in state_dict.items()}, strict=False, assign=True)

    def load_copied(ring: Ring, state_dict, dtype):
        # copied into the module's own float32 buffers: their dtypes stay
        state_dict = {k: v.to(dtype) for k, v in state_dict.items()}
        ring.load_state_dict(state_dict)

    def load_moved(ring: Ring, state_dict):
        ring.load_state_dict({k: v.cpu() for k, v in state_dict.items()}, assign=True)
    """
    )
    findings = _check(source)
    assert _rows(findings) == [13, 16]
    assert (
        "`ring.load_state_dict(..., assign=True)`, which takes the tensors" in findings[0].message
    )


def test_buffers_registered_in_a_loop_over_names_or_a_records_fields() -> None:
    """`register_buffer(name, ...)` over literal names, `Record._fields` or the fields of a
    record argument (`state._asdict().items()`) registers the gate buffer a cast converts; a
    copy of each tensor's own dtype is no shared dtype."""
    source = """
        from typing import NamedTuple

        import torch
        from torch import nn

        class State(NamedTuple):
            ssm_state: torch.Tensor
            d_cache: torch.Tensor
            k_cache: torch.Tensor
            g_cache: torch.Tensor

        class ByNames(nn.Module):
            def __init__(self, n):
                super().__init__()
                for name in ("ssm_state", "d_cache", "k_cache", "g_cache"):
                    self.register_buffer(name, torch.zeros(n, dtype=torch.float32))

        class ByFields(nn.Module):
            def __init__(self, n):
                super().__init__()
                for name in State._fields:
                    self.register_buffer(name, torch.zeros(n, dtype=torch.float32))

        class Mirror(nn.Module):
            def __init__(self, gpu: State, n):
                super().__init__()
                for name, tensor in gpu._asdict().items():
                    self.register_buffer(name, torch.zeros(n, dtype=tensor.dtype))

        def casts(gpu, n, dtype):
            by_names = ByNames(n).to(dtype=dtype)
            by_fields = ByFields(n).half()
            mirror = Mirror(gpu, n)
            mirror = mirror.to(dtype=dtype)
            return by_names, by_fields, mirror
        """
    found = _check(source)
    assert [(f.location.row, f.code) for f in found] == [
        (32, "RL004"),
        (33, "RL004"),
        (35, "RL004"),
    ]
    assert "`Mirror`" in found[2].message


def test_a_restore_of_listed_buffers_undoes_the_cast_it_runs_with() -> None:
    """A helper that puts back to float32 the buffers each submodule lists
    (`sub._buffers[name] = buf.float()`) undoes a cast whose result it is given under the
    same test; the cast in the other branch, which it does not run with, stays reported."""
    source = """
        import torch
        from torch import nn

        class Ring(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.register_buffer("g_cache", torch.zeros(n, dtype=torch.float32))
                self._fp32_buffer_names = ("g_cache",)

        def restore_fp32_buffers(module):
            for sub in module.modules():
                for name in getattr(sub, "_fp32_buffer_names", ()):
                    sub._buffers[name] = sub._buffers[name].float()
            return module

        class Float16Module(nn.Module):
            def __init__(self, module: Ring, fp16: bool, bf16: bool):
                super().__init__()
                if fp16:
                    self.add_module("module", module.half())
                elif bf16:
                    self.add_module("module", module.bfloat16())
                if bf16:
                    restore_fp32_buffers(self.module)
        """
    assert _rows(_check(source)) == [21]


def test_a_container_of_the_modules_a_caller_hands_in(tmp_path: Path) -> None:
    # SpeechBrain's `Brain`: `self.modules = nn.ModuleDict(modules)` of whatever the recipe
    # passes; the project's modules hold a gate buffer, so a cast of the container converts it
    files = {
        "pkg/__init__.py": "",
        "pkg/cache.py": _CACHE,
        "pkg/brain.py": """
            import torch
            from typing import Dict, Optional

            class Brain:
                def __init__(self, modules=None, device="cpu"):
                    self.modules = torch.nn.ModuleDict(modules).to(device)

                def on_evaluate_start(self, fp16):
                    if fp16:
                        self.modules.half()

            class Interface:
                def __init__(self, modules: Optional[Dict[str, torch.nn.Module]], dtype):
                    self.mods = torch.nn.ModuleDict(modules)
                    self.mods.to(dtype=dtype)

            class Built:
                def __init__(self, sizes):
                    self.layers = torch.nn.ModuleList([torch.nn.Linear(n, n) for n in sizes])
                    self.layers.half()  # torch layers only: no gate buffer among them
            """,
    }
    write_tree(tmp_path, files)
    rows = [row for row in cli_rows(tmp_path, "--no-cache", "pkg") if row[0] == "pkg/brain.py"]
    assert rows == [("pkg/brain.py", 10, "RL004"), ("pkg/brain.py", 15, "RL004")]
