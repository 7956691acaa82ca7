#!/usr/bin/env python3
"""Recipe for training a streaming KDA-CTC ASR system on a toy character corpus.

Validation encodes chunk by chunk; its context is kept in a ``StreamingSession`` saved with
every checkpoint. Test decodes in streaming mode or on the ring-cache slots (``test_decoding``).

To run this recipe, do the following:
> python train_streaming.py hparams/kda_ctc.yaml --eval_precision=bf16
"""

import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F

import sb_kda as sb
from sb_kda import core
from sb_kda.lobes.models.kda_asr import KDAStreamingContext
from sb_kda.nnet.kimi_delta import KDALayerStreamingContext
from sb_kda.utils import checkpoints
from sb_kda.utils.data_utils import PaddedBatch
from sb_kda.utils.hparams import load_hyperpyyaml

HPARAMS = """\
seed: 1986
output_folder: results/kda_ctc
n_feats: 6
d_model: 16
vocab_size: 12
batch_size: 2
chunk_size: 3
num_slots: 2
number_of_epochs: 1
test_decoding: stream
session_precision: fp32

encoder: !new:sb_kda.lobes.models.kda_asr.KDAEncoder
    input_size: !ref <n_feats>
    d_model: !ref <d_model>
    num_slots: !ref <num_slots>

ctc_lin: !new:torch.nn.Linear
    in_features: !ref <d_model>
    out_features: !ref <vocab_size>

modules:
    encoder: !ref <encoder>
    ctc_lin: !ref <ctc_lin>

opt_class: !name:torch.optim.Adam
    lr: 0.001
"""


@checkpoints.register_checkpoint_hooks
class StreamingSession:
    """The validation streaming context; ``storage_precision`` is the dtype its rings are saved in."""

    def __init__(self, storage_precision: str = "fp32"):
        self.context: Optional[KDAStreamingContext] = None
        self.storage_precision = storage_precision

    @checkpoints.mark_as_saver
    def _save(self, path):
        dtype = core.AMPConfig.from_name(self.storage_precision).dtype
        layers = [
            {name: t.to(dtype) if name != "memory" and t.is_floating_point() else t for name, t in vars(layer).items()}  # expect-bug: load id=session-rings
            for layer in self.context.layers
        ]
        torch.save({"layers": layers, "slot_idx": self.context.slot_idx, "frames_seen": self.context.frames_seen}, path)

    @checkpoints.mark_as_loader
    def _recover(self, path, end_of_epoch=False):
        saved = torch.load(path, map_location="cpu", weights_only=True)
        layers = [KDALayerStreamingContext(**entry) for entry in saved["layers"]]  # expect-bug: load id=session-rings
        self.context = KDAStreamingContext(layers, saved["slot_idx"], saved["frames_seen"])


class ASR(sb.Brain):
    def __init__(self, *args, session: Optional[StreamingSession] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.session = session or StreamingSession()
        self.stream_ctx: Optional[KDAStreamingContext] = None

    def compute_forward(self, batch, stage):
        """Forward computations from the features to the CTC log-probabilities."""
        feats, feat_lens = batch.feats
        encoder = self.modules.encoder
        if stage == sb.Stage.TRAIN:
            enc_out = encoder(feats)
        elif stage == sb.Stage.TEST and self.hparams.test_decoding == "slots":
            enc_out = encoder.decode_slots(feats, torch.arange(feats.shape[0], dtype=torch.int32))
        else:
            chunks = feats.split(self.hparams.chunk_size, dim=1)
            enc_out = torch.cat([encoder.encode_streaming(chunk, self.stream_ctx) for chunk in chunks], dim=1)
        logits = self.modules.ctc_lin(enc_out)
        return F.log_softmax(logits.float(), dim=-1), feat_lens

    def compute_objectives(self, predictions, batch, stage):
        p_ctc, wav_lens = predictions
        tokens, token_lens = batch.tokens
        input_lens = (wav_lens * p_ctc.shape[1]).round().long()
        target_lens = (token_lens * tokens.shape[1]).round().long()
        return F.ctc_loss(p_ctc.transpose(0, 1), tokens, input_lens, target_lens, blank=0, zero_infinity=True)

    def on_stage_start(self, stage, epoch=None):
        """Gets called at the beginning of each epoch."""
        encoder = self.modules.encoder
        if stage == sb.Stage.VALID:
            with core.default_dtype(self.eval_dtype):  # expect-bug: default-dtype id=valid-context
                self.stream_ctx = encoder.make_streaming_context(self.hparams.batch_size)
        elif stage == sb.Stage.TEST:
            precision = core.CACHE_PRECISION[self.eval_precision]  # expect-bug: imported-policy id=cache-table
            self.stream_ctx = encoder.make_streaming_context(self.hparams.batch_size, precision)
            encoder.reset_ring_caches()

    def on_stage_end(self, stage, stage_loss, epoch=None):
        """Gets called at the end of an epoch."""
        self.last_loss = stage_loss
        if stage == sb.Stage.VALID:
            self.session.context = self.stream_ctx
            if self.checkpointer is not None:
                self.checkpointer.save_checkpoint(meta={"loss": stage_loss, "epoch": epoch})


def dataio_prepare(hparams: Dict[str, Any], num_batches: int = 1, seed: int = 5) -> List[PaddedBatch]:
    """Toy data: random features and character targets, collated into padded batches."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(num_batches):
        examples = []
        for frames in (6, 5)[: hparams["batch_size"]]:
            examples.append({
                "id": f"utt{len(examples)}",
                "feats": torch.randn(frames, hparams["n_feats"], generator=gen),
                "tokens": torch.randint(1, hparams["vocab_size"], (3,), generator=gen),
            })
        batches.append(PaddedBatch(examples))
    return batches


def make_brain(hparams_text: str, run_opts: Dict[str, Any], output_folder, overrides=None) -> ASR:
    hparams = load_hyperpyyaml(hparams_text, overrides)
    session = StreamingSession(hparams["session_precision"])
    checkpointer = checkpoints.Checkpointer(
        Path(output_folder) / "save", recoverables={"model": torch.nn.ModuleDict(hparams["modules"]), "session": session}
    )
    return ASR(modules=hparams["modules"], opt_class=hparams["opt_class"], hparams=hparams,
               run_opts=run_opts, checkpointer=checkpointer, session=session)


def _run(tmp_dir: str, run_opts: Dict[str, Any], overrides=None) -> Dict[str, Any]:
    """One validation epoch and a test pass; what each stage left behind."""
    torch.manual_seed(0)
    asr = make_brain(HPARAMS, run_opts, tmp_dir, overrides)
    hparams = vars(asr.hparams)
    asr.fit(range(1, hparams["number_of_epochs"] + 1), train_set=[], valid_set=dataio_prepare(hparams))
    valid_ctx = asr.session.context
    asr.evaluate(dataio_prepare(hparams, seed=6), min_key="loss")
    return {"modules": asr.modules, "valid_ctx": valid_ctx, "test_ctx": asr.stream_ctx,
            "recovered_session": asr.session.context}


def build_recipe_fp32(tmp_dir: str) -> Dict[str, object]:
    stages = _run(tmp_dir, {"eval_precision": "fp32"})
    resumed = make_brain(HPARAMS, {}, tmp_dir)
    resumed.checkpointer.recover_if_possible(min_key="loss")
    return {**stages, "resumed_session": resumed.session.context}


def build_recipe_bf16(tmp_dir: str) -> Dict[str, object]:
    return _run(tmp_dir, {"eval_precision": "bf16"})


def build_recipe_fp16_slots(tmp_dir: str) -> Dict[str, object]:
    stages = _run(tmp_dir, {"eval_precision": "fp16", "cast_eval_modules": True}, overrides={"test_decoding": "slots"})
    return {"modules": stages["modules"], "test_ctx": stages["test_ctx"]}


def build_recipe_session_bf16(tmp_dir: str) -> Dict[str, object]:
    """Sessions stored in bf16: recovered before the test pass, and by a resumed experiment."""
    stages = _run(tmp_dir, {"eval_precision": "fp32"}, overrides={"session_precision": "bf16"})
    resumed = make_brain(HPARAMS, {}, tmp_dir, overrides={"session_precision": "bf16"})
    resumed.checkpointer.recover_if_possible(min_key="loss")
    return {**stages, "resumed_session": resumed.session.context}


def main(argv: Optional[List[str]] = None) -> float:
    hparams_file, run_opts, overrides = core.parse_arguments(argv)
    with open(hparams_file, encoding="utf-8") as fin:
        hparams_text = fin.read()
    hparams = load_hyperpyyaml(hparams_text, overrides)
    torch.manual_seed(hparams["seed"])
    asr = make_brain(hparams_text, run_opts, hparams["output_folder"], overrides)
    asr.fit(range(1, hparams["number_of_epochs"] + 1), dataio_prepare(hparams, 4), dataio_prepare(hparams, 1, seed=6))
    return asr.evaluate(dataio_prepare(hparams, 1, seed=7), min_key="loss")


if __name__ == "__main__":
    main(sys.argv[1:])
