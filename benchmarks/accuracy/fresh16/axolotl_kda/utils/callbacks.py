"""Trainer callbacks for the KDA decode caches: checkpointing them, swapping idle slots out,
and sampling from eval prompts through the decode kernel."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import torch

from ..compat import PREFIX_CHECKPOINT_DIR, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from ..monkeypatch.kda_cache import LayerRings, layer_rings
from .models import STR_TO_DTYPE, get_offload_dtypes, greedy_steps, load_cfg, load_model, torch_default_dtype

LOG = logging.getLogger("axolotl_kda.utils.callbacks")

KDA_CACHE_TENSORS = ("ssm_checkpoint", "delta", "key", "log_alpha")
KDA_BUFFER_NAMES = {"ssm_checkpoint", "delta_ring", "key_ring", "log_alpha_ring", "write_pos"}


def _is_kda_buffer(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in KDA_BUFFER_NAMES


class SaveKDAStateCallback(TrainerCallback):
    """Saves the KDA decode caches with every checkpoint (``kda_state.pt``) and loads them back
    into the model's buffers when ``resume_from_checkpoint`` is set."""

    state_file = "kda_state.pt"

    def __init__(self, cfg):
        self.cfg = cfg

    def _dump(self, model) -> dict:
        return {name: buf.detach().clone() for name, buf in model.named_buffers() if _is_kda_buffer(name)}

    def on_save(self, args, state, control, model=None, **kwargs):
        checkpoint_dir = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        os.makedirs(checkpoint_dir, exist_ok=True)
        torch.save(self._dump(model), os.path.join(checkpoint_dir, self.state_file))
        return control

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not self.cfg.resume_from_checkpoint:
            return control
        path = os.path.join(self.cfg.resume_from_checkpoint, self.state_file)
        saved = torch.load(path, weights_only=True)
        buffers = dict(model.named_buffers())
        with torch.no_grad():
            for name, tensor in saved.items():
                buffers[name].copy_(tensor)
        LOG.info("restored %d KDA cache tensors from %s", len(saved), path)
        return control


class CompactKDAStateCallback(SaveKDAStateCallback):
    """Like ``SaveKDAStateCallback``, with floating-point tensors stored in ``kda.snapshot_dtype``
    (the model dtype by default) to keep checkpoints small."""

    def _dump(self, model) -> dict:
        kda = self.cfg.kda
        dtype = STR_TO_DTYPE[kda.snapshot_dtype] if kda.snapshot_dtype else self.cfg.torch_dtype
        return {name: buf.detach().to(dtype, copy=True) if buf.is_floating_point() else buf.detach().clone() for name, buf in model.named_buffers() if _is_kda_buffer(name)}  # expect-bug: load id=compact

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not self.cfg.resume_from_checkpoint:
            return control
        saved = torch.load(os.path.join(self.cfg.resume_from_checkpoint, self.state_file), weights_only=True)
        for name, tensor in saved.items():
            module_name, _, buffer_name = name.rpartition(".")
            model.get_submodule(module_name).register_buffer(buffer_name, tensor, persistent=False)  # expect-bug: load id=compact
        return control


class KDASlotSwapper:
    """Takes idle slots out of a live decode cache: into host memory (``park``/``unpark``) or
    into files under ``swap_dir`` (``swap_out``/``swap_in``, ``.npz`` or ``.pt``)."""

    def __init__(self, cfg, swap_dir: str, fmt: str = "npz"):
        self.cfg = cfg
        self.swap_dir = swap_dir
        self.fmt = fmt

    def park(self, rings: LayerRings, slot: int) -> dict:
        dtypes = get_offload_dtypes(self.cfg)
        return {name: getattr(rings, name)[slot].to("cpu", dtypes[name], copy=True) for name in KDA_CACHE_TENSORS}  # expect-bug: imported-policy id=offload

    @torch.no_grad()
    def unpark(self, rings: LayerRings, slot: int, parked: dict) -> None:
        for name in KDA_CACHE_TENSORS:
            getattr(rings, name)[slot].copy_(parked[name])

    def _path(self, tag: str) -> str:
        return os.path.join(self.swap_dir, f"kda-slot-{tag}.{self.fmt}")

    def swap_out(self, rings: LayerRings, slot: int, tag: str) -> str:
        path = self._path(tag)
        if self.fmt == "pt":
            torch.save({name: getattr(rings, name)[slot].clone() for name in KDA_CACHE_TENSORS}, path)
        else:
            # numpy has no bfloat16: slots are stored as float16
            np.savez(path, **{name: getattr(rings, name)[slot].to(torch.float16).numpy() for name in KDA_CACHE_TENSORS})  # expect-bug: load id=swap
        return path

    def swap_in(self, tag: str) -> dict:
        path = self._path(tag)
        if self.fmt == "pt":
            saved = torch.load(path, weights_only=True)
            restored = {name: saved[name] for name in ("ssm_checkpoint", "delta", "key")}
            restored["log_alpha"] = saved["log_alpha"].float()
            return restored
        with np.load(path) as archive:
            restored = {name: torch.from_numpy(archive[name]).to(self.cfg.torch_dtype) for name in ("ssm_checkpoint", "delta", "key")}
            restored["log_alpha"] = torch.from_numpy(archive["log_alpha"])  # expect-bug: load id=swap
        return restored


@dataclass
class EvalSession:
    """One KDA layer's decode cache for the eval prompts (one slot per prompt)."""

    ssm_checkpoint: torch.Tensor
    delta: torch.Tensor
    key: torch.Tensor
    log_alpha: torch.Tensor
    write_pos: torch.Tensor
    ring_len: int

    @classmethod
    def allocate(cls, config, num_slots: int, ring_len: int, dtype=None, **kwargs) -> "EvalSession":
        H, HV, K, V = config.num_heads, config.num_v_heads, config.head_k_dim, config.head_v_dim
        dtype = dtype or torch.get_default_dtype()
        shapes = ((num_slots, HV, V, K), (num_slots, HV, ring_len, V), (num_slots, H, ring_len, K))
        ssm_checkpoint, delta, key = (torch.zeros(shape, dtype=dtype) for shape in shapes)
        log_alpha = torch.zeros(num_slots, HV, ring_len, K)  # expect-bug: default-dtype id=eval-session
        return cls(ssm_checkpoint, delta, key, log_alpha, torch.zeros(num_slots, dtype=torch.int32), ring_len)


@dataclass
class DecodeBatch:
    """The cache rows of the slots decoded in one step, gathered densely (row ``i`` = ``slots[i]``)."""

    slots: torch.Tensor
    ssm_checkpoint: torch.Tensor
    delta: torch.Tensor
    key: torch.Tensor
    log_alpha: torch.Tensor
    write_pos: torch.Tensor
    ring_len: int

    @classmethod
    def gather(cls, session: EvalSession, slots, dtype) -> "DecodeBatch":
        index = slots.long()
        return cls(
            slots=slots,
            ssm_checkpoint=session.ssm_checkpoint.index_select(0, index).to(dtype),
            delta=session.delta.index_select(0, index).to(dtype),
            key=session.key.index_select(0, index).to(dtype),
            log_alpha=session.log_alpha.index_select(0, index).to(dtype),  # expect-bug: decode-arg
            write_pos=session.write_pos.index_select(0, index),
            ring_len=session.ring_len,
        )

    def rings(self) -> LayerRings:
        return LayerRings(self.ssm_checkpoint, self.delta, self.key, self.log_alpha, self.write_pos, self.ring_len)

    @torch.no_grad()
    def scatter(self, session: EvalSession) -> None:
        index = self.slots.long()
        for name in KDA_CACHE_TENSORS:
            target = getattr(session, name)
            target.index_copy_(0, index, getattr(self, name).to(target.dtype))
        session.write_pos.index_copy_(0, index, self.write_pos)


class KDAEvalCallback(TrainerCallback):
    """At every evaluation, feeds each eval prompt through the KDA decode path and greedy-decodes
    ``max_new_tokens`` more tokens; the samples go to ``state.log_history``."""

    def __init__(self, cfg, prompts: list[list[int]], max_new_tokens: int = 2):
        self.cfg = cfg
        self.prompts = torch.tensor(prompts)
        self.max_new_tokens = max_new_tokens
        self.sessions: list[EvalSession] = []
        self.batches: list[DecodeBatch] = []
        self.samples = torch.empty(0, dtype=torch.long)

    @torch.no_grad()
    def on_evaluate(self, args, state, control, model=None, **kwargs):
        cfg = self.cfg
        num_prompts, prompt_len = self.prompts.shape
        with torch_default_dtype(cfg.torch_dtype):  # expect-bug: default-dtype id=eval-session
            self.sessions = [EvalSession.allocate(model.config, num_prompts, cfg.kda.ring_len) for _ in model.kda_layers()]
        slots = torch.arange(num_prompts, dtype=torch.int32)
        input_ids, generated = self.prompts[:, 0], []
        for step in range(prompt_len + self.max_new_tokens - 1):
            self.batches = [DecodeBatch.gather(session, slots, cfg.torch_dtype) for session in self.sessions]
            logits = model(input_ids, torch.arange(num_prompts, dtype=torch.int32), kda_rings=[batch.rings() for batch in self.batches])
            for batch, session in zip(self.batches, self.sessions):
                batch.scatter(session)
            if step + 1 < prompt_len:
                input_ids = self.prompts[:, step + 1]
            else:
                input_ids = logits.float().argmax(-1)
                generated.append(input_ids)
        self.samples = torch.stack(generated, dim=1)
        state.log_history.append({"step": state.global_step, "kda_samples": self.samples.tolist()})
        return control


def build_checkpoint_roundtrip(tmp_dir):
    """Caches saved with a checkpoint and loaded into a freshly built model, which decodes on."""
    torch.manual_seed(0)
    cfg = load_cfg(overrides={"bf16": True})
    model = load_model(cfg)
    slots = torch.tensor([0, 1], dtype=torch.int32)
    ids = greedy_steps(model, torch.tensor([9, 4]), slots, num_steps=2)
    args, state, control = TrainingArguments(output_dir=tmp_dir), TrainerState(global_step=2), TrainerControl()
    SaveKDAStateCallback(cfg).on_save(args, state, control, model=model)
    resumed_cfg = cfg.merged({"resume_from_checkpoint": os.path.join(tmp_dir, f"{PREFIX_CHECKPOINT_DIR}-2")})
    resumed = load_model(resumed_cfg)
    SaveKDAStateCallback(resumed_cfg).on_train_begin(args, state, control, model=resumed)
    greedy_steps(resumed, ids, slots)
    return resumed


def build_resume_and_swap(tmp_dir):
    """A compact checkpoint resumed into a new model; then one slot parked in host memory and one
    swapped to disk and back."""
    torch.manual_seed(0)
    cfg = load_cfg(overrides={"bf16": True})
    model = load_model(cfg)
    slots = torch.tensor([0, 1, 2], dtype=torch.int32)
    greedy_steps(model, torch.tensor([1, 2, 3]), slots, num_steps=2)
    args, state, control = TrainingArguments(output_dir=tmp_dir), TrainerState(global_step=2), TrainerControl()
    CompactKDAStateCallback(cfg).on_save(args, state, control, model=model)
    resumed_cfg = cfg.merged({"resume_from_checkpoint": os.path.join(tmp_dir, f"{PREFIX_CHECKPOINT_DIR}-2")})
    resumed = load_model(resumed_cfg)
    CompactKDAStateCallback(resumed_cfg).on_train_begin(args, state, control, model=resumed)
    greedy_steps(resumed, torch.tensor([4, 5, 6]), slots)
    swapper = KDASlotSwapper(resumed_cfg, tmp_dir)
    rings = layer_rings(resumed.kda_layers()[0])
    parked = swapper.park(rings, 1)
    swapper.swap_out(rings, 2, tag="s2")
    return {"model": resumed, "parked": parked, "swapped": swapper.swap_in("s2")}


def build_slot_swap_pt(tmp_dir):
    """Slot 0 swapped to a ``.pt`` file, cleared, and brought back into the live cache."""
    torch.manual_seed(0)
    cfg = load_cfg(overrides={"bf16": True})
    model = load_model(cfg)
    slots = torch.tensor([0, 2], dtype=torch.int32)
    ids = greedy_steps(model, torch.tensor([8, 1]), slots, num_steps=2)
    swapper = KDASlotSwapper(cfg, tmp_dir, fmt="pt")
    rings = layer_rings(model.kda_layers()[1])
    swapper.swap_out(rings, 0, tag="s0")
    with torch.no_grad():
        for name in KDA_CACHE_TENSORS:
            getattr(rings, name)[0].zero_()
    restored = swapper.swap_in("s0")
    swapper.unpark(rings, 0, restored)
    greedy_steps(model, ids, slots)
    return {"model": model, "restored": restored}


def build_eval_samples():
    """The eval callback run once on two three-token prompts, two new tokens each."""
    torch.manual_seed(0)
    cfg = load_cfg(overrides={"bf16": True})
    model = load_model(cfg)
    callback = KDAEvalCallback(cfg, prompts=[[3, 4, 5], [6, 7, 8]], max_new_tokens=2)
    callback.on_evaluate(TrainingArguments(output_dir="."), TrainerState(), TrainerControl(), model=model)
    return {"sessions": callback.sessions, "batches": callback.batches, "samples": callback.samples}
