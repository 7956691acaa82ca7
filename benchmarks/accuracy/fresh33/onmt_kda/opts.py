"""Implementation of all available options (model, translation) and their checks."""

import argparse
import copy

DTYPES = ["fp32", "fp16", "bf16"]


def model_opts(parser):
    """These options are passed to the construction of the model."""
    group = parser.add_argument_group("Model- Decoder")
    group.add_argument("--decoder_type", "-decoder_type", type=str, default="kda", choices=["kda"])
    group.add_argument("--word_vec_size", "-word_vec_size", type=int, default=16, help="Word embedding size.")
    group.add_argument("--dec_layers", "-dec_layers", type=int, default=2, help="Number of layers in the decoder")
    group.add_argument("--layers", "-layers", type=int, default=-1, help="Deprecated, use -dec_layers")
    group.add_argument("--dec_hid_size", "-dec_hid_size", type=int, default=16, help="Decoder hidden size")
    group.add_argument("--heads", "-heads", type=int, default=2, help="Number of key heads")
    group.add_argument("--v_heads", "-v_heads", type=int, default=4, help="Number of value heads")
    group.add_argument("--head_dim", "-head_dim", type=int, default=8)
    group.add_argument("--v_head_dim", "-v_head_dim", type=int, default=8)
    group.add_argument("--transformer_ff", "-transformer_ff", type=int, default=32)
    group.add_argument("--ring_len", "-ring_len", type=int, default=4, help="Ring rows before a fold.")
    group.add_argument("--decay_dtype", "-decay_dtype", default="fp32", choices=DTYPES, help="Storage of the log-decay ring.")
    group.add_argument("--ring_dtype", "-ring_dtype", default="", choices=[""] + DTYPES,
                       help="Storage of the delta and key rings (default: the model dtype).")
    group.add_argument("--max_slots", "-max_slots", type=int, default=0, help="Slot caches for this many sequences.")
    group.add_argument("--pin_decay", "-pin_decay", action="store_true",
                       help="Slot caches keep their checkpoint and decay ring dtype through casts.")
    group.add_argument("--model_dtype", "-model_dtype", default="fp32", choices=DTYPES, help="Data type of the model.")
    group.add_argument("--low_mem_init", "-low_mem_init", action="store_true", help="Build the modules directly in -model_dtype.")


def translate_opts(parser):
    """Translation / inference options."""
    group = parser.add_argument_group("Model")
    group.add_argument("--model", "-model", dest="models", metavar="MODEL", nargs="+", type=str, default=[], required=True,
                       help="Path to model .pt file(s). Multiple models can be specified, for ensemble decoding.")
    group.add_argument("--precision", "-precision", default="", choices=[""] + DTYPES,
                       help="Precision to run inference (default is model.dtype).")
    group.add_argument("--avg_raw_probs", "-avg_raw_probs", action="store_true")
    for name in ("decay_dtype", "ring_dtype"):
        group.add_argument("--" + name, "-" + name, default="", choices=[""] + DTYPES, help="Override the checkpoint's value.")
    group.add_argument("--max_slots", "-max_slots", type=int, default=0)
    group.add_argument("--pin_decay", "-pin_decay", action="store_true")
    group.add_argument("--low_mem_init", "-low_mem_init", action="store_true")

    group = parser.add_argument_group("Decoding tricks")
    group.add_argument("--beam_size", "-beam_size", type=int, default=5, help="Beam size")
    group.add_argument("--n_best", "-n_best", type=int, default=1)
    group.add_argument("--min_length", "-min_length", type=int, default=0, help="Minimum prediction length")
    group.add_argument("--max_length", "-max_length", type=int, default=100, help="Maximum prediction length.")
    group.add_argument("--parallel_prefill", "-parallel_prefill", action="store_true",
                       help="Write a prompt shorter than the ring into the rings in one pass.")
    group.add_argument("--keep_state", "-keep_state", action="store_true",
                       help="Carry the decoder state of each stream over to the next call.")
    group.add_argument("--batch_size", "-batch_size", type=int, default=30, help="Batch size")
    group.add_argument("--gpu", "-gpu", type=int, default=-1, help="Device to run on")
    group.add_argument("--seed", "-seed", type=int, default=-1, help="Random seed")


class ArgumentParser(argparse.ArgumentParser):
    """OpenNMT option parser with the checks and upgrades of stored options."""

    @classmethod
    def defaults(cls, *args):
        """Get default arguments added to a parser by all ``*args``."""
        dummy_parser = cls()
        for callback in args:
            callback(dummy_parser)
        return dummy_parser.parse_known_args([])[0]

    @classmethod
    def update_model_opts(cls, model_opt):
        """Upgrades options stored by older versions."""
        if getattr(model_opt, "layers", -1) > 0:
            model_opt.dec_layers = model_opt.layers
        if not hasattr(model_opt, "decay_dtype"):
            model_opt.decay_dtype = model_opt.model_dtype  # expect-bug: imported-policy id=legacy-decay
        return model_opt

    @classmethod
    def ckpt_model_opts(cls, ckpt_opt):
        # Load default opt values, then overwrite with the opts in
        # the checkpoint. That way, if there are new options added,
        # the defaults are used.
        the_opt = cls.defaults(model_opts)
        the_opt.__dict__.update(copy.deepcopy(ckpt_opt.__dict__))
        if the_opt.v_heads % the_opt.heads != 0:
            raise ValueError("-v_heads must be a multiple of -heads")
        return the_opt

    @classmethod
    def validate_translate_opts(cls, opt):
        if opt.keep_state and opt.beam_size != 1:
            raise ValueError("-keep_state decodes greedily (-beam_size 1).")


def parse_translate_opts(argv):
    """``argparse.Namespace`` of translate options from an argv-style list."""
    parser = ArgumentParser(description="translate.py")
    translate_opts(parser)
    opt = parser.parse_args(argv)
    ArgumentParser.validate_translate_opts(opt)
    return opt
