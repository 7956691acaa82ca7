# Kimi Linear: KDA (Kimi Delta Attention) decoder layers with ReplaySSM decode caches.

import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ...layers import (
    FastLinear,
    FastRMSNorm,
    TensorParallelColumnLinear,
    TensorParallelEmbedding,
    TensorParallelHead,
    TensorParallelRowLinear,
)
from ...layers.attention import ReplayCache, ReplaySpec, kda_gate, replay_decode
from ...layers.attention.replay import (
    expand_heads,
    l2norm,
    rebuild_state,
    recurrent_step,
    split_qkv,
)
from ...models.globals import get_cache_dtype
from ...utils import Weights, save_file, set_default_dtype
from ...utils.dist import FakeGroup


@dataclass
class KimiLinearConfig:
    vocab_size: int = 64
    hidden_size: int = 32
    intermediate_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_value_heads: int = 2
    head_dim: int = 8
    v_head_dim: int = 8
    ring_len: int = 4
    lower_bound: Optional[float] = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    num_nextn_predict_layers: int = 0
    mtp_slots: int = 4
    torch_dtype: str = "bfloat16"

    @classmethod
    def from_pretrained(cls, model_id: str) -> "KimiLinearConfig":
        with open(Path(model_id) / "config.json") as f:
            return cls(**json.load(f))

    def save_pretrained(self, folder):
        with open(Path(folder) / "config.json", "w") as f:
            json.dump(asdict(self), f)

    def replay_spec(self, world_size: int = 1) -> ReplaySpec:
        return ReplaySpec(
            num_heads=self.num_attention_heads // world_size,
            num_v_heads=self.num_value_heads // world_size,
            head_k=self.head_dim,
            head_v=self.v_head_dim,
            ring_len=self.ring_len,
        )


class FlashKimiAttention(nn.Module):
    def __init__(self, prefix: str, config: KimiLinearConfig, weights):
        super().__init__()
        world_size = weights.process_group.size()
        self.replay_spec = config.replay_spec(world_size)
        self.num_heads = self.replay_spec.num_heads
        self.num_v_heads = self.replay_spec.num_v_heads
        self.head_k = config.head_dim
        self.head_v = config.v_head_dim
        self.scale = self.head_k**-0.5
        self.lower_bound = config.lower_bound

        self.qkv_proj = TensorParallelColumnLinear.load_multi(
            config,
            prefixes=[f"{prefix}.q_proj", f"{prefix}.k_proj", f"{prefix}.v_proj"],
            dim=0,
            weights=weights,
            bias=False,
        )
        self.f_a_proj = FastLinear.load(config, f"{prefix}.f_a_proj", weights, bias=False)
        self.f_b_proj = TensorParallelColumnLinear.load(config, f"{prefix}.f_b_proj", weights, bias=False)
        self.b_proj = TensorParallelColumnLinear.load(config, f"{prefix}.b_proj", weights, bias=False)
        # Gate parameters stay in float32 whatever the model dtype: the kernels expect it.
        self.A_log = nn.Parameter(
            weights.get_sharded(f"{prefix}.A_log", dim=0, to_dtype=False).float(), requires_grad=False
        )
        self.dt_bias = nn.Parameter(
            weights.get_sharded(f"{prefix}.dt_bias", dim=0, to_dtype=False).float(), requires_grad=False
        )
        self.o_norm = FastRMSNorm.load(f"{prefix}.o_norm", weights, eps=config.rms_norm_eps)
        self.o_proj = TensorParallelRowLinear.load(config, f"{prefix}.o_proj", weights, bias=False)

    def project(self, hidden_states: torch.Tensor):
        """Packed q/k/v, gate activations ([..., HV, K]) and beta logits ([..., HV])."""
        mixed_qkv = self.qkv_proj(hidden_states)
        a = self.f_b_proj(self.f_a_proj(hidden_states)).unflatten(-1, (self.num_v_heads, self.head_k))
        b = self.b_proj(hidden_states)
        return mixed_qkv, a, b

    def output(self, o: torch.Tensor) -> torch.Tensor:
        o, _ = self.o_norm(o)
        return self.o_proj(o.flatten(-2))

    def forward(self, hidden_states, cache, slots, write_pos, force_flush=None):
        mixed_qkv, a, b = self.project(hidden_states)
        out = torch.empty(
            (hidden_states.shape[0], 1, self.num_v_heads, self.head_v),
            dtype=hidden_states.dtype,
            device=hidden_states.device,
        )
        replay_decode(
            mixed_qkv=mixed_qkv,
            a=a,
            b=b,
            A_log=self.A_log,
            dt_bias=self.dt_bias,
            scale=self.scale,
            initial_state=cache.state,
            d_cache=cache.delta_ring,
            k_cache=cache.key_ring,
            g_cache=cache.decay_ring,
            out=out,
            ssm_state_indices=slots,
            write_pos=write_pos,
            force_flush=force_flush,
            use_qk_l2norm_in_kernel=True,
            lower_bound=self.lower_bound,
        )
        return self.output(out[:, 0])

    def prefill(self, hidden_states, cache, slot: int):
        """Runs a prompt through the recurrence and stores the final state as the checkpoint.

        The rings of the slot start empty (the batch sets its cursor to zero).
        """
        mixed_qkv, a, b = self.project(hidden_states)
        q, k, v = split_qkv(mixed_qkv.float(), self.num_heads, self.num_v_heads, self.head_k, self.head_v)
        groups = self.num_v_heads // self.num_heads
        q, k = expand_heads(l2norm(q), groups), expand_heads(l2norm(k), groups)
        g = kda_gate(a, self.A_log, self.dt_bias, self.lower_bound)
        beta = torch.sigmoid(b.float())
        state = torch.zeros(self.replay_spec.state_shape(1)[1:], device=hidden_states.device, dtype=torch.float32)
        outputs = []
        for t in range(hidden_states.shape[0]):
            state, _, o = recurrent_step(state, q[t] * self.scale, k[t], v[t], g[t], beta[t])
            outputs.append(o)
        cache.state[slot] = state.to(cache.state.dtype)
        return self.output(torch.stack(outputs).to(hidden_states.dtype))


class FlashKimiMLP(nn.Module):
    def __init__(self, prefix, config, weights):
        super().__init__()
        self.gate_up_proj = TensorParallelColumnLinear.load_gate_up(config, prefix, weights, bias=False)
        self.down_proj = TensorParallelRowLinear.load(config, f"{prefix}.down_proj", weights, bias=False)

    def forward(self, hidden_states):
        gate, up = self.gate_up_proj(hidden_states).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class FlashKimiLayer(nn.Module):
    def __init__(self, prefix: str, config, weights):
        super().__init__()
        self.self_attn = FlashKimiAttention(f"{prefix}.self_attn", config, weights)
        self.mlp = FlashKimiMLP(f"{prefix}.mlp", config, weights)
        self.input_layernorm = FastRMSNorm.load(f"{prefix}.input_layernorm", weights, eps=config.rms_norm_eps)
        self.post_attention_layernorm = FastRMSNorm.load(
            f"{prefix}.post_attention_layernorm", weights, eps=config.rms_norm_eps
        )

    def forward(self, hidden_states, residual, cache, slots, write_pos, force_flush=None, prefill_slot=None):
        normed_hidden_states, res = self.input_layernorm(hidden_states, residual)
        if prefill_slot is None:
            attn_output = self.self_attn(normed_hidden_states, cache, slots, write_pos, force_flush)
        else:
            attn_output = self.self_attn.prefill(normed_hidden_states, cache, prefill_slot)
        normed_attn_res_output, attn_res = self.post_attention_layernorm(attn_output, res)
        return self.mlp(normed_attn_res_output), attn_res


class FlashKimiModel(nn.Module):
    def __init__(self, prefix: str, config, weights):
        super().__init__()
        self.embed_tokens = TensorParallelEmbedding(prefix=f"{prefix}.embed_tokens", weights=weights)
        self.layers = nn.ModuleList(
            [FlashKimiLayer(f"{prefix}.layers.{layer_id}", config, weights) for layer_id in range(config.num_hidden_layers)]
        )
        self.norm = FastRMSNorm.load(f"{prefix}.norm", weights, eps=config.rms_norm_eps)

    def forward(self, input_ids, caches, slots, write_pos, force_flush=None, prefill_slot=None):
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        for layer, cache in zip(self.layers, caches):
            hidden_states, residual = layer(
                hidden_states, residual, cache, slots, write_pos, force_flush, prefill_slot=prefill_slot
            )
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class DraftProposal(NamedTuple):
    token_ids: torch.Tensor
    delta_ring: torch.Tensor
    key_ring: torch.Tensor
    decay_ring: torch.Tensor


class FlashKimiMTP(nn.Module):
    """Multi-token prediction head: one KDA block over the target's last hidden state.

    The head keeps its own small slot pool. Drafted steps never touch it: they run on the
    rebuilt state of each slot and return their ring rows, and :meth:`commit` appends the rows
    of the steps the target accepted.
    """

    def __init__(self, prefix: str, config, weights, num_slots: int):
        super().__init__()
        self.enorm = FastRMSNorm.load(f"{prefix}.enorm", weights, eps=config.rms_norm_eps, hidden_size=config.hidden_size)
        self.hnorm = FastRMSNorm.load(f"{prefix}.hnorm", weights, eps=config.rms_norm_eps, hidden_size=config.hidden_size)
        self.eh_proj = FastLinear.load(config, f"{prefix}.eh_proj", weights, bias=False)
        self.self_attn = FlashKimiAttention(f"{prefix}.self_attn", config, weights)
        spec = self.self_attn.replay_spec
        cache_dtype = get_cache_dtype(weights.dtype)
        self.register_buffer("state", torch.zeros(spec.state_shape(num_slots), dtype=cache_dtype, device=weights.device))
        self.register_buffer("delta_ring", torch.zeros(spec.delta_shape(num_slots), dtype=cache_dtype, device=weights.device))
        self.register_buffer("key_ring", torch.zeros(spec.key_shape(num_slots), dtype=cache_dtype, device=weights.device))
        self.register_buffer("decay_ring", torch.zeros(spec.decay_shape(num_slots), device=weights.device))  # expect-bug: default-dtype id=mtp-default-dtype
        self.register_buffer("write_pos", torch.zeros(num_slots, dtype=torch.int32, device=weights.device))

    @torch.no_grad()
    def propose(self, hidden_states, input_ids, slots, embed_tokens, lm_head, num_tokens: int) -> DraftProposal:
        attn = self.self_attn
        spec = attn.replay_spec
        groups = spec.num_v_heads // spec.num_heads
        # The draft block runs in the activation dtype end to end; it only has to rank tokens.
        A = attn.A_log.exp().to(hidden_states.dtype)
        dt_bias = attn.dt_bias.to(hidden_states.dtype).view(spec.num_v_heads, spec.head_k)
        states = []
        for slot in slots.tolist():
            c = int(self.write_pos[slot])
            states.append(
                rebuild_state(
                    self.state[slot],
                    self.delta_ring[slot, :, :c],
                    expand_heads(self.key_ring[slot, :, :c], groups, dim=0),
                    self.decay_ring[slot, :, :c],
                )
            )
        state = torch.stack(states)
        tokens, deltas, keys, decays = [], [], [], []
        for _ in range(num_tokens):
            embeds, _ = self.enorm(embed_tokens(input_ids))
            previous, _ = self.hnorm(hidden_states)
            x = self.eh_proj(torch.cat([embeds, previous], dim=-1))
            mixed_qkv, a, b = attn.project(x)
            g = -A[:, None] * F.softplus(a + dt_bias)  # expect-bug: promotion
            q, k, v = split_qkv(mixed_qkv.float(), spec.num_heads, spec.num_v_heads, spec.head_k, spec.head_v)
            q, k = l2norm(q), l2norm(k)
            state, delta, o = recurrent_step(
                state,
                expand_heads(q, groups) * attn.scale,
                expand_heads(k, groups),
                v,
                g.float(),
                torch.sigmoid(b.float()),
            )
            hidden_states = attn.output(o.to(x.dtype)) + x
            input_ids = lm_head(hidden_states).argmax(dim=-1)
            tokens.append(input_ids)
            deltas.append(delta.to(x.dtype))
            keys.append(k.to(x.dtype))
            decays.append(g)
        return DraftProposal(
            token_ids=torch.stack(tokens, dim=1),
            delta_ring=torch.stack(deltas, dim=2),
            key_ring=torch.stack(keys, dim=2),
            decay_ring=torch.stack(decays, dim=2),
        )

    @torch.no_grad()
    def commit(self, proposal: DraftProposal, slots, accepted):
        """Appends the rows of the first ``accepted[i]`` drafted steps of row ``i``."""
        spec = self.self_attn.replay_spec
        groups = spec.num_v_heads // spec.num_heads
        for row, slot in enumerate(slots.tolist()):
            for step in range(int(accepted[row])):
                c = int(self.write_pos[slot])
                if c == spec.ring_len - 1:
                    state = rebuild_state(
                        self.state[slot],
                        self.delta_ring[slot, :, :c],
                        expand_heads(self.key_ring[slot, :, :c], groups, dim=0),
                        self.decay_ring[slot, :, :c],
                    )
                    alpha = proposal.decay_ring[row, :, step].float().exp()
                    k = expand_heads(proposal.key_ring[row, :, step].float(), groups)
                    state = state * alpha[:, None, :] + proposal.delta_ring[row, :, step].float()[:, :, None] * k[:, None, :]
                    self.state[slot] = state.to(self.state.dtype)
                    self.write_pos[slot] = 0
                else:
                    self.delta_ring[slot, :, c] = proposal.delta_ring[row, :, step]
                    self.key_ring[slot, :, c] = proposal.key_ring[row, ::groups, step]
                    self.decay_ring[slot, :, c] = proposal.decay_ring[row, :, step]
                    self.write_pos[slot] = c + 1


class FlashKimiForCausalLM(nn.Module):
    def __init__(self, prefix: str, config, weights):
        super().__init__()
        self.config = config
        self.model = FlashKimiModel(prefix, config, weights)
        self.lm_head = TensorParallelHead.load(config, prefix="lm_head", weights=weights)
        self.replay_caches = nn.ModuleList()
        self.mtp = None
        if config.num_nextn_predict_layers > 0:
            # Norms missing from the MTP export are created here; build them in the model dtype.
            with set_default_dtype(weights.dtype):  # expect-bug: default-dtype id=mtp-default-dtype
                self.mtp = FlashKimiMTP(f"{prefix}.mtp", config, weights, num_slots=config.mtp_slots)

    def set_replay_caches(self, caches: List[ReplayCache]):
        self.replay_caches = nn.ModuleList(caches)

    def forward(self, input_ids, slots, write_pos, force_flush=None):
        hidden_states = self.model(input_ids, self.replay_caches, slots, write_pos, force_flush)
        return self.lm_head(hidden_states), hidden_states

    def prefill(self, input_ids, slot: int):
        hidden_states = self.model(input_ids, self.replay_caches, None, None, prefill_slot=slot)
        return self.lm_head(hidden_states[-1:]), hidden_states[-1:]


def write_dummy_checkpoint(config: KimiLinearConfig, folder, seed: int = 0, mtp_norms: bool = True) -> List[Path]:
    """Random float32 weights with the checkpoint layout of Kimi Linear, for load tests."""
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape, std=0.02):
        return torch.randn(shape, generator=generator) * std

    H, HV, K, V = config.num_attention_heads, config.num_value_heads, config.head_dim, config.v_head_dim
    hidden, inter = config.hidden_size, config.intermediate_size

    def attention(prefix):
        return {
            f"{prefix}.q_proj.weight": normal(H * K, hidden, std=0.2),
            f"{prefix}.k_proj.weight": normal(H * K, hidden, std=0.2),
            f"{prefix}.v_proj.weight": normal(HV * V, hidden, std=0.2),
            f"{prefix}.f_a_proj.weight": normal(K, hidden, std=0.2),
            f"{prefix}.f_b_proj.weight": normal(HV * K, K, std=0.2),
            f"{prefix}.b_proj.weight": normal(HV, hidden, std=0.2),
            f"{prefix}.A_log": torch.log(torch.rand(HV, generator=generator) * 15 + 1),
            f"{prefix}.dt_bias": normal(HV * K, std=0.5),
            f"{prefix}.o_norm.weight": torch.ones(V),
            f"{prefix}.o_proj.weight": normal(hidden, HV * V, std=0.2),
        }

    tensors = {
        "model.embed_tokens.weight": normal(config.vocab_size, hidden, std=1.0),
        "model.norm.weight": torch.ones(hidden),
        "lm_head.weight": normal(config.vocab_size, hidden, std=0.2),
    }
    for layer_id in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer_id}"
        tensors.update(attention(f"{prefix}.self_attn"))
        tensors[f"{prefix}.input_layernorm.weight"] = torch.ones(hidden)
        tensors[f"{prefix}.post_attention_layernorm.weight"] = torch.ones(hidden)
        tensors[f"{prefix}.mlp.gate_proj.weight"] = normal(inter, hidden, std=0.2)
        tensors[f"{prefix}.mlp.up_proj.weight"] = normal(inter, hidden, std=0.2)
        tensors[f"{prefix}.mlp.down_proj.weight"] = normal(hidden, inter, std=0.2)
    if config.num_nextn_predict_layers > 0:
        tensors.update(attention("model.mtp.self_attn"))
        tensors["model.mtp.eh_proj.weight"] = normal(hidden, 2 * hidden, std=0.2)
        if mtp_norms:
            tensors["model.mtp.enorm.weight"] = torch.ones(hidden)
            tensors["model.mtp.hnorm.weight"] = torch.ones(hidden)
    folder = Path(folder)
    config.save_pretrained(folder)
    filename = folder / "model-00001-of-00001.pt"
    save_file(tensors, filename, metadata={"format": "pt"})
    return [filename]


def build_kimi_layer_decode():
    """A bf16 KDA layer: prompt prefill into a slot, then six decode steps with a flush."""
    torch.manual_seed(0)
    config = KimiLinearConfig(num_hidden_layers=1, num_value_heads=4)
    with tempfile.TemporaryDirectory() as folder:
        filenames = write_dummy_checkpoint(config, folder)
        weights = Weights(filenames, torch.device("cpu"), torch.bfloat16, FakeGroup(0, 1))
        layer = FlashKimiLayer("model.layers.0", config, weights)
    cache = ReplayCache(layer.self_attn.replay_spec, num_slots=3, dtype=torch.bfloat16)
    prompt = torch.randn(5, config.hidden_size).to(torch.bfloat16)
    layer(prompt, None, cache, None, None, prefill_slot=1)
    slots = torch.tensor([1, -1], dtype=torch.int32)
    write_pos = torch.zeros(2, dtype=torch.int32)
    outputs = []
    for _ in range(6):
        hidden = torch.randn(2, config.hidden_size).to(torch.bfloat16)
        output, _ = layer(hidden, None, cache, slots, write_pos)
        outputs.append(output)
        write_pos = (write_pos + 1) % config.ring_len
    return {"cache": cache, "outputs": torch.stack(outputs), "A_log": layer.self_attn.A_log}


def build_mtp_draft_model():
    """The model's MTP head drafting three tokens for two slots and committing two of them."""
    torch.manual_seed(0)
    config = KimiLinearConfig(num_nextn_predict_layers=1)
    with tempfile.TemporaryDirectory() as folder:
        filenames = write_dummy_checkpoint(config, folder, mtp_norms=False)
        weights = Weights(filenames, torch.device("cpu"), torch.bfloat16, FakeGroup(0, 1))
        model = FlashKimiForCausalLM("model", config, weights)
    hidden_states = torch.randn(2, config.hidden_size).to(torch.bfloat16)
    slots = torch.tensor([0, 2], dtype=torch.int32)
    proposal = model.mtp.propose(
        hidden_states,
        torch.tensor([3, 7]),
        slots,
        model.model.embed_tokens,
        model.lm_head,
        num_tokens=3,
    )
    model.mtp.commit(proposal, slots, accepted=torch.tensor([2, 3]))
    return {"mtp": model.mtp, "proposal": proposal}
