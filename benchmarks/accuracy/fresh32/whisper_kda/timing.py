import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, List

import torch
import torch.nn.functional as F

from .audio import HOP_LENGTH, SAMPLE_RATE, TOKENS_PER_SECOND
from .ring_cache import RingArgs
from .tokenizer import Tokenizer

if TYPE_CHECKING:
    from .model import Whisper


def median_filter(x: torch.Tensor, filter_width: int):
    """Apply a median filter of width `filter_width` along the last dimension of `x`"""
    pad_width = filter_width // 2
    if x.shape[-1] <= pad_width:
        # F.pad requires the padding width to be smaller than the input dimension
        return x

    if (ndim := x.ndim) <= 2:
        # `F.pad` does not support 1D or 2D inputs for reflect padding but supports 3D and 4D
        x = x[None, None, :]

    assert filter_width > 0 and filter_width % 2 == 1, "`filter_width` should be an odd number"

    x = F.pad(x, (filter_width // 2, filter_width // 2, 0, 0), mode="reflect")

    # sort() is faster than torch.median (https://github.com/pytorch/pytorch/issues/51450)
    result = x.unfold(-1, filter_width, 1).sort()[0][..., filter_width // 2]

    if ndim <= 2:
        result = result[0, 0]

    return result


def backtrace(trace: torch.Tensor):
    i = trace.shape[0] - 1
    j = trace.shape[1] - 1
    trace[0, :] = 2
    trace[:, 0] = 1

    result = []
    while i > 0 or j > 0:
        result.append((i - 1, j - 1))

        if trace[i, j] == 0:
            i -= 1
            j -= 1
        elif trace[i, j] == 1:
            i -= 1
        elif trace[i, j] == 2:
            j -= 1
        else:
            raise ValueError("Unexpected trace[i, j]")

    result = torch.tensor(result)
    return result.flip(0).T


def dtw(x: torch.Tensor):
    """Dynamic time warping on the CPU (the cost matrix of an alignment is small)."""
    x = x.double().cpu()
    N, M = x.shape
    cost = torch.full((N + 1, M + 1), float("inf"), dtype=torch.float64)
    trace = -torch.ones((N + 1, M + 1), dtype=torch.int64)

    cost[0, 0] = 0
    for j in range(1, M + 1):
        for i in range(1, N + 1):
            c0 = cost[i - 1, j - 1]
            c1 = cost[i - 1, j]
            c2 = cost[i, j - 1]

            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2

            cost[i, j] = x[i - 1, j - 1] + c
            trace[i, j] = t

    return backtrace(trace)


@dataclass
class WordTiming:
    word: str
    tokens: List[int]
    start: float
    end: float
    probability: float


def _window_rings(model: "Whisper", n_rows: int, dtype: torch.dtype) -> List[RingArgs]:
    """Empty decoder rings for the windowed alignment pass, in the layout of the model's dims."""
    shapes = model.dims.ring_shapes(n_rows)
    state_dtype, delta_dtype, key_dtype, forget_dtype = model.dims.ring_dtypes(dtype)
    device = model.device
    return [
        RingArgs(
            initial_state=torch.zeros(shapes["state"], dtype=state_dtype, device=device),
            d_cache=torch.zeros(shapes["delta"], dtype=delta_dtype, device=device),
            k_cache=torch.zeros(shapes["key"], dtype=key_dtype, device=device),
            g_cache=torch.zeros(shapes["forget"], dtype=forget_dtype, device=device),  # expect-bug: imported-policy id=dims-ring-dtypes
            write_pos=torch.zeros(n_rows, dtype=torch.int32, device=device),
            ssm_state_indices=torch.arange(n_rows, dtype=torch.int32, device=device),
        )
        for _ in range(model.dims.n_text_layer)
    ]


def _decoder_logits(model: "Whisper", tokens: torch.Tensor, audio_features: torch.Tensor) -> torch.Tensor:
    """Logits of every token. The decoder's positional embedding covers `n_text_ctx` tokens, so
    longer transcripts go through in windows; the KDA state carries over from one window to the
    next through the rings (the positions restart)."""
    n_ctx = model.dims.n_text_ctx
    if tokens.shape[-1] <= n_ctx:
        return model.logits(tokens.unsqueeze(0), audio_features)[0]

    kv_cache, hooks = model.install_kv_cache_hooks()
    for block, rings in zip(model.decoder.blocks, _window_rings(model, 1, audio_features.dtype)):
        kv_cache[block.attn] = rings
    try:
        pieces = []
        for start in range(0, tokens.shape[-1], n_ctx):
            kv_cache[model.decoder] = 0
            pieces.append(model.logits(tokens[start : start + n_ctx].unsqueeze(0), audio_features, kv_cache=kv_cache)[0])
    finally:
        for hook in hooks:
            hook.remove()
    return torch.cat(pieces)


def find_alignment(
    model: "Whisper",
    tokenizer: Tokenizer,
    text_tokens: List[int],
    mel: torch.Tensor,
    num_frames: int,
    *,
    medfilt_width: int = 7,
    qk_scale: float = 1.0,
) -> List[WordTiming]:
    if len(text_tokens) == 0:
        return []

    from .model import disable_sdpa

    tokens = torch.tensor(
        [
            *tokenizer.sot_sequence,
            tokenizer.no_timestamps,
            *text_tokens,
            tokenizer.eot,
        ]
    ).to(model.device)

    # install hooks on the cross attention layers to retrieve the attention weights
    QKs: List[List[torch.Tensor]] = [[] for _ in range(model.dims.n_text_layer)]
    hooks = [
        block.cross_attn.register_forward_hook(lambda _, ins, outs, index=i: QKs[index].append(outs[-1][0]))
        for i, block in enumerate(model.decoder.blocks)
    ]

    with torch.no_grad(), disable_sdpa():
        audio_features = model.embed_audio(mel.unsqueeze(0))
        logits = _decoder_logits(model, tokens, audio_features)
        sampled_logits = logits[len(tokenizer.sot_sequence) :, : tokenizer.eot]
        token_probs = sampled_logits.softmax(dim=-1)
        text_token_probs = token_probs[torch.arange(len(text_tokens)), text_tokens]
        text_token_probs = text_token_probs.tolist()

    for hook in hooks:
        hook.remove()

    # heads * tokens * frames
    weights = torch.stack([torch.cat(QKs[_l], dim=-2)[_h] for _l, _h in model.alignment_heads.indices().T])
    weights = weights[:, :, : num_frames // 2]
    weights = (weights * qk_scale).softmax(dim=-1)
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    weights = (weights - mean) / std
    weights = median_filter(weights, medfilt_width)

    matrix = weights.mean(axis=0)
    matrix = matrix[len(tokenizer.sot_sequence) : -1]
    text_indices, time_indices = dtw(-matrix)

    words, word_tokens = tokenizer.split_to_word_tokens(text_tokens + [tokenizer.eot])
    if len(word_tokens) <= 1:
        # return on eot only
        # >>> np.pad([], (1, 0))
        # array([0.])
        # This results in crashes when we lookup jump_times with float, like
        # IndexError: arrays used as indices must be of integer (or boolean) type
        return []
    word_boundaries = torch.tensor([0] + list(itertools.accumulate(len(t) for t in word_tokens[:-1])))

    jumps = F.pad(torch.diff(text_indices), (1, 0), value=1).bool()
    jump_times = time_indices[jumps].double() / TOKENS_PER_SECOND
    start_times = jump_times[word_boundaries[:-1]]
    end_times = jump_times[word_boundaries[1:]]
    word_probabilities = [
        sum(text_token_probs[i:j]) / max(j - i, 1) for i, j in zip(word_boundaries[:-1].tolist(), word_boundaries[1:].tolist())
    ]

    return [
        WordTiming(word, tokens, start, end, probability)
        for word, tokens, start, end, probability in zip(words, word_tokens, start_times.tolist(), end_times.tolist(), word_probabilities)
    ]


def merge_punctuations(alignment: List[WordTiming], prepended: str, appended: str):
    # merge prepended punctuations
    i = len(alignment) - 2
    j = len(alignment) - 1
    while i >= 0:
        previous = alignment[i]
        following = alignment[j]
        if previous.word.startswith(" ") and previous.word.strip() in prepended:
            # prepend it to the following word
            following.word = previous.word + following.word
            following.tokens = previous.tokens + following.tokens
            previous.word = ""
            previous.tokens = []
        else:
            j = i
        i -= 1

    # merge appended punctuations
    i = 0
    j = 1
    while j < len(alignment):
        previous = alignment[i]
        following = alignment[j]
        if not previous.word.endswith(" ") and following.word in appended:
            # append it to the previous word
            previous.word = previous.word + following.word
            previous.tokens = previous.tokens + following.tokens
            following.word = ""
            following.tokens = []
        else:
            i = j
        j += 1


def add_word_timestamps(
    *,
    segments: List[dict],
    model: "Whisper",
    tokenizer: Tokenizer,
    mel: torch.Tensor,
    num_frames: int,
    prepend_punctuations: str = "\"'“¿([{-",
    append_punctuations: str = "\"'.。,，!！?？:：”)]}、",
    last_speech_timestamp: float = None,
    **kwargs,
):
    if len(segments) == 0:
        return

    text_tokens_per_segment = [[token for token in segment["tokens"] if token < tokenizer.eot] for segment in segments]

    text_tokens = list(itertools.chain.from_iterable(text_tokens_per_segment))
    alignment = find_alignment(model, tokenizer, text_tokens, mel, num_frames, **kwargs)
    merge_punctuations(alignment, prepend_punctuations, append_punctuations)

    time_offset = segments[0]["seek"] * HOP_LENGTH / SAMPLE_RATE
    word_index = 0

    for segment, text_tokens in zip(segments, text_tokens_per_segment):
        saved_tokens = 0
        words = []

        while word_index < len(alignment) and saved_tokens < len(text_tokens):
            timing = alignment[word_index]

            if timing.word:
                words.append(
                    dict(
                        word=timing.word,
                        start=round(time_offset + timing.start, 2),
                        end=round(time_offset + timing.end, 2),
                        probability=timing.probability,
                    )
                )

            saved_tokens += len(timing.tokens)
            word_index += 1

        if len(words) > 0:
            if last_speech_timestamp is not None and words[0]["end"] - last_speech_timestamp > 4.0:
                words[0]["start"] = max(words[0]["start"], words[0]["end"] - 2.0)
            segment["start"] = words[0]["start"]
            segment["end"] = words[-1]["end"]
            last_speech_timestamp = segment["end"]

        segment["words"] = words
