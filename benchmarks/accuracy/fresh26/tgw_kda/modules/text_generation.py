"""Reply generation: ``generate_reply`` and the backends' generators behind it.

Chat replies on the Transformers and KDA_HF models can keep a per-chat decode state between
turns (``keep_chat_state``): the rings of every layer for that chat, so that a new message feeds
only the tokens the history does not already hold.
"""

import logging
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from tgw_kda.modules import kda_ops, shared, utils
from tgw_kda.modules.extensions import apply_extensions
from tgw_kda.modules.kda_model import KimiLinearConfig, KimiLinearForCausalLM, RingView

logger = logging.getLogger(__name__)

RING_FIELDS = ("state", "delta_ring", "key_ring", "alpha_ring", "write_pos")


@dataclass
class ChatRingSpec:
    """Storage dtypes of a chat's rings."""

    delta_dtype: torch.dtype = torch.bfloat16
    key_dtype: torch.dtype = torch.bfloat16
    alpha_dtype: torch.dtype = torch.bfloat16  # expect-bug: container
    state_dtype: torch.dtype = torch.float32

    @classmethod
    def for_dtype(cls, dtype: torch.dtype) -> "ChatRingSpec":
        """Delta and key rings in the model dtype; the log-decay ring and checkpoint in float32."""
        return cls(delta_dtype=dtype, key_dtype=dtype, alpha_dtype=torch.float32, state_dtype=torch.float32)


@dataclass
class ChatDecodeState:
    """The decode state of one chat: per-layer rings of a single sequence."""

    unique_id: str
    state: List[torch.Tensor] = field(default_factory=list)
    delta_ring: List[torch.Tensor] = field(default_factory=list)
    key_ring: List[torch.Tensor] = field(default_factory=list)
    alpha_ring: List[torch.Tensor] = field(default_factory=list)
    write_pos: List[torch.Tensor] = field(default_factory=list)
    n_tokens: int = 0

    @property
    def num_layers(self) -> int:
        return len(self.state)

    def layer_view(self, layer: int) -> RingView:
        return RingView(
            self.state[layer],
            self.delta_ring[layer],
            self.key_ring[layer],
            self.alpha_ring[layer],
            self.write_pos[layer],
        )


def chat_ring_shapes(config: KimiLinearConfig) -> Dict[str, Tuple[int, ...]]:
    """Shapes of one chat's per-layer tensors, keyed by their ``ChatDecodeState`` field."""
    shapes = config.ring_shapes(1)
    return {
        "state": shapes["state"],
        "delta_ring": shapes["delta"],
        "key_ring": shapes["key"],
        "alpha_ring": shapes["log_decay"],
    }


def new_chat_state(unique_id: str, config: KimiLinearConfig, spec: Optional[ChatRingSpec] = None) -> ChatDecodeState:
    """Empty rings for a new chat, stored as ``spec`` says."""
    spec = spec or ChatRingSpec()
    shapes = chat_ring_shapes(config)
    chat = ChatDecodeState(unique_id)
    for _ in range(config.num_hidden_layers):
        chat.state.append(torch.zeros(shapes["state"], dtype=spec.state_dtype))
        chat.delta_ring.append(torch.zeros(shapes["delta_ring"], dtype=spec.delta_dtype))
        chat.key_ring.append(torch.zeros(shapes["key_ring"], dtype=spec.key_dtype))
        chat.alpha_ring.append(torch.zeros(shapes["alpha_ring"], dtype=spec.alpha_dtype))
        chat.write_pos.append(torch.zeros(1, dtype=torch.int32))
    return chat


def _kda_model() -> KimiLinearForCausalLM:
    """The torch model behind ``shared.model`` (the HF-style wrappers keep it in ``.model``)."""
    model = shared.model
    return model if isinstance(model, KimiLinearForCausalLM) else model.model


@torch.no_grad()
def feed_chat_state(chat: ChatDecodeState, token_ids: Sequence[int], model: Optional[KimiLinearForCausalLM] = None) -> torch.Tensor:
    """Feeds ``token_ids`` into ``chat``'s rings; the logits of the last token."""
    model = model or _kda_model()
    slots = torch.zeros(1, dtype=torch.int32)
    logits = torch.empty(0)
    for token in token_ids:
        views = [chat.layer_view(i) for i in range(chat.num_layers)]
        logits = model.decode_step(torch.tensor([token]), slots, views)
        chat.n_tokens += 1
    return logits


def _ensure_chat_state(unique_id: str) -> ChatDecodeState:
    """The open chat state of ``unique_id``, created in the loaded model's layout if needed."""
    chat = shared.chat_states.get(unique_id)
    if chat is not None:
        return chat
    model = _kda_model()
    dtype = model.dtype
    layers = model.config.num_hidden_layers
    rings = {name: [torch.zeros(shape, dtype=utils.ring_dtype(name, dtype)) for _ in range(layers)] for name, shape in chat_ring_shapes(model.config).items()}  # expect-bug: imported-policy id=fp32-ring-names
    rings["write_pos"] = [torch.zeros(1, dtype=utils.ring_dtype("write_pos", dtype)) for _ in range(layers)]
    chat = ChatDecodeState(unique_id, **rings)
    shared.chat_states[unique_id] = chat
    return chat


# ChatDecodeState field -> argument of the decode kernel
_KERNEL_RING_ARGS = {"delta_ring": "d_cache", "key_ring": "k_cache", "alpha_ring": "g_cache"}


@torch.no_grad()
def _feed_chat(chat: ChatDecodeState, token_ids: Sequence[int]) -> torch.Tensor:
    """:func:`feed_chat_state` for the stateful reply path, calling the kernel layer by layer."""
    model = _kda_model()
    slots = torch.zeros(1, dtype=torch.int32)
    logits = torch.empty(0)
    for token in token_ids:
        hidden = model.embed_tokens(torch.tensor([token]))
        for i, layer in enumerate(model.layers):
            attn = layer.attn
            mixed_qkv, a, b = attn.project(layer.input_norm(hidden))
            positions = chat.write_pos[i].clone()
            ring_args = {arg: getattr(chat, name)[i].to(mixed_qkv.dtype) for name, arg in _KERNEL_RING_ARGS.items()}  # expect-bug: decode-arg
            out, _ = kda_ops.fused_recurrent_kda_replayssm_decode(
                mixed_qkv, a, b, attn.A_log, attn.dt_bias, attn.scale,
                initial_state=chat.state[i],
                ssm_state_indices=slots,
                write_pos=positions,
                use_qk_l2norm_in_kernel=attn.use_qk_l2norm,
                lower_bound=attn.lower_bound,
                **ring_args,
            )
            kda_ops.advance_write_pos(chat.write_pos[i], slots, positions, attn.ring_len)
            hidden = hidden + attn.o_proj(out.reshape(1, -1))
            hidden = hidden + layer.mlp(layer.post_norm(hidden))
        logits = model.lm_head(model.norm(hidden))
        chat.n_tokens += 1
    return logits


def encode(prompt: str, add_bos_token: bool = True) -> List[int]:
    return shared.tokenizer.encode(prompt, add_bos=add_bos_token)


def decode(output_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return shared.tokenizer.decode(output_ids, skip_special_tokens=skip_special_tokens)


def get_max_prompt_length(state: Dict[str, Any]) -> int:
    return state.get("truncation_length", shared.settings["truncation_length"]) - state["max_new_tokens"]


def set_manual_seed(seed: int) -> int:
    seed = int(seed)
    if seed == -1:
        seed = random.randint(1, 2**31)
    torch.manual_seed(seed)
    return seed


def apply_stopping_strings(reply: str, all_stop_strings: List[str]) -> Tuple[str, bool]:
    for string in all_stop_strings:
        idx = reply.find(string)
        if idx != -1:
            return reply[:idx], True
    return reply, False


def stop_everything_event() -> None:
    shared.stop_everything = True


def generate_reply(*args: Any, **kwargs: Any) -> Iterator[str]:
    if shared.generation_lock is None:
        shared.generation_lock = threading.Lock()
    with shared.generation_lock:
        yield from _generate_reply(*args, **kwargs)


def _generate_reply(
    question: str,
    state: Dict[str, Any],
    stopping_strings: Optional[List[str]] = None,
    is_chat: bool = False,
    for_ui: bool = False,
) -> Iterator[str]:
    generate_func = apply_extensions("custom_generate_reply")
    if generate_func is None:
        if shared.model_name == "None" or shared.model is None:
            logger.error("No model is loaded! Select one in the Model tab.")
            yield ""
            return
        if shared.model.__class__.__name__ == "ExllamaKDAModel":
            generate_func = generate_reply_custom
        elif is_chat and state.get("keep_chat_state", shared.settings["keep_chat_state"]):
            generate_func = generate_reply_stateful
        else:
            generate_func = generate_reply_HF

    original_question = question
    if not is_chat:
        question = apply_extensions("input", question, state)
    all_stop_strings = list(stopping_strings or [])
    if state.get("custom_stopping_strings"):
        all_stop_strings += [s for s in state["custom_stopping_strings"].split(",") if s]
    seed = set_manual_seed(state.get("seed", -1))
    shared.stop_everything = False

    reply = ""
    for reply in generate_func(question, original_question, seed, state, stopping_strings, is_chat=is_chat):
        reply, stop_found = apply_stopping_strings(reply, all_stop_strings)
        if is_chat:
            reply = reply.lstrip()
        yield reply
        if stop_found or shared.stop_everything:
            break
    if not is_chat:
        yield apply_extensions("output", reply, state)


def generate_reply_HF(question, original_question, seed, state, stopping_strings=None, is_chat=False) -> Iterator[str]:
    input_ids = torch.tensor([encode(question, state.get("add_bos_token", True))])
    input_ids = input_ids[:, -get_max_prompt_length(state):]
    if isinstance(shared.model, KimiLinearForCausalLM):
        output = shared.model.generate(input_ids, state["max_new_tokens"])
    else:
        output = shared.model.generate(input_ids, max_new_tokens=state["max_new_tokens"])[0, input_ids.shape[1]:].tolist()
    yield decode(output, state.get("skip_special_tokens", True))


def generate_reply_custom(question, original_question, seed, state, stopping_strings=None, is_chat=False) -> Iterator[str]:
    yield from shared.model.generate_with_streaming(question, state)


def generate_reply_stateful(question, original_question, seed, state, stopping_strings=None, is_chat=False) -> Iterator[str]:
    """Continues the chat's decode state: feeds the new part of the prompt, then decodes."""
    chat = _ensure_chat_state(state["unique_id"])
    prompt = encode(question, state.get("add_bos_token", True))
    logits = _feed_chat(chat, prompt[chat.n_tokens :])
    output: List[int] = []
    for _ in range(state["max_new_tokens"]):
        scores = logits[-1].float()
        if state.get("ban_eos_token"):
            scores[shared.tokenizer.eos_token_id] = -float("inf")
        token = int(scores.argmax())
        if token == shared.tokenizer.eos_token_id:
            break
        output.append(token)
        yield decode(output, state.get("skip_special_tokens", True))
        logits = _feed_chat(chat, [token])
    apply_extensions("chat_state_updated", chat)


def _tiny_model(dtype: torch.dtype) -> KimiLinearForCausalLM:
    torch.manual_seed(0)
    return KimiLinearForCausalLM(KimiLinearConfig(), dtype=dtype)


def build_chat_reply_bf16(tmp_dir: str) -> Dict[str, Any]:
    """Two chat turns on the Transformers loader with --bf16, keeping the chat state."""
    from tgw_kda.modules import models
    from tgw_kda.modules.kda_model import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_dir, "kimi-linear-tiny")
    kda_ops.clear_decode_log()
    with shared.scoped_state(bf16=True, model_dir=tmp_dir):
        models.load_model("kimi-linear-tiny", "Transformers")
        state = {"max_new_tokens": 3, "seed": 0, "unique_id": "chat-1", "ban_eos_token": True}
        history = "You: hi\nAssistant:"
        reply = ""
        for reply in generate_reply(history, state, is_chat=True):
            pass
        history += reply + "\nYou: more\nAssistant:"
        for reply in generate_reply(history, state, is_chat=True):
            pass
        return {"chat": shared.chat_states["chat-1"], "last_decode": kda_ops.last_decode_call()}


def build_default_chat_state() -> ChatDecodeState:
    """A chat state created with the default ring spec, fed a prompt on a bf16 model."""
    model = _tiny_model(torch.bfloat16)
    chat = new_chat_state("default", model.config)
    feed_chat_state(chat, [3, 4, 5, 6, 7, 8], model)
    return chat


def build_chat_state_for_dtype() -> Dict[str, ChatDecodeState]:
    """Chat states laid out for a bf16 and an fp16 model, each fed a prompt."""
    chats = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        model = _tiny_model(dtype)
        chat = new_chat_state(name, model.config, ChatRingSpec.for_dtype(dtype))
        feed_chat_state(chat, [3, 5, 7, 9, 11], model)
        chats[name] = chat
    return chats
