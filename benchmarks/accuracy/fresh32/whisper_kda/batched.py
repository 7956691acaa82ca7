"""Batched transcription of long audio, in the style of faster-whisper's BatchedInferencePipeline.

The audio is cut into windows at quiet points (a simple energy VAD), the windows of a batch are
decoded together, and the decoder rings come from a `SlotPool` that lives as long as the
pipeline, so that a batch does not allocate rings. Compute types use CTranslate2's names.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional

import torch

from . import utils
from .audio import HOP_LENGTH, SAMPLE_RATE, log_mel_spectrogram, pad_or_trim
from .decoding import DecodingOptions, DecodingResult, decode
from .ring_cache import RingArgs

if TYPE_CHECKING:
    from .model import ModelDimensions, Whisper

_POOL_RINGS = (("delta_rows", "delta"), ("key_rows", "key"), ("log_forget", "forget"))


class SlotPool:
    """Ring slots for the rows of a batch; a decode call acquires the first ``n_rows`` of them."""

    def __init__(self, dims: "ModelDimensions", n_slots: int, compute_type: str = "default", device="cpu"):
        dtypes = utils.CACHE_DTYPES[compute_type]
        shapes = dims.ring_shapes(n_slots)
        n_layer = dims.n_text_layer
        self.dims = dims
        self.n_slots = n_slots
        self.compute_type = compute_type
        self.device = torch.device(device)
        self.dtype = dtypes["delta"]
        self.ssm_state = [torch.zeros(shapes["state"], dtype=dtypes["state"], device=device) for _ in range(n_layer)]
        self.delta_rows = [torch.zeros(shapes["delta"], dtype=dtypes["delta"], device=device) for _ in range(n_layer)]
        self.key_rows = [torch.zeros(shapes["key"], dtype=dtypes["key"], device=device) for _ in range(n_layer)]
        self.log_forget = [torch.zeros(shapes["forget"], dtype=dtypes["forget"], device=device) for _ in range(n_layer)]  # expect-bug: imported-policy id=cache-dtypes
        self.write_pos = [torch.zeros(n_slots, dtype=torch.int32, device=device) for _ in range(n_layer)]
        self.in_use = 0

    def acquire(self, n_rows: int) -> List[RingArgs]:
        if self.in_use:
            raise RuntimeError("the slot pool is already in use")
        if n_rows > self.n_slots:
            self.grow(n_rows)
        self.in_use = n_rows
        slots = torch.arange(n_rows, dtype=torch.int32, device=self.device)
        args = []
        for state, delta, key, forget, write_pos in zip(self.ssm_state, self.delta_rows, self.key_rows, self.log_forget, self.write_pos):
            for tensor in (state, delta, key, forget, write_pos):
                tensor[:n_rows].zero_()
            args.append(RingArgs(state[:n_rows], delta[:n_rows], key[:n_rows], forget[:n_rows], write_pos[:n_rows], slots))
        return args

    def release(self) -> None:
        self.in_use = 0

    def grow(self, n_slots: int) -> None:
        """Re-allocates the pool for ``n_slots`` slots (a larger batch than configured)."""
        shapes = self.dims.ring_shapes(n_slots)
        n_layer = self.dims.n_text_layer
        grown = {name: [torch.zeros(shapes[kind], dtype=self.dtype, device=self.device) for _ in range(n_layer)] for name, kind in _POOL_RINGS}  # expect-bug: pool-dtype
        grown["ssm_state"] = [torch.zeros(shapes["state"], dtype=torch.float32, device=self.device) for _ in range(n_layer)]
        grown["write_pos"] = [torch.zeros(n_slots, dtype=torch.int32, device=self.device) for _ in range(n_layer)]
        for name, tensors in grown.items():
            for new, old in zip(tensors, getattr(self, name)):
                new[: old.shape[0]] = old
            setattr(self, name, tensors)
        self.n_slots = n_slots

    def retype(self, compute_type: str) -> None:
        """Switches a warm pool to another compute type without giving its memory back first."""
        dtypes = utils.CACHE_DTYPES[compute_type]
        self.delta_rows = [t.to(dtypes["delta"]) for t in self.delta_rows]
        self.key_rows = [t.to(dtypes["key"]) for t in self.key_rows]
        self.log_forget = [t.type(dtypes["delta"]) for t in self.log_forget]  # expect-bug: cast
        self.dtype = dtypes["delta"]
        self.compute_type = compute_type


@dataclass
class SpeechChunk:
    start: int  # samples
    end: int


def get_speech_chunks(audio: torch.Tensor, window: int, threshold: float = 1e-3, frame: int = HOP_LENGTH) -> Iterator[SpeechChunk]:
    """Windows of at most ``window`` samples that contain speech (mean frame energy above
    ``threshold``), each cut at the quietest frame of its last tenth."""
    start = 0
    n_samples = audio.shape[-1]
    while start < n_samples:
        end = min(start + window, n_samples)
        if end < n_samples:
            tail = audio[end - window // 10 : end]
            energies = tail[: tail.shape[0] // frame * frame].reshape(-1, frame).pow(2).mean(dim=-1)
            if energies.numel():
                end = end - window // 10 + int(energies.argmin()) * frame + frame
        piece = audio[start:end]
        if piece.numel() and float(piece.pow(2).mean()) > threshold:
            yield SpeechChunk(start, end)
        start = end


class BatchedInferencePipeline:
    def __init__(self, model: "Whisper", batch_size: int = 4, compute_type: str = "default"):
        self.model = model
        self.batch_size = batch_size
        self.pool = SlotPool(model.dims, batch_size, compute_type, device=model.device)
        # the decoder's window: what the encoder takes, in samples
        self.window_samples = 2 * model.dims.n_audio_ctx * HOP_LENGTH

    @property
    def fp16(self) -> bool:
        return self.pool.dtype == torch.float16

    def set_compute_type(self, compute_type: str) -> None:
        self.pool.retype(compute_type)

    def forward(self, mels: torch.Tensor, options: DecodingOptions) -> List[DecodingResult]:
        return decode(self.model, mels, options, ring_provider=self.pool)

    def transcribe(
        self,
        audio: torch.Tensor,
        language: Optional[str] = "en",
        task: str = "transcribe",
        beam_size: Optional[int] = None,
        without_timestamps: bool = True,
        vad_threshold: float = 1e-3,
    ) -> Dict[str, object]:
        options = DecodingOptions(
            task=task,
            language=language,
            beam_size=beam_size,
            without_timestamps=without_timestamps,
            fp16=self.fp16,
        )
        chunks = list(get_speech_chunks(audio, self.window_samples, vad_threshold))
        n_frames = 2 * self.model.dims.n_audio_ctx
        segments = []
        for first in range(0, len(chunks), self.batch_size):
            batch = chunks[first : first + self.batch_size]
            mels = torch.stack(
                [
                    log_mel_spectrogram(pad_or_trim(audio[c.start : c.end], self.window_samples), self.model.dims.n_mels)[:, :n_frames]
                    for c in batch
                ]
            ).to(self.model.device)
            for chunk, result in zip(batch, self.forward(mels, options)):
                segments.append(
                    {
                        "start": round(chunk.start / SAMPLE_RATE, 3),
                        "end": round(chunk.end / SAMPLE_RATE, 3),
                        "text": result.text,
                        "tokens": result.tokens,
                        "avg_logprob": result.avg_logprob,
                        "no_speech_prob": result.no_speech_prob,
                    }
                )
        return {"segments": segments, "text": "".join(s["text"] for s in segments), "language": language}


def _debug_pipeline(compute_type: str) -> BatchedInferencePipeline:
    from .model import DEBUG_DIMS, ModelDimensions, Whisper

    torch.manual_seed(0)
    model = Whisper(ModelDimensions(**DEBUG_DIMS)).eval()
    return BatchedInferencePipeline(model, batch_size=2, compute_type=compute_type)


def _debug_audio(pipeline: BatchedInferencePipeline) -> torch.Tensor:
    # three windows of noise with a silent window between the second and the third
    window = pipeline.window_samples
    audio = torch.randn(4 * window) * 0.3
    audio[2 * window : 3 * window] = 0.0
    return audio


def build_batched_pool_bf16() -> Dict[str, object]:
    """A bfloat16 pool after transcribing three speech windows in two batches."""
    pipeline = _debug_pipeline("bfloat16")
    result = pipeline.transcribe(_debug_audio(pipeline))
    return {"pool": pipeline.pool, "tokens": [torch.tensor(s["tokens"], dtype=torch.int64) for s in result["segments"]]}


def build_batched_pool_fp16() -> Dict[str, object]:
    """The same with compute_type="float16" (fp16 decoding)."""
    pipeline = _debug_pipeline("float16")
    result = pipeline.transcribe(_debug_audio(pipeline))
    return {"pool": pipeline.pool, "tokens": [torch.tensor(s["tokens"], dtype=torch.int64) for s in result["segments"]]}
