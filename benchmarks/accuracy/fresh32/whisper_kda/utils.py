import json
import os
import re
import sys
import zlib
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Optional, TextIO

import torch

system_encoding = sys.getdefaultencoding()

if system_encoding != "utf-8":

    def make_safe(string):
        # replaces any character not representable using the system default encoding with an '?',
        # avoiding UnicodeEncodeError (https://github.com/openai/whisper/discussions/729).
        return string.encode(system_encoding, errors="replace").decode(system_encoding)

else:

    def make_safe(string):
        # utf-8 can encode any Unicode code point, so no need to do the round-trip encoding
        return string


def exact_div(x, y):
    assert x % y == 0
    return x // y


def str2bool(string):
    str2val = {"True": True, "False": False}
    if string in str2val:
        return str2val[string]
    else:
        raise ValueError(f"Expected one of {set(str2val.keys())}, got {string}")


def optional_int(string):
    return None if string == "None" else int(string)


def optional_float(string):
    return None if string == "None" else float(string)


def compression_ratio(text) -> float:
    text_bytes = text.encode("utf-8")
    return len(text_bytes) / len(zlib.compress(text_bytes))


def format_timestamp(seconds: float, always_include_hours: bool = False, decimal_marker: str = "."):
    assert seconds >= 0, "non-negative timestamp expected"
    milliseconds = round(seconds * 1000.0)

    hours = milliseconds // 3_600_000
    milliseconds -= hours * 3_600_000

    minutes = milliseconds // 60_000
    milliseconds -= minutes * 60_000

    seconds = milliseconds // 1_000
    milliseconds -= seconds * 1_000

    hours_marker = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
    return f"{hours_marker}{minutes:02d}:{seconds:02d}{decimal_marker}{milliseconds:03d}"


def get_start(segments: List[dict]) -> Optional[float]:
    return next(
        (w["start"] for s in segments for w in s["words"]),
        segments[0]["start"] if segments else None,
    )


def get_end(segments: List[dict]) -> Optional[float]:
    return next(
        (w["end"] for s in reversed(segments) for w in reversed(s["words"])),
        segments[-1]["end"] if segments else None,
    )


class ResultWriter:
    extension: str

    def __init__(self, output_dir: str):
        self.output_dir = output_dir

    def __call__(self, result: dict, audio_path: str, options: Optional[dict] = None, **kwargs):
        audio_basename = os.path.basename(audio_path)
        audio_basename = os.path.splitext(audio_basename)[0]
        output_path = os.path.join(self.output_dir, audio_basename + "." + self.extension)

        with open(output_path, "w", encoding="utf-8") as f:
            self.write_result(result, file=f, options=options, **kwargs)

    def write_result(self, result: dict, file: TextIO, options: Optional[dict] = None, **kwargs):
        raise NotImplementedError


class WriteTXT(ResultWriter):
    extension: str = "txt"

    def write_result(self, result: dict, file: TextIO, options: Optional[dict] = None, **kwargs):
        for segment in result["segments"]:
            print(segment["text"].strip(), file=file, flush=True)


class WriteJSON(ResultWriter):
    extension: str = "json"

    def write_result(self, result: dict, file: TextIO, options: Optional[dict] = None, **kwargs):
        json.dump(result, file)


def get_writer(output_format: str, output_dir: str) -> Callable[[dict, TextIO, dict], None]:
    writers = {"txt": WriteTXT, "json": WriteJSON}

    if output_format == "all":
        all_writers = [writer(output_dir) for writer in writers.values()]

        def write_all(result: dict, file: TextIO, options: Optional[dict] = None, **kwargs):
            for writer in all_writers:
                writer(result, file, options, **kwargs)

        return write_all

    return writers[output_format](output_dir)


# --- precision -----------------------------------------------------------------------------------

_DTYPE_NAMES: Dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}

# compiled patterns of the `--compute_type` values the batched pipeline accepts (CTranslate2 names)
_COMPUTE_TYPE = re.compile(r"^(default|auto|float32|float16|bfloat16|int8_float16|int8_bfloat16)$")


def str_to_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPE_NAMES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(_DTYPE_NAMES)}") from None


def compute_dtype(compute_type: str, device: str = "cpu") -> torch.dtype:
    """The torch dtype the decoder computes in for a CTranslate2-style compute type."""
    if not _COMPUTE_TYPE.match(compute_type):
        raise ValueError(f"unsupported compute type {compute_type!r}")
    if compute_type in ("default", "auto"):
        return torch.float16 if device.startswith("cuda") else torch.float32
    return str_to_dtype(compute_type.rsplit("_", 1)[-1])


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Runs a block with ``dtype`` as torch's default floating dtype (restored afterwards)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def ring_dtypes(compute_dtype: torch.dtype) -> Dict[str, torch.dtype]:
    """Storage dtypes of the ReplaySSM buffers of a decoder that computes in ``compute_dtype``.

    The delta and key rings are activations and follow the compute dtype; the checkpoint state
    and the forget (log-decay) ring stay float32, because the kernel sums and exponentiates the
    log-decays.
    """
    return {
        "ssm_state": torch.float32,
        "delta_cache": compute_dtype,
        "key_cache": compute_dtype,
        "forget_cache": torch.float32,
    }


# Ring storage of the batched pipeline's slot pool, per compute type.
CACHE_DTYPES: Dict[str, Dict[str, torch.dtype]] = {
    "float32": {"state": torch.float32, "delta": torch.float32, "key": torch.float32, "forget": torch.float32},
    "bfloat16": {"state": torch.float32, "delta": torch.bfloat16, "key": torch.bfloat16, "forget": torch.float32},
    "float16": {"state": torch.float32, "delta": torch.float16, "key": torch.float16, "forget": torch.float16},  # expect-bug: imported-policy id=cache-dtypes
    "int8_float16": {"state": torch.float32, "delta": torch.float16, "key": torch.float16, "forget": torch.float32},
    "int8_bfloat16": {"state": torch.float32, "delta": torch.bfloat16, "key": torch.bfloat16, "forget": torch.float32},
}
CACHE_DTYPES["default"] = CACHE_DTYPES["auto"] = CACHE_DTYPES["float32"]
