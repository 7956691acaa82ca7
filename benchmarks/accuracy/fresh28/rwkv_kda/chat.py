"""Chat (after ChatRWKV's ``chat.py``) and a small batched server (``SlotPool``, ``serve_step``)."""

import copy
import dataclasses
import pickle
import sys
import types

import torch

from . import strategy as strat
from . import utils
from .model import N, RWKV, tiny_weights
from .ops import fused_recurrent_kda_replayssm_decode, last_call
from .ops.cache import RingArgs, RingCache

def load_model(path, strategy, batch=0, **kw):
    """``RWKV`` for chat (``batch=0``) or for the static-batch server (its ``cache`` holds the rings)."""
    model = RWKV(path, strategy, static_batch=batch, **kw)
    atype = model.plans[0].atype
    if batch:  # the static cache follows the strategy's dtype
        model = model.bfloat16() if atype == torch.bfloat16 else model.half() if atype == torch.float16 else model  # expect-bug: module-cast
    return model

def open_static_cache(model, slots):
    plan = model.plans[0]
    return RingCache(model.args, slots).to(plan.device, plan.atype)  # expect-bug: module-cast

class SlotPool:
    RINGS = ("d_ring", "k_ring", "w_log_ring")
    def __init__(self, model, slots=None, cfg=strat.SERVER_DEFAULTS):
        a, plan = model.args, model.plans[0]
        self.model, self.slots, self.owner = model, slots or cfg.slots, {}
        self.dtype = strat.resolve_dtype(cfg.ring_dtype, plan)
        self.w_log_ring_shape = (a.HV, a.ring_len, a.K)
        lead = (a.n_layer, self.slots)
        self.att_kv = torch.zeros(*lead, a.HV, a.V, a.K, dtype=torch.float32)
        self.d_ring = torch.zeros(*lead, a.HV, a.ring_len, a.V, dtype=self.dtype)
        self.k_ring = torch.zeros(*lead, a.H, a.ring_len, a.K, dtype=self.dtype)
        self.w_log_ring = torch.zeros(*lead, *self.w_log_ring_shape, dtype=strat.resolve_dtype(cfg.decay_dtype, plan))  # expect-bug: imported-policy id=server-decay
        self.write_pos = torch.zeros(lead, dtype=torch.int32)
    def layer(self, i):
        return RingArgs(d_cache=self.d_ring[i], k_cache=self.k_ring[i], g_cache=self.w_log_ring[i])
    def admit(self, chat_id, state):
        slot = self.owner[chat_id] = min(set(range(self.slots)) - set(self.owner.values()))
        for i in range(self.model.args.n_layer):
            for j, name in enumerate(("att_kv",) + self.RINGS + ("write_pos",)):
                getattr(self, name)[i, slot].copy_(state[i * N + j])
        return slot
    def evict(self, chat_id):
        """The chat's list state (copies); its slot is free again."""
        slot, state = self.owner.pop(chat_id), []
        for i in range(self.model.args.n_layer):
            d_ring = self.d_ring[i, slot].clone()
            w_log = torch.empty_like(d_ring).copy_(self.w_log_ring[i, slot])  # expect-bug: like
            state += [self.att_kv[i, slot].clone(), d_ring, self.k_ring[i, slot].clone(), w_log, self.write_pos[i, slot].clone()]
        return state
    def resize(self, slots):
        """Grows (or shrinks) every per-slot tensor, keeping the first slots."""
        keep = min(slots, self.slots)
        for name in ("att_kv", "write_pos") + self.RINGS:
            old = getattr(self, name)
            dtype = self.dtype if name in self.RINGS else old.dtype  # expect-bug: pool-dtype id=pool-resize
            new = torch.zeros((old.shape[0], slots, *old.shape[2:]), dtype=dtype)  # expect-bug: pool-dtype id=pool-resize
            new[:, :keep] = old[:, :keep]
            setattr(self, name, new)
        self.slots = slots

@dataclasses.dataclass
class DecodeBatch:
    """The rows of one step, gathered contiguous for the kernel and scattered back after it."""
    initial_state_indices: torch.Tensor
    initial_state: torch.Tensor
    d_cache: torch.Tensor
    k_cache: torch.Tensor
    g_cache: torch.Tensor
    write_pos: torch.Tensor
    @classmethod
    def gather(cls, pool, i, slots):
        idx = slots.long()
        return cls(torch.arange(len(idx), dtype=torch.int32), pool.att_kv[i, idx], pool.d_ring[i, idx], pool.k_ring[i, idx],
                   g_cache=pool.w_log_ring[i, idx].to(pool.dtype), write_pos=pool.write_pos[i, idx])  # expect-bug: decode-arg
    def scatter(self, pool, i, slots):
        idx = slots.long()
        for name, rows in (("att_kv", self.initial_state), ("d_ring", self.d_cache), ("k_ring", self.k_cache),
                           ("w_log_ring", self.g_cache), ("write_pos", self.write_pos)):
            dst = getattr(pool, name)
            dst[i, idx] = rows.to(dst.dtype)
    def kernel_kwargs(self):
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

def serve_step(model, pool, tokens, chat_ids):
    """One token for every chat in ``chat_ids`` (all admitted); returns their logits."""
    slots = torch.tensor([pool.owner[c] for c in chat_ids], dtype=torch.int32)
    def attend(i, q, k, v, g, beta):
        batch = DecodeBatch.gather(pool, i, slots)
        o, _ = fused_recurrent_kda_replayssm_decode(q=q, k=k, v=v, g=g, beta=beta, **batch.kernel_kwargs())
        batch.scatter(pool, i, slots)
        return o
    x = model.w["emb.weight"][torch.as_tensor(tokens)]
    for i in range(model.args.n_layer):
        x = model._layer(x, i, attend)
    return model._head(x)

class ChatSession:
    """One conversation: ``+reset`` goes back to the intro, ``+retry`` regenerates the last reply."""
    def __init__(self, model, pipeline, intro=""):
        self.model, self.pipeline, self.all_state = model, pipeline, {}
        # the empty logits and state in the model's dtype
        with utils.default_dtype(model.plans[-1].atype):  # expect-bug: default-dtype id=chat-dd
            self.state = model.init_state()
            self.out = torch.zeros(model.args.vocab)
        if intro:
            self.out, self.state = model.forward(pipeline.encode(intro), self.state)
        self.save_all_stat("intro")
    def save_all_stat(self, name):
        self.all_state[name] = {"out": self.out.clone(), "state": copy.deepcopy(self.state)}
    def load_all_stat(self, name):
        saved = self.all_state[name]
        self.out, self.state = saved["out"].clone(), copy.deepcopy(saved["state"])
    def on_message(self, msg, max_tokens=12):
        if msg in ("+reset", "+retry"):  # back to the intro, or regenerate the last reply
            self.load_all_stat("intro" if msg == "+reset" else "before_reply")
        else:
            self.out, self.state = self.model.forward(self.pipeline.encode(f"user: {msg}\n\nbot:"), self.state)
            self.save_all_stat("before_reply")
        args = utils.PIPELINE_ARGS(token_stop=[1])
        reply, self.out, self.state = self.pipeline.generate("", max_tokens, args, state=self.state, out=self.out)
        return reply
    def save(self, path, compact=False):
        """Pickles the chat; ``compact`` keeps floating state in fp16 (half the size of fp32)."""
        state = [t.half() if compact and t.is_floating_point() else t.clone() for t in self.state]  # expect-bug: load id=compact
        with open(path, "wb") as f:
            pickle.dump({"out": self.out, "state": state}, f)
    def load(self, path):
        with open(path, "rb") as f:
            blob = pickle.load(f)
        self.out, self.state = blob["out"], blob["state"]  # expect-bug: load id=compact

def chat_loop(path, strategy, lines, intro="", write=print):
    model = load_model(path, strategy)
    session = ChatSession(model, utils.PIPELINE(model), intro)
    for line in lines:
        write(f"bot: {session.on_message(line.strip())}")
    return session

def build_server_pool_default():
    model = RWKV(tiny_weights(), "cpu bf16")
    pool = SlotPool(model, 2)
    pool.admit("alice", model.forward([1, 2], model.init_state())[1])
    logits = model.forward_batch(torch.tensor([3]), pool, torch.tensor([pool.owner["alice"]], dtype=torch.int32))
    return {"pool": pool, "logits": logits}

def build_server_step():
    model = RWKV(tiny_weights(), "cpu bf16")
    pool = SlotPool(model, 3, types.SimpleNamespace(slots=3, ring_dtype="auto", decay_dtype="fp32"))
    for chat_id, prompt in (("a", [1, 2, 3]), ("b", [4])):
        pool.admit(chat_id, model.forward(prompt, model.init_state())[1])
    for step in range(4):
        logits = serve_step(model, pool, [step, step + 2], ["b", "a"])
    return {"pool": pool, "logits": logits, "kernel": last_call()}

def build_chat_session_fp32():
    model = RWKV(tiny_weights(), "cpu fp32")
    session = ChatSession(model, utils.PIPELINE(model), intro="hello\n")
    session.on_message("hi there")
    session.on_message("+retry")
    return {"out": session.out, "all_state": session.all_state, **model.named_state(session.state)}

def build_static_cache_server():
    model = RWKV(tiny_weights(), "cpu bf16")
    cache = open_static_cache(model, 2)
    return {"cache": cache, "logits": model.forward_batch(torch.tensor([1, 5]), cache, torch.tensor([1, 0], dtype=torch.int32))}

if __name__ == "__main__":
    chat_loop(sys.argv[1], sys.argv[2], sys.stdin)
