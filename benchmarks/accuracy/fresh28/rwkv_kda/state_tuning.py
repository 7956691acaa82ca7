"""State tuning files: a ``torch.save`` dict of per-layer tensors ``blocks.{i}.att.<suffix>``.
``load_peft_state`` reads RWKV-PEFT-style files (bf16): ``time_state`` and maybe the rings.
"""

from typing import NamedTuple, Optional

import torch

from .model import N, STATE_NAMES, RWKV, tiny_weights

class StateSlot(NamedTuple):
    name: str
    suffix: str
    dtype: Optional[torch.dtype] = None  # None: the layer's atype

STATE_SLOTS = (
    StateSlot("att_kv", "time_state", torch.float32),
    StateSlot("att_d_ring", "d_ring"),
    StateSlot("att_k_ring", "k_ring"),
    StateSlot("att_decay_ring", "w_log_ring"),  # expect-bug: container
    StateSlot("att_pos", "pos", torch.int32),
)
assert tuple(slot.name for slot in STATE_SLOTS) == STATE_NAMES
SUFFIX_INDEX = {slot.suffix: j for j, slot in enumerate(STATE_SLOTS)}

def state_dict_of(state):
    return {f"blocks.{i}.att.{slot.suffix}": state[i * N + j].detach().cpu().clone()
            for i in range(len(state) // N) for j, slot in enumerate(STATE_SLOTS)}

def save_state(path, state):
    torch.save(state_dict_of(state), path)

def load_state(model, path):
    sd, state = torch.load(path, map_location="cpu"), []
    for i, dd in enumerate(model.plans):
        for slot in STATE_SLOTS:
            state.append(sd[f"blocks.{i}.att.{slot.suffix}"].to(device=dd.device, dtype=slot.dtype or dd.atype))
    return state

def load_state_into(state, path):
    """Copies a state file into ``state`` (each tensor keeps its device and dtype)."""
    for key, tensor in torch.load(path, map_location="cpu").items():
        _, layer, _, suffix = key.split(".")
        state[int(layer) * N + SUFFIX_INDEX[suffix]].copy_(tensor)
    return state

def load_peft_state(model, path):
    a, sd, state = model.args, torch.load(path, map_location="cpu"), []
    for i, dd in enumerate(model.plans):
        p = f"blocks.{i}.att."
        time_state = sd[p + "time_state"].to(device=dd.device, dtype=torch.float32)
        if p + "d_ring" in sd:
            d_ring = sd[p + "d_ring"].to(device=dd.device, dtype=dd.atype)
            k_ring = sd[p + "k_ring"].to(device=dd.device, dtype=dd.atype)
            w_log = sd[p + "w_log_ring"].to(dd.device)  # expect-bug: load
            pos = sd[p + "pos"].to(device=dd.device, dtype=torch.int32)
        else:  # time_state only: the rings start empty
            d_ring = torch.zeros(a.HV, a.ring_len, a.V, dtype=dd.atype, device=dd.device)
            k_ring = torch.zeros(a.H, a.ring_len, a.K, dtype=dd.atype, device=dd.device)
            w_log = d_ring.new_zeros((a.HV, a.ring_len, a.K))  # expect-bug: like
            pos = torch.zeros((), dtype=torch.int32, device=dd.device)
        state += [time_state, d_ring, k_ring, w_log, pos]
    return state

def build_state_file_roundtrip(tmp_dir):
    model = RWKV(tiny_weights(), "cpu bf16")
    save_state(f"{tmp_dir}/chat.pth", model.forward([2, 7, 1, 8, 2], model.init_state())[1])
    return model.named_state(load_state(model, f"{tmp_dir}/chat.pth"))

def build_state_file_into_session(tmp_dir):
    model = RWKV(tiny_weights(), "cpu fp32 *1 -> cpu bf16")
    save_state(f"{tmp_dir}/chat.pth", model.forward([2, 7, 1, 8, 2], model.init_state())[1])
    out, state = model.forward([3], load_state_into(model.init_state(), f"{tmp_dir}/chat.pth"))
    return {"out": out, **model.named_state(state)}

def build_peft_time_state(tmp_dir):
    """A RWKV-PEFT file: only the tuned checkpoint, saved in bf16 by the trainer."""
    model = RWKV(tiny_weights(), "cpu bf16")
    a = model.args
    torch.save({f"blocks.{i}.att.time_state": torch.randn(a.HV, a.V, a.K).bfloat16() for i in range(a.n_layer)},
               f"{tmp_dir}/peft.pth")
    out, state = model.forward([1, 2], load_peft_state(model, f"{tmp_dir}/peft.pth"))
    return {"out": out, **model.named_state(state)}
