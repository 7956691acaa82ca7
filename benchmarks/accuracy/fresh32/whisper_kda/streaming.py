"""Simultaneous (streaming) transcription with local agreement, after whisper_streaming.

Audio arrives in chunks; every `process_iter` decodes the last window of the buffer and commits
the words that two consecutive hypotheses agree on. A KDA decoder does not need the committed
text as a prompt: the processor carries the decoder rings from one iteration to the next and
decodes on top of them, which keeps each iteration to the new tokens.
"""

import io
import logging
import pickle
from typing import TYPE_CHECKING, List, Optional, Tuple

import torch

from . import utils
from .audio import HOP_LENGTH, SAMPLE_RATE, log_mel_spectrogram, pad_or_trim
from .decoding import DecodingOptions, decode
from .ring_cache import RingArgs

if TYPE_CHECKING:
    from .model import ModelDimensions, Whisper

logger = logging.getLogger(__name__)

RING_FIELDS = ("d_cache", "k_cache", "g_cache")


def blank_rings(dims: "ModelDimensions", n_rows: int, dtype: torch.dtype) -> List[RingArgs]:
    """Zeroed rings for ``n_rows`` streams: activation rings in ``dtype``, state and gates float32."""
    shapes = dims.ring_shapes(n_rows)
    rings = []
    for _ in range(dims.n_text_layer):
        rings.append(
            RingArgs(
                initial_state=torch.zeros(shapes["state"], dtype=torch.float32),
                d_cache=torch.zeros(shapes["delta"], dtype=dtype),
                k_cache=torch.zeros(shapes["key"], dtype=dtype),
                g_cache=torch.zeros(shapes["forget"]),  # expect-bug: default-dtype id=stream-default
                write_pos=torch.zeros(n_rows, dtype=torch.int32),
                ssm_state_indices=torch.arange(n_rows, dtype=torch.int32),
            )
        )
    return rings


class CarriedRings:
    """A stream's rings, lent to one decode call at a time (`decoding.RingProvider`)."""

    def __init__(self, rings: List[RingArgs]):
        self.rings = rings

    def acquire(self, n_rows: int) -> List[RingArgs]:
        if n_rows != self.rings[0].n_rows:
            raise ValueError(f"the stream has {self.rings[0].n_rows} rows, the decode call {n_rows}")
        return self.rings

    def release(self) -> None:
        pass


class HypothesisBuffer:
    """Words of the last two hypotheses; the agreed prefix is committed (LocalAgreement-2)."""

    def __init__(self):
        self.commited_in_buffer: List[str] = []
        self.buffer: List[str] = []
        self.new: List[str] = []

    def insert(self, words: List[str]):
        # skip the words that the committed text already ends with
        n = len(self.commited_in_buffer)
        for k in range(min(n, len(words), 5), 0, -1):
            if self.commited_in_buffer[-k:] == words[:k]:
                words = words[k:]
                break
        self.new = words

    def flush(self) -> List[str]:
        commit = []
        while self.new and self.buffer and self.new[0] == self.buffer[0]:
            commit.append(self.new.pop(0))
            self.buffer.pop(0)
        self.buffer = self.new
        self.new = []
        self.commited_in_buffer.extend(commit)
        return commit

    def complete(self) -> List[str]:
        return self.buffer


class OnlineASRProcessor:
    SAMPLING_RATE = SAMPLE_RATE

    def __init__(self, model: "Whisper", language: str = "en", buffer_trimming_sec: float = 15, fp16: bool = False):
        self.model = model
        self.language = language
        self.buffer_trimming_sec = buffer_trimming_sec
        self.dtype = torch.float16 if fp16 else torch.float32
        self.options = DecodingOptions(language=language, without_timestamps=True, fp16=fp16, return_rings=True)
        self.window_samples = 2 * model.dims.n_audio_ctx * HOP_LENGTH
        self.init()

    def init(self, offset: Optional[float] = None):
        """run this when starting or restarting processing"""
        self.audio_buffer = torch.zeros(0, dtype=torch.float32)
        self.transcript_buffer = HypothesisBuffer()
        self.buffer_time_offset = offset if offset is not None else 0.0
        self.commited: List[str] = []
        self.rings = blank_rings(self.model.dims, 1, self.dtype)
        self.last_tokens: List[int] = []

    def insert_audio_chunk(self, audio: torch.Tensor):
        self.audio_buffer = torch.cat([self.audio_buffer, audio.to(torch.float32)])

    def process_iter(self) -> Tuple[Optional[float], Optional[float], str]:
        """Runs on the current audio buffer.
        Returns: a tuple (beg_timestamp, end_timestamp, "text"), or (None, None, "").
        The non-emty text is confirmed (committed) partial transcript.
        """
        window = pad_or_trim(self.audio_buffer[-self.window_samples :], self.window_samples)
        mel = log_mel_spectrogram(window, self.model.dims.n_mels)[:, : 2 * self.model.dims.n_audio_ctx]
        result = decode(self.model, mel, self.options, ring_provider=CarriedRings(self.rings))
        self.rings = result.rings
        self.last_tokens = result.tokens

        self.transcript_buffer.insert(result.text.split())
        committed = self.transcript_buffer.flush()
        self.commited.extend(committed)

        if len(self.audio_buffer) / self.SAMPLING_RATE > self.buffer_trimming_sec:
            self.chunk_at(len(self.audio_buffer) / self.SAMPLING_RATE)

        end = self.buffer_time_offset + len(self.audio_buffer) / self.SAMPLING_RATE
        return (self.buffer_time_offset, end, " ".join(committed)) if committed else (None, None, "")

    def chunk_at(self, time: float):
        """trims the hypothesis and audio buffer at "time"; the decoder restarts from a blank state"""
        cut = int(time * self.SAMPLING_RATE)
        self.audio_buffer = self.audio_buffer[cut:]
        self.buffer_time_offset += time
        self.rings = [
            r._replace(
                initial_state=torch.zeros_like(r.initial_state),
                d_cache=torch.zeros_like(r.d_cache),
                k_cache=torch.zeros_like(r.k_cache),
                g_cache=torch.zeros_like(r.d_cache),  # expect-bug: like
                write_pos=torch.zeros_like(r.write_pos),
            )
            for r in self.rings
        ]

    def finish(self) -> Tuple[Optional[float], Optional[float], str]:
        """Flush the incomplete text when the whole processing ends."""
        words = self.transcript_buffer.complete()
        end = self.buffer_time_offset + len(self.audio_buffer) / self.SAMPLING_RATE
        self.buffer_time_offset = end
        return (self.buffer_time_offset, end, " ".join(words)) if words else (None, None, "")

    # --- moving a stream to another worker ------------------------------------------------

    def snapshot(self) -> bytes:
        """The stream as bytes; the rings are stored in the model dtype (half the size in fp16)."""
        rings = [{name: t.to(self.dtype) if name in RING_FIELDS else t for name, t in r._asdict().items()} for r in self.rings]  # expect-bug: load id=stream-snapshot
        payload = {
            "audio": self.audio_buffer,
            "offset": self.buffer_time_offset,
            "commited": self.commited,
            "buffer": self.transcript_buffer.buffer,
            "rings": rings,
        }
        return pickle.dumps(payload)

    def restore(self, blob: bytes) -> None:
        payload = pickle.loads(blob)
        self.init(payload["offset"])
        self.audio_buffer = payload["audio"]
        self.commited = list(payload["commited"])
        self.transcript_buffer.buffer = list(payload["buffer"])
        self.rings = [RingArgs(**layer) for layer in payload["rings"]]  # expect-bug: load id=stream-snapshot

    def resume(self, blob: bytes) -> None:
        """Like `restore`, into the rings this processor already has (their dtypes are kept)."""
        payload = pickle.load(io.BytesIO(blob))
        for rings, saved in zip(self.rings, payload["rings"]):
            for name, tensor in saved.items():
                getattr(rings, name).copy_(tensor)
        self.audio_buffer = payload["audio"].clone()
        self.buffer_time_offset = payload["offset"]
        self.commited = list(payload["commited"])
        self.transcript_buffer.buffer = list(payload["buffer"])


def warmup(processor: OnlineASRProcessor, seconds: float = 1.0) -> None:
    """Runs one window of silence through the processor so that the first real chunk is not the
    slow one (allocator and thread-pool warm-up), then resets the processor."""
    with torch.no_grad(), utils.default_dtype(processor.dtype):  # expect-bug: default-dtype id=stream-default
        processor.insert_audio_chunk(torch.zeros(int(seconds * SAMPLE_RATE), dtype=torch.float32))
        processor.process_iter()
        processor.init()


def _debug_processor(fp16: bool) -> Tuple[OnlineASRProcessor, torch.Tensor]:
    from .model import DEBUG_DIMS, ModelDimensions, Whisper

    torch.manual_seed(0)
    model = Whisper(ModelDimensions(**DEBUG_DIMS)).eval()
    processor = OnlineASRProcessor(model, fp16=fp16)
    audio = torch.randn(3 * processor.window_samples) * 0.3
    return processor, audio


def _feed(processor: OnlineASRProcessor, audio: torch.Tensor, n_chunks: int) -> None:
    for chunk in audio.chunk(n_chunks):
        processor.insert_audio_chunk(chunk)
        processor.process_iter()


def build_stream_iterations_fp16() -> List[RingArgs]:
    """Three iterations of an fp16 stream."""
    processor, audio = _debug_processor(fp16=True)
    _feed(processor, audio, 3)
    return processor.rings


def build_stream_restored_fp16() -> List[RingArgs]:
    """An fp16 stream snapshotted after two iterations, restored into a new processor, fed once more."""
    processor, audio = _debug_processor(fp16=True)
    _feed(processor, audio[: 2 * processor.window_samples], 2)
    blob = processor.snapshot()
    other, _ = _debug_processor(fp16=True)
    other.restore(blob)
    _feed(other, audio[2 * processor.window_samples :], 1)
    return other.rings


def build_stream_resumed_fp16() -> List[RingArgs]:
    """The same snapshot resumed into the rings of a running processor."""
    processor, audio = _debug_processor(fp16=True)
    _feed(processor, audio[: 2 * processor.window_samples], 2)
    blob = processor.snapshot()
    other, _ = _debug_processor(fp16=True)
    other.resume(blob)
    _feed(other, audio[2 * processor.window_samples :], 1)
    return other.rings
