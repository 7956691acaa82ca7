"""Speech recognition interfaces (``speechbrain.inference.ASR``).

``EncoderDecoderASR`` transcribes padded batches on the encoder's ring-cache slots;
``StreamingASR`` transcribes chunk by chunk, the caller passing one ``ASRStreamingContext``
per batch of streams to every ``transcribe_chunk``.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch

from sb_kda.inference.interfaces import Pretrained, write_pretrained
from sb_kda.lobes.models.kda_asr import KDAStreamingContext
from sb_kda.nnet.kimi_delta import KDALayerStreamingContext, StreamingPrecision
from sb_kda.utils.data_utils import batch_pad_right

CTC_HPARAMS = """\
# Model: KDA encoder + CTC, characters
n_feats: 6
d_model: 16
num_layers: 2
ring_len: 4
num_slots: 3
vocab_size: 12
blank_index: 0
chunk_size: 3
cache_class: !name:sb_kda.nnet.kimi_delta.KDARingCache

encoder: !new:sb_kda.lobes.models.kda_asr.KDAEncoder
    input_size: !ref <n_feats>
    d_model: !ref <d_model>
    num_layers: !ref <num_layers>
    ring_len: !ref <ring_len>
    num_slots: !ref <num_slots>
    cache_class: !ref <cache_class>

ctc_lin: !new:torch.nn.Linear
    in_features: !ref <d_model>
    out_features: !ref <vocab_size>

modules:
    encoder: !ref <encoder>
    ctc_lin: !ref <ctc_lin>
"""

LABELS = "_abcdefghijk"


def ctc_collapse(ids: List[int], blank: int, prev: Optional[int] = None) -> List[int]:
    out = []
    for i in ids:
        if i != blank and i != prev:
            out.append(i)
        prev = i
    return out


@dataclass
class CompactPrecision(StreamingPrecision):
    """Context storage of the compact streaming mode (long-form audio on small devices)."""

    ring_dtype: torch.dtype = torch.float16
    forget_dtype: torch.dtype = torch.float16  # expect-bug: container


@dataclass
class ASRStreamingContext:
    """Streaming context of a ``StreamingASR``: the encoder context and the tokens so far."""

    encoder_context: KDAStreamingContext
    tokens: List[List[int]] = field(default_factory=list)
    last_ids: List[Optional[int]] = field(default_factory=list)


class EncoderDecoderASR(Pretrained):
    """A ready-to-use CTC ASR model for batches of utterances."""

    HPARAMS_NEEDED = ["blank_index"]
    MODULES_NEEDED = ["encoder", "ctc_lin"]

    @torch.no_grad()
    def transcribe_batch(self, feats: torch.Tensor, wav_lens: torch.Tensor):
        self.mods.encoder.reset_ring_caches()
        encoder_out = self.mods.encoder.decode_slots(feats.to(self.device), torch.arange(feats.shape[0], dtype=torch.int32))
        ids = self.mods.ctc_lin(encoder_out).argmax(-1)
        lengths = (wav_lens * feats.shape[1]).round().long()
        tokens = [ctc_collapse(row[:n].tolist(), self.hparams.blank_index) for row, n in zip(ids, lengths)]
        return ["".join(LABELS[i] for i in seq) for seq in tokens], tokens


class StreamingASR(Pretrained):
    """A ready-to-use streaming CTC ASR model."""

    HPARAMS_NEEDED = ["blank_index", "chunk_size"]
    MODULES_NEEDED = ["encoder", "ctc_lin"]

    def make_streaming_context(self, batch_size: int, precision: Optional[StreamingPrecision] = None) -> ASRStreamingContext:
        precision = precision or self.context_precision
        enc = self.mods.encoder.make_streaming_context(batch_size, precision)
        return ASRStreamingContext(enc, [[] for _ in range(batch_size)], [None] * batch_size)

    def make_compact_context(self, batch_size: int) -> ASRStreamingContext:
        return self.make_streaming_context(batch_size, CompactPrecision())

    def make_slot_pool(self, num_slots: int) -> KDAStreamingContext:
        """A context of ``num_slots`` slots that streams are assigned to as they arrive."""
        encoder = self.mods.encoder
        shapes = encoder.context_shapes(num_slots)
        layers = []
        for _ in encoder.layers:
            rings = {name: torch.zeros(shape, dtype=self.amp.dtype) for name, shape in shapes.items() if name.endswith("_ring")}  # expect-bug: pool-dtype
            memory = torch.zeros(shapes["memory"], dtype=torch.float32)
            layers.append(KDALayerStreamingContext(memory=memory, write_pos=torch.zeros(num_slots, dtype=torch.int32), **rings))
        return KDAStreamingContext(layers, torch.full((num_slots,), -1, dtype=torch.int32))

    @torch.no_grad()
    def transcribe_chunk(self, context: ASRStreamingContext, chunk: torch.Tensor) -> List[str]:
        encoded = self.mods.encoder.encode_streaming(chunk.to(self.device), context.encoder_context)
        ids = self.mods.ctc_lin(encoded).argmax(-1).tolist()
        words = []
        for row, seq in enumerate(ids):
            new = ctc_collapse(seq, self.hparams.blank_index, context.last_ids[row])
            context.last_ids[row] = seq[-1]
            context.tokens[row].extend(new)
            words.append("".join(LABELS[i] for i in new))
        return words

    def add_streams(self, context: ASRStreamingContext, num_new: int) -> None:
        """Appends ``num_new`` empty streams to a context."""
        weight = self.mods.encoder.input_proj.weight
        enc = context.encoder_context
        for layer in enc.layers:
            for name in ("memory", "delta_ring", "key_ring", "forget_ring"):
                ring = getattr(layer, name)
                setattr(layer, name, torch.cat([ring, weight.new_zeros((num_new, *ring.shape[1:]))]))
            layer.write_pos = torch.cat([layer.write_pos, layer.write_pos.new_zeros(num_new)])
        enc.slot_idx = torch.arange(enc.layers[0].memory.shape[0], dtype=torch.int32)
        context.tokens.extend([] for _ in range(num_new))
        context.last_ids.extend([None] * num_new)

    def drop_finished(self, context: ASRStreamingContext, keep: torch.Tensor) -> None:
        """Removes the streams whose ``keep`` entry is False."""
        index = keep.nonzero().squeeze(-1)
        enc = context.encoder_context
        for layer in enc.layers:
            layer.memory = layer.memory.index_select(0, index)
            layer.delta_ring = layer.delta_ring.index_select(0, index)
            layer.key_ring = layer.key_ring.index_select(0, index)
            layer.forget_ring = layer.forget_ring.index_select(0, index).to(layer.delta_ring)  # expect-bug: cast
            layer.write_pos = layer.write_pos.index_select(0, index)
        enc.slot_idx = torch.arange(index.numel(), dtype=torch.int32)
        context.tokens = [context.tokens[i] for i in index.tolist()]
        context.last_ids = [context.last_ids[i] for i in index.tolist()]

    def reset_rows(self, context: ASRStreamingContext, rows: List[int]) -> None:
        """Restarts the given streams in place (a new utterance on the same slot)."""
        for layer in context.encoder_context.layers:
            for tensor in (layer.memory, layer.delta_ring, layer.key_ring, layer.forget_ring, layer.write_pos):
                tensor[rows] = 0
        for row in rows:
            context.tokens[row], context.last_ids[row] = [], None

    def reset_context(self, context: ASRStreamingContext) -> None:
        """Restarts every stream of ``context`` on the model's device."""
        weight = self.mods.encoder.input_proj.weight
        enc = context.encoder_context
        for layer in enc.layers:
            layer.memory = weight.new_zeros(layer.memory.shape, dtype=torch.float32)
            layer.delta_ring = weight.new_zeros(layer.delta_ring.shape)
            layer.key_ring = weight.new_zeros(layer.key_ring.shape)
            layer.forget_ring = weight.new_zeros(layer.forget_ring.shape)  # expect-bug: like
            layer.write_pos = torch.zeros_like(layer.write_pos)
        enc.frames_seen = 0
        context.tokens = [[] for _ in context.tokens]
        context.last_ids = [None] * len(context.last_ids)

    def offload_idle(self, context: ASRStreamingContext) -> ASRStreamingContext:
        """A CPU copy of an idle context, stored at the model's precision."""
        parked = context.encoder_context.to("cpu", dtype=self.amp.dtype)  # expect-bug: cast id=park-context
        return ASRStreamingContext(parked, [list(t) for t in context.tokens], list(context.last_ids))

    def export_context(self, context: ASRStreamingContext, path) -> Path:
        """Saves an encoder context as ``.npz`` (numpy has no bfloat16: half precision is stored as float16)."""
        storage = torch.float32 if self.amp.dtype == torch.float32 else torch.float16
        enc = context.encoder_context
        arrays = {"slot_idx": enc.slot_idx.numpy(), "frames_seen": np.array(enc.frames_seen)}
        for i, layer in enumerate(enc.layers):
            for name, tensor in vars(layer).items():
                stored = tensor if name in ("memory", "write_pos") else tensor.to(storage)  # expect-bug: load id=npz-context
                arrays[f"{i}.{name}"] = stored.numpy()
        np.savez(path, num_layers=np.array(len(enc.layers)), **arrays)
        return Path(path)

    def import_context(self, path) -> ASRStreamingContext:
        with np.load(path) as data:
            names = ("memory", "delta_ring", "key_ring", "forget_ring", "write_pos")
            layers = [
                KDALayerStreamingContext(**{name: torch.from_numpy(data[f"{i}.{name}"].copy()) for name in names})  # expect-bug: load id=npz-context
                for i in range(int(data["num_layers"]))
            ]
            enc = KDAStreamingContext(layers, torch.from_numpy(data["slot_idx"].copy()), int(data["frames_seen"]))
        batch = enc.slot_idx.shape[0]
        return ASRStreamingContext(enc, [[] for _ in range(batch)], [None] * batch)


def _utterances(count: int = 3, seed: int = 11):
    gen = torch.Generator().manual_seed(seed)
    feats = [torch.randn(n, 6, generator=gen) for n in (7, 5, 6)[:count]]
    return batch_pad_right(feats)


def _streaming_source(tmp_dir: str) -> Path:
    text = CTC_HPARAMS.replace("num_slots: 3", "num_slots: null")
    return write_pretrained(Path(tmp_dir) / "kda-ctc-streaming", text)


def _run_chunks(asr: StreamingASR, context: ASRStreamingContext, feats: torch.Tensor) -> List[List[str]]:
    return [asr.transcribe_chunk(context, chunk) for chunk in feats.split(asr.hparams.chunk_size, dim=1)]


def build_asr_fp32(tmp_dir: str) -> Dict[str, object]:
    source = write_pretrained(Path(tmp_dir) / "kda-ctc", CTC_HPARAMS)
    asr = EncoderDecoderASR.from_hparams(source)
    feats, lens = _utterances()
    words, _ = asr.transcribe_batch(feats, lens)
    return {"asr": asr, "words": words}


def build_asr_bf16(tmp_dir: str) -> Dict[str, object]:
    source = write_pretrained(Path(tmp_dir) / "kda-ctc", CTC_HPARAMS)
    asr = EncoderDecoderASR.from_hparams(source, run_opts={"eval_precision": "bf16"})
    feats, lens = _utterances()
    words, _ = asr.transcribe_batch(feats, lens)
    return {"asr": asr, "words": words}


def build_asr_pinned_bf16(tmp_dir: str) -> Dict[str, object]:
    """The bf16 model with the ring caches that keep their log-forget buffers in float32."""
    source = write_pretrained(Path(tmp_dir) / "kda-ctc", CTC_HPARAMS)
    overrides = {"cache_class": "!name:sb_kda.nnet.kimi_delta.StreamingRingCache"}
    asr = EncoderDecoderASR.from_hparams(source, overrides=overrides, run_opts={"eval_precision": "bf16"})
    feats, lens = _utterances()
    words, _ = asr.transcribe_batch(feats, lens)
    return {"asr": asr, "words": words}


def build_asr_low_mem_bf16(tmp_dir: str) -> Dict[str, object]:
    source = write_pretrained(Path(tmp_dir) / "kda-ctc", CTC_HPARAMS)
    asr = EncoderDecoderASR.from_hparams(source, run_opts={"init_precision": "bf16"})
    feats, lens = _utterances(2)
    words, _ = asr.transcribe_batch(feats, lens)
    return {"asr": asr, "words": words}


def build_streaming_asr_fp32(tmp_dir: str) -> Dict[str, object]:
    """Every context operation on a float32 model; a bf16 model with an explicit precision."""
    asr = StreamingASR.from_hparams(_streaming_source(tmp_dir))
    feats, _ = _utterances()
    live = asr.make_streaming_context(3)
    _run_chunks(asr, live, feats)
    asr.add_streams(live, 1)
    asr.drop_finished(live, torch.tensor([True, False, True, True]))
    asr.reset_rows(live, [0])
    restarted = asr.make_streaming_context(2)
    _run_chunks(asr, restarted, feats[:2])
    asr.reset_context(restarted)
    parked = asr.offload_idle(live)
    restored = asr.import_context(asr.export_context(live, Path(tmp_dir) / "live.npz"))
    pool = asr.make_slot_pool(4)
    bf16 = StreamingASR.from_hparams(_streaming_source(tmp_dir), run_opts={"eval_precision": "bf16"})
    explicit = bf16.make_streaming_context(2, StreamingPrecision(torch.bfloat16, torch.float32))
    _run_chunks(bf16, explicit, feats[:2])
    bf16.add_streams(explicit, 1)
    return {"live": live, "restarted": restarted, "parked": parked, "restored": restored,
            "pool": pool, "bf16_explicit": explicit}


def build_streaming_asr_bf16(tmp_dir: str) -> Dict[str, object]:
    asr = StreamingASR.from_hparams(_streaming_source(tmp_dir), run_opts={"eval_precision": "bf16"})
    feats, _ = _utterances()
    ctx = asr.make_streaming_context(3)
    words = _run_chunks(asr, ctx, feats)
    return {"context": ctx, "words": words}


def build_streaming_asr_compact(tmp_dir: str) -> Dict[str, object]:
    asr = StreamingASR.from_hparams(_streaming_source(tmp_dir), run_opts={"eval_precision": "fp16"})
    feats, _ = _utterances()
    compact = asr.make_compact_context(3)
    _run_chunks(asr, compact, feats)
    pool = asr.make_slot_pool(4)
    return {"compact": compact, "pool": pool}


def build_streaming_asr_fp16_ops(tmp_dir: str) -> Dict[str, object]:
    """An fp16 model: dropping, restarting, exporting and parking contexts."""
    asr = StreamingASR.from_hparams(_streaming_source(tmp_dir), run_opts={"eval_precision": "fp16"})
    feats, _ = _utterances()
    contexts = {}
    for name in ("dropped", "restarted", "exported", "parked_from"):
        contexts[name] = asr.make_streaming_context(3)
        _run_chunks(asr, contexts[name], feats)
    asr.drop_finished(contexts["dropped"], torch.tensor([True, False, True]))
    asr.reset_context(contexts["restarted"])
    contexts["imported"] = asr.import_context(asr.export_context(contexts["exported"], Path(tmp_dir) / "ctx.npz"))
    contexts["parked"] = asr.offload_idle(contexts["parked_from"])
    return contexts
