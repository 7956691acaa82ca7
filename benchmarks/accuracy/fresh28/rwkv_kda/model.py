"""``RWKV(model, strategy)``: the ``rwkv``-package runtime for KDA models.

Weights are a flat dict converted per layer for the strategy (unless ``_strategy`` says it was).
The state is a flat list, five per layer: ``state[i*5+0]`` checkpoint ``[HV, V, K]`` float32, ``+1``
delta ring ``[HV, L, V]`` and ``+2`` key ring ``[H, L, K]`` in the atype, ``+3`` log-decay ring
``[HV, L, K]`` float32, ``+4`` int32 cursor.
"""

import types

import torch
import torch.nn.functional as F

from . import strategy as strat
from .ops import fused_recurrent_kda_replayssm_decode, kda_gate, kda_readout, l2norm, replay
from .ops.cache import PinnedRingCache, RingCache

MyModule = torch.nn.Module  # torch.jit.ScriptModule when RWKV_JIT_ON=1 in the CUDA build
STATE_NAMES = ("att_kv", "att_d_ring", "att_k_ring", "att_decay_ring", "att_pos")
N = len(STATE_NAMES)

def tiny_weights(n_layer=2, n_embd=8, vocab=16, H=1, HV=2, K=4, V=4, seed=0):
    """A random float32 checkpoint in the training layout."""
    gen = torch.Generator().manual_seed(seed)
    def rand(*shape):
        return torch.randn(*shape, generator=gen) * 0.3
    w = {"emb.weight": rand(vocab, n_embd), "head.weight": rand(vocab, n_embd)}
    for i in range(n_layer):
        p = f"blocks.{i}."
        for name, rows in (("q", H * K), ("k", H * K), ("v", HV * V), ("a", HV * K), ("b", HV)):
            w[p + f"att.{name}.weight"] = rand(rows, n_embd)
        w.update({p + "att.o.weight": rand(n_embd, HV * V), p + "att.A_log": torch.linspace(-1.0, 0.5, HV),
                  p + "att.dt_bias": rand(HV * K), p + "ffn.key.weight": rand(4 * n_embd, n_embd),
                  p + "ffn.value.weight": rand(n_embd, 4 * n_embd)})
    for ln in ["ln_out"] + [f"blocks.{i}.ln{j}" for i in range(n_layer) for j in (1, 2)]:
        w[ln + ".weight"], w[ln + ".bias"] = torch.ones(n_embd), torch.zeros(n_embd)
    return w

def convert_weights(w, plans, strategy):
    """Every tensor on its layer's device in its ``wtype``; keys in ``FP32_KEYS`` stay float32."""
    out = {"_strategy": strategy}
    for key, tensor in w.items():
        if key.startswith("_"):
            continue
        dd = plans[int(key.split(".")[1])] if key.startswith("blocks.") else plans[0 if key.startswith("emb") else -1]
        dtype = torch.float32 if key.endswith(strat.FP32_KEYS) else dd.wtype
        out[key] = tensor.to(device=dd.device, dtype=dtype if tensor.is_floating_point() else tensor.dtype)  # expect-bug: imported-policy id=fp32-keys
    return out

class RWKV(MyModule):
    def __init__(self, model, strategy, ring_len=4, gate_lower_bound=None, static_batch=0):
        super().__init__()
        w = torch.load(model, map_location="cpu") if isinstance(model, str) else model
        args = self.args = types.SimpleNamespace(ring_len=ring_len, gate_lower_bound=gate_lower_bound)
        args.n_layer = 1 + max(int(key.split(".")[1]) for key in w if key.startswith("blocks."))
        args.vocab, args.n_embd = w["emb.weight"].shape
        args.HV = w["blocks.0.att.A_log"].numel()
        args.K = w["blocks.0.att.dt_bias"].numel() // args.HV
        args.H = w["blocks.0.att.q.weight"].shape[0] // args.K
        args.V = w["blocks.0.att.v.weight"].shape[0] // args.HV
        self.plans = strat.parse_strategy(strategy, args.n_layer)
        self.w = w if w.get("_strategy") == strategy else convert_weights(w, self.plans, strategy)
        self._slot0 = torch.zeros(1, dtype=torch.int32)
        if static_batch:
            self.cache = RingCache(args, static_batch)  # float32 until the model is moved to its dtype
    def init_state(self):
        a, state = self.args, []
        for dd in self.plans:
            state.append(torch.zeros(a.HV, a.V, a.K, dtype=torch.float32, device=dd.device))
            state.append(torch.zeros(a.HV, a.ring_len, a.V, dtype=dd.atype, device=dd.device))
            state.append(torch.zeros(a.H, a.ring_len, a.K, dtype=dd.atype, device=dd.device))
            state.append(torch.zeros(a.HV, a.ring_len, a.K, device=dd.device))  # expect-bug: default-dtype id=chat-dd
            state.append(torch.zeros((), dtype=torch.int32, device=dd.device))
        return state
    def named_state(self, state):
        return {name: state[j::N] for j, name in enumerate(STATE_NAMES)}
    def make_cache(self, slots):
        return PinnedRingCache(self.args, slots, self.plans[0].atype, self.plans[0].device)
    def _adopt_state(self, state):
        """A state made under another strategy (a saved chat, a state file) onto this one's plans."""
        for i, dd in enumerate(self.plans):
            if state[i * N + 1].dtype == dd.atype and state[i * N + 1].device == torch.device(dd.device):
                continue
            state[i * N] = state[i * N].to(dd.device)
            for j in (1, 2, 3):
                state[i * N + j] = state[i * N + j].to(device=dd.device, dtype=dd.atype)  # expect-bug: cast
            state[i * N + 4] = state[i * N + 4].to(dd.device)
    def _project(self, x, i):
        a, w, p = self.args, self.w, f"blocks.{i}."
        xx = F.layer_norm(x, (a.n_embd,), w[p + "ln1.weight"], w[p + "ln1.bias"])
        def proj(name, *shape):
            return (xx @ w[p + f"att.{name}.weight"].T).unflatten(-1, shape)
        beta = torch.sigmoid(xx @ w[p + "att.b.weight"].T)
        return proj("q", a.H, a.K), proj("k", a.H, a.K), proj("v", a.HV, a.V), proj("a", a.HV, a.K), beta
    def _gate(self, gin, i):
        p, bound = f"blocks.{i}.att.", self.args.gate_lower_bound
        dt_bias = self.w[p + "dt_bias"].view(self.args.HV, self.args.K)
        if bound is None:
            return kda_gate(gin, self.w[p + "A_log"], dt_bias)
        return bound * torch.sigmoid(gin + dt_bias)  # expect-bug: promotion id=bounded-gate
    def _layer(self, x, i, attend):
        dd, w, p = self.plans[i], self.w, f"blocks.{i}."
        x = x.to(device=dd.device, dtype=dd.atype)
        q, k, v, gin, beta = self._project(x, i)
        o = attend(i, q, k, v, self._gate(gin, i), beta)
        x = x + o.flatten(-2).to(x.dtype) @ w[p + "att.o.weight"].T
        xx = F.layer_norm(x, (self.args.n_embd,), w[p + "ln2.weight"], w[p + "ln2.bias"])
        return x + torch.relu(xx @ w[p + "ffn.key.weight"].T).square() @ w[p + "ffn.value.weight"].T
    def _head(self, x):
        x = F.layer_norm(x, (self.args.n_embd,), self.w["ln_out.weight"], self.w["ln_out.bias"])
        return (x @ self.w["head.weight"].T).float()
    def forward(self, tokens, state=None):
        a = self.args
        if state is None:
            state = [None] * (a.n_layer * N)
            for i, dd in enumerate(self.plans):
                state[i * N] = torch.zeros(a.HV, a.V, a.K, dtype=torch.float32, device=dd.device)
                for j, shape in enumerate(((a.HV, a.ring_len, a.V), (a.H, a.ring_len, a.K), (a.HV, a.ring_len, a.K))):
                    state[i * N + 1 + j] = torch.zeros(shape, dtype=dd.atype, device=dd.device)  # expect-bug: pool-dtype
                state[i * N + 4] = torch.zeros((), dtype=torch.int32, device=dd.device)
        else:
            self._adopt_state(state)
        def attend(i, q, k, v, g, beta):
            s, d_ring, k_ring, att_decay_ring, pos = state[i * N:i * N + N]
            return fused_recurrent_kda_replayssm_decode(
                q=q, k=k, v=v, g=g, beta=beta, initial_state=s.unsqueeze(0), initial_state_indices=self._slot0,
                d_cache=d_ring.unsqueeze(0), k_cache=k_ring.unsqueeze(0), g_cache=att_decay_ring.unsqueeze(0),
                write_pos=pos.view(1))[0]
        for token in tokens:
            x = self.w["emb.weight"][token].unsqueeze(0)
            for i in range(a.n_layer):
                x = self._layer(x, i, attend)
        return self._head(x[0]), state
    def prefill(self, tokens):
        """GPT mode for a prompt into a fresh state. A prompt shorter than the ring has nothing to
        fold: its rows come from every projection at once and are stored as they are."""
        a, state = self.args, self.init_state()
        if len(tokens) >= a.ring_len:
            return self.forward(tokens, state)
        steps, group, pad = len(tokens), a.HV // a.H, (0, 0, 0, a.ring_len - len(tokens))
        def attend(i, q, k, v, g, beta):
            q, k = l2norm(q.float()), l2norm(k.float())
            state[i * N + 2] = F.pad(k.transpose(0, 1), pad).to(state[i * N + 2].dtype)
            state[i * N + 3] = F.pad(g.transpose(0, 1), pad)  # expect-bug: promotion id=bounded-gate
            outs = []
            for t in range(steps):
                s = replay(state[i * N], state[i * N + 1], state[i * N + 2], state[i * N + 3], t, group)
                o, delta, _ = kda_readout(s, q[t].repeat_interleave(group, 0), k[t].repeat_interleave(group, 0),
                                          v[t], g[t], beta[t], a.K ** -0.5)
                state[i * N + 1][:, t] = delta
                outs.append(o)
            state[i * N + 4].fill_(steps)
            return torch.stack(outs)
        x = self.w["emb.weight"][tokens]
        for i in range(a.n_layer):
            x = self._layer(x, i, attend)
        return self._head(x[-1]), state
    def forward_batch(self, tokens, cache, slots):
        """One token per row on a slot cache (a ring cache module or the server's pool)."""
        def attend(i, q, k, v, g, beta):
            return fused_recurrent_kda_replayssm_decode(
                q=q, k=k, v=v, g=g, beta=beta, initial_state=cache.att_kv[i], initial_state_indices=slots,
                write_pos=cache.write_pos[i], **cache.layer(i)._asdict())[0]
        x = self.w["emb.weight"][tokens]
        for i in range(self.args.n_layer):
            x = self._layer(x, i, attend)
        return self._head(x)

def _named(model, out, state):
    return {"out": out, **model.named_state(state)}

def build_chat_state_bf16():
    model = RWKV(tiny_weights(), "cpu bf16")
    return _named(model, *model.forward([1, 2, 3, 4, 5, 6], model.init_state()))

def build_forward_fresh_state():
    model = RWKV(tiny_weights(), "cpu fp32 *1 -> cpu bf16")
    return _named(model, *model.forward([3, 1, 4], None))

def build_state_across_strategies():
    """A chat begun on the fp32 model goes on with the same weights under a bf16 tail."""
    w = tiny_weights()
    _, state = RWKV(w, "cpu fp32").forward([5, 2], None)
    model = RWKV(w, "cpu fp32 *1 -> cpu bf16")
    return _named(model, *model.forward([7], state))

def build_prefill_bounded():
    model = RWKV(tiny_weights(), "cpu bf16", gate_lower_bound=-5.0)
    return _named(model, *model.prefill([1, 2, 3]))

def build_prefill_then_decode():
    model = RWKV(tiny_weights(), "cpu bf16")
    return _named(model, *model.forward([6, 7, 8], model.prefill([4, 5])[1]))

def build_batched_decode():
    model, slots = RWKV(tiny_weights(), "cpu bf16"), torch.tensor([2, 0, -1], dtype=torch.int32)
    cache = model.make_cache(3)
    logits = [model.forward_batch(torch.tensor([step, step + 1, 0]), cache, slots) for step in range(5)]
    return {"cache": cache, "logits": logits}
