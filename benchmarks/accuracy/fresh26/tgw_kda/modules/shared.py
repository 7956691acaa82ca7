"""Global state shared by every module of the web UI.

The UI, the API and the extensions all work on the same objects: the parsed command line
(``args``), the user settings (``settings``), and the loaded ``model`` and ``tokenizer``. They live
here so that a model loaded from the Model tab is the one the API generates with, and so that an
extension that changes a setting changes it for everybody.
"""

import argparse
import copy
import logging
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional

logger = logging.getLogger("text-generation-webui")

# Model variables
model: Any = None
tokenizer: Any = None
model_name: str = "None"
is_seq2seq: bool = False
model_dirty_from_training: bool = False

# Generation variables
stop_everything: bool = False
generation_lock: Optional[Any] = None
processing_message: str = "*Is typing...*"

# Decode states of the open chats (text_generation.ChatDecodeState), by the chat's unique id.
# Keeping them between turns means a new message only feeds the tokens it adds.
chat_states: Dict[str, Any] = {}

# UI defaults
settings: Dict[str, Any] = {
    "show_controls": True,
    "start_with": "",
    "mode": "chat",
    "chat_style": "cai-chat",
    "character": "Assistant",
    "name1": "You",
    "preset": "min_p",
    "max_new_tokens": 16,
    "max_new_tokens_min": 1,
    "max_new_tokens_max": 4096,
    "seed": -1,
    "truncation_length": 2048,
    "custom_stopping_strings": "",
    "auto_max_new_tokens": False,
    "ban_eos_token": False,
    "add_bos_token": True,
    "skip_special_tokens": True,
    "stream": True,
    # ReplaySSM chat states
    "keep_chat_state": True,
    "session_format": "pt",
    "half_precision_sessions": False,
    "alpha_ring_dtype": "float32",
    "precision": "auto",
    "default_extensions": [],
}

default_settings = copy.deepcopy(settings)


def str2bool(value: str) -> bool:
    """``argparse`` type for flags that are written ``--flag true``/``--flag false`` in scripts."""
    if isinstance(value, bool):
        return value
    if value.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if value.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError("Boolean value expected.")


parser = argparse.ArgumentParser(
    description="Text generation web UI (KDA backend)",
    conflict_handler="resolve",
    add_help=True,
    formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=55, indent_increment=2, width=200),
)

# Basic settings
group = parser.add_argument_group("Basic settings")
group.add_argument("--multi-user", action="store_true", help="Multi-user mode. Chat histories are not saved or automatically loaded.")
group.add_argument("--character", type=str, help="The name of the character to load in chat mode by default.")
group.add_argument("--model", type=str, help="Name of the model to load by default.")
group.add_argument("--model-dir", type=str, default="models/", help="Path to directory with all the models.")
group.add_argument("--settings", type=str, help="Load the default interface settings from this file.")
group.add_argument("--extensions", type=str, nargs="+", help="The list of extensions to load.")
group.add_argument("--verbose", action="store_true", help="Print the prompts to the terminal.")

# Model loader
group = parser.add_argument_group("Model loader")
group.add_argument("--loader", type=str, help="Choose the model loader manually, otherwise it gets autodetected. Valid options: Transformers, ExLlamaKDA, ExLlamaKDA_HF, KDA_HF.")

# Transformers/Accelerate
group = parser.add_argument_group("Transformers/Accelerate")
group.add_argument("--cpu", action="store_true", help="Use the CPU to generate text (loads the model in float32).")
group.add_argument("--bf16", action="store_true", help="Load the model with bfloat16 precision.")
group.add_argument("--load-in-8bit", action="store_true", help="Load the model with 8-bit precision.")
group.add_argument("--compute_dtype", type=str, default="float16", help="compute dtype for 8-bit loading. Valid options: bfloat16, float16, float32.")
group.add_argument("--trust-remote-code", action="store_true", help="Set trust_remote_code=True while loading the model.")

# ReplaySSM ring caches
group = parser.add_argument_group("ReplaySSM cache")
group.add_argument("--max_slots", type=int, default=0, help="Concurrent sequences kept in the in-model ring caches (0: requests bring their own cache).")
group.add_argument("--ring_len", type=int, default=0, help="Ring length override; 0 uses the value from the model config.")
group.add_argument("--cache_8bit", action="store_true", help="Use an 8-bit cache for the delta and key rings (ExLlamaKDA).")
group.add_argument("--sessions-dir", type=str, default="logs/sessions", help="Where saved chat states go.")

args = parser.parse_args([])
args_defaults = parser.parse_args([])
provided_arguments: List[str] = []


def do_cmd_flags_warnings() -> None:
    """Warnings about combinations of flags that do not do what people expect."""
    if args.cpu and (args.bf16 or args.load_in_8bit):
        logger.warning("--cpu loads the model in float32; --bf16 and --load-in-8bit are ignored.")
    if args.cache_8bit and args.loader not in (None, "ExLlamaKDA"):
        logger.warning("--cache_8bit only applies to the ExLlamaKDA loader.")


def fix_loader_name(name: Optional[str]) -> Optional[str]:
    """Accepts the loader names people type (``transformers``, ``exllama-kda``, ...)."""
    if not name:
        return name
    key = name.lower().replace("-", "").replace("_", "")
    names = {
        "transformers": "Transformers",
        "exllamakda": "ExLlamaKDA",
        "exllamakdahf": "ExLlamaKDA_HF",
        "kdahf": "KDA_HF",
    }
    return names.get(key, name)


@contextmanager
def scoped_state(**arg_overrides: Any) -> Iterator[argparse.Namespace]:
    """Runs a block on a private copy of the global state.

    ``args`` gets ``arg_overrides`` on top of its current values. Whatever the block changes in
    ``args``, ``settings``, the model globals or the open chat states is put back afterwards;
    the API uses this for one-off loads with per-request flags.
    """
    global args, settings, model, tokenizer, model_name, chat_states
    saved = (args, settings, model, tokenizer, model_name, chat_states)
    args = copy.copy(saved[0])
    settings = copy.deepcopy(saved[1])
    chat_states = {}
    for key, value in arg_overrides.items():
        if not hasattr(args, key):
            raise AttributeError(f"unknown command-line argument {key!r}")
        setattr(args, key, value)
    try:
        yield args
    finally:
        args, settings, model, tokenizer, model_name, chat_states = saved
