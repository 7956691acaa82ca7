"""Client side: ``RemoteSequential`` over the blocks of a swarm and the inference sessions it opens
(``petals.client.remote_sequential``, ``petals.client.inference_session``). Servers are reached through their
``TransformerBackend`` here; requests and responses are serialized as on the wire."""

from __future__ import annotations

import contextlib
from typing import Sequence

import torch
from torch import nn

from .block import KDAConfig, PinnedGateKDABlock, WrappedKDABlock
from .hivemind_compat import DUMMY, CompressionType, deserialize_torch_tensor, serialize_torch_tensor
from .server.backend import InferenceMetadata, TransformerBackend, make_backend
from .server.from_pretrained import resolve_block_dtype
from .server.memory_cache import CACHE_NAMES


@contextlib.contextmanager
def _default_torch_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class _ServerInferenceSession:
    """The blocks of one server in a session: the handles of their caches and the position reached."""

    def __init__(self, backends: Sequence[TransformerBackend], *, batch_size: int, max_length: int,
                 compression: CompressionType = CompressionType.NONE):
        self.backends, self.max_length, self.compression = list(backends), max_length, compression
        self._stack = contextlib.ExitStack()
        self.handles = [self._stack.enter_context(b.memory_cache.allocate_cache(
            *b.get_inference_cache_descriptors(batch_size, max_length))) for b in self.backends]
        self.position = 0

    def step(self, inputs: torch.Tensor, hypo_ids: torch.Tensor = DUMMY) -> torch.Tensor:
        if self.position >= self.max_length:
            raise ValueError(f"session reached max_length={self.max_length}")
        hidden_schema, hypo_schema = self.backends[0].inference_schema[0]
        request = [serialize_torch_tensor(inputs.to(hidden_schema.dtype), self.compression),
                   serialize_torch_tensor(hypo_ids.to(hypo_schema.dtype))]
        hidden, hypo_ids = (deserialize_torch_tensor(tensor) for tensor in request)
        for backend, handles in zip(self.backends, self.handles):
            hidden = backend.inference_step(hidden, hypo_ids, InferenceMetadata(backend.name, self.position, handles))
        self.position += 1
        return deserialize_torch_tensor(serialize_torch_tensor(hidden, self.compression))

    def caches(self) -> list[dict[str, torch.Tensor]]:
        result = []
        for backend, handles in zip(self.backends, self.handles):
            with backend.memory_cache.use_cache(*handles) as cache_tensors:
                result.append(dict(zip(CACHE_NAMES, cache_tensors)))
        return result

    def export(self, compression: CompressionType) -> list[dict]:
        return [backend.export_session(handles, compression) for backend, handles in zip(self.backends, self.handles)]

    def close(self) -> None:
        self._stack.close()


class _LocalInferenceSession:
    """Blocks the client runs itself (``RemoteSequential(local_blocks=...)``), with their caches here."""

    def __init__(self, blocks: Sequence[WrappedKDABlock], batch_size: int):
        self.blocks, self.rings = list(blocks), []
        for block in self.blocks:
            shapes = block.config.ring_shapes(batch_size)
            delta_dtype, key_dtype, log_gate_dtype = block.cache_dtypes
            self.rings.append({
                "delta_cache": torch.zeros(shapes["delta"], dtype=delta_dtype),
                "key_cache": torch.zeros(shapes["key"], dtype=key_dtype),
                "log_gate_cache": torch.zeros(shapes["log_gate"], dtype=log_gate_dtype),  # expect-bug: container id=cache-dtypes
                "ssm_state": torch.zeros(block.config.state_shape(batch_size), dtype=torch.float32),
                "positions": torch.zeros(batch_size, dtype=torch.int32),
            })

    def step(self, hidden: torch.Tensor) -> torch.Tensor:
        for block, rings in zip(self.blocks, self.rings):
            cache = (rings["delta_cache"], rings["key_cache"], rings["log_gate_cache"], rings["ssm_state"])
            hidden = block(hidden, cache=cache, positions=rings["positions"])
            rings["positions"] += 1
        return hidden

    def expand(self, repeats: int) -> None:
        """Repeats every row ``repeats`` times (``num_return_sequences`` after the prompt)."""
        self.rings = [{name: ring.repeat_interleave(repeats, dim=0) for name, ring in rings.items()} for rings in self.rings]

    def reset(self) -> None:
        """Back to position 0, for a new generation in the same session."""
        for rings in self.rings:
            for name in ("delta_cache", "key_cache", "ssm_state", "positions"):
                rings[name].zero_()
            # log-gates taken over from a server can share the payload's buffer: give them storage of their own
            rings["log_gate_cache"] = torch.zeros_like(rings["delta_cache"])  # expect-bug: like

    def load_payloads(self, payloads: Sequence[dict], config: KDAConfig) -> None:
        """Continues a span handed over by its server (``TransformerBackend.export_session``), block by block."""
        ring_dtype = resolve_block_dtype(config, config.torch_dtype)
        for rings, payload in zip(self.rings, payloads):
            rings["delta_cache"] = deserialize_torch_tensor(payload["delta"]).to(ring_dtype)
            rings["key_cache"] = deserialize_torch_tensor(payload["key"]).to(ring_dtype)
            rings["log_gate_cache"] = deserialize_torch_tensor(payload["log_gate"]).to(ring_dtype)  # expect-bug: imported-policy
            rings["ssm_state"].copy_(deserialize_torch_tensor(payload["state"]))
            rings["positions"].copy_(deserialize_torch_tensor(payload["positions"]))


class InferenceSession:
    """Inference over all blocks: one server session per span, then the local blocks."""

    def __init__(self, sequence: RemoteSequential, *, batch_size: int, max_length: int):
        self.sequence, self.batch_size, self.max_length = sequence, batch_size, max_length
        self.server_sessions = [_ServerInferenceSession(span, batch_size=batch_size, max_length=max_length)
                                for span in sequence.spans]
        self.local = _LocalInferenceSession(sequence.local_blocks, batch_size) if len(sequence.local_blocks) else None
        self.position = 0

    def step(self, inputs: torch.Tensor, hypo_ids: torch.Tensor = DUMMY) -> torch.Tensor:
        for session in self.server_sessions:
            inputs = session.step(inputs, hypo_ids)
        if self.local is not None:
            inputs = self.local.step(inputs)
        self.position += 1
        return inputs

    def migrate(self, index: int, replacement: Sequence[TransformerBackend], compression=CompressionType.NONE):
        """Moves span ``index`` to ``replacement`` servers (its server is leaving): caches handed over, no replay."""
        old = self.server_sessions[index]
        new = _ServerInferenceSession(replacement, batch_size=self.batch_size, max_length=self.max_length)
        for backend, handles, payload in zip(new.backends, new.handles, old.export(compression)):
            backend.import_session(handles, payload)
        new.position = old.position
        old.close()
        self.server_sessions[index] = new

    def continue_locally(self, blocks: Sequence[WrappedKDABlock], compression=CompressionType.NONE):
        """No server holds the last span any more: its caches come over and the client runs its blocks."""
        old = self.server_sessions.pop()
        self.local = _LocalInferenceSession(blocks, self.batch_size)
        self.local.load_payloads(old.export(compression), self.sequence.config)
        old.close()
        return self.local


class RemoteSequential(nn.Module):
    """The blocks of a model, served by spans of servers, and optionally a tail the client runs itself."""

    def __init__(self, config: KDAConfig, spans: Sequence[Sequence[TransformerBackend]] = (), *,
                 local_blocks: Sequence[WrappedKDABlock] = (), dtype=None):
        super().__init__()
        self.config, self.spans = config, [list(span) for span in spans]
        self.dtype = resolve_block_dtype(config, dtype)
        self.local_blocks = nn.ModuleList(local_blocks)
        if self.dtype == torch.float16:  # fp16 kernels for the local tail
            self.local_blocks.half()  # expect-bug: module-cast
        if config.tuning_mode == "deep_ptune":
            # prompts and their optimizer state stay float32 for the quality of tuning
            self.prompt_embeddings = nn.Embedding(config.pre_seq_len, config.hidden_size, dtype=torch.float32)
            self.prompt_log_gate = nn.Parameter(torch.zeros(config.num_hidden_layers, config.num_v_heads, config.pre_seq_len, config.head_dim))  # expect-bug: default-dtype id=ptune

    @classmethod
    def from_pretrained(cls, config: KDAConfig, spans=(), *, torch_dtype="auto", local_blocks=()) -> RemoteSequential:
        """``torch_dtype="auto"`` is the checkpoint's dtype, as for the servers' blocks."""
        torch_dtype = resolve_block_dtype(config, torch_dtype)
        with _default_torch_dtype(torch_dtype):  # expect-bug: default-dtype id=ptune
            return cls(config, spans, local_blocks=local_blocks, dtype=torch_dtype)

    def inference_session(self, *, batch_size: int = 1, max_length: int = 16) -> InferenceSession:
        return InferenceSession(self, batch_size=batch_size, max_length=max_length)


def _hidden(config: KDAConfig, batch_size: int) -> torch.Tensor:
    return torch.linspace(-0.5, 0.5, batch_size * config.hidden_size).view(batch_size, -1)


def build_remote_sequential() -> dict:
    """Two bf16 servers and a local fp32 tail; the second server's span migrates after two steps."""
    config = KDAConfig()
    swarm = [make_backend(config, index, torch.bfloat16) for index in range(2)]
    spare = make_backend(config, 1, torch.bfloat16, seed=11)
    torch.manual_seed(2)
    model = RemoteSequential.from_pretrained(config, [swarm[:1], swarm[1:]], local_blocks=[PinnedGateKDABlock(config)])
    session, hidden = model.inference_session(batch_size=2, max_length=8), _hidden(config, 2)
    for _ in range(2):
        hidden = session.step(hidden)
    session.migrate(1, [spare])
    session.step(hidden)
    session.local.expand(2)
    return {"servers": [s.caches() for s in session.server_sessions], "local": session.local.rings, "model": model}


def build_local_fallback() -> dict:
    """An fp16 model run entirely on the client, before and after ``reset``."""
    config = KDAConfig(torch_dtype="float16")
    torch.manual_seed(4)
    model = RemoteSequential(config, local_blocks=[WrappedKDABlock(config, index) for index in range(2)],
                             dtype=torch.float16)
    session = model.inference_session(batch_size=1, max_length=4)
    session.step(_hidden(config, 1).half())
    before = [dict(rings) for rings in session.local.rings]
    session.local.reset()
    return {"model": model, "before": before, "after": session.local.rings}


def build_handover_to_local() -> dict:
    """A deep-ptune model whose only server leaves after two steps; the client continues the span."""
    config = KDAConfig(tuning_mode="deep_ptune")
    swarm = [make_backend(config, index, torch.bfloat16) for index in range(2)]
    model = RemoteSequential.from_pretrained(config, [swarm])
    session, hidden = model.inference_session(batch_size=1, max_length=8), _hidden(config, 1)
    for _ in range(2):
        hidden = session.step(hidden)
    torch.manual_seed(6)
    local = session.continue_locally([PinnedGateKDABlock(config, index) for index in range(2)])
    session.step(hidden)
    return {"model": model, "local": local.rings}
