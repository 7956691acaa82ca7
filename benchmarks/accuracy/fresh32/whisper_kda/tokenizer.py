"""A byte-level tokenizer with Whisper's special tokens.

whisper-kda checkpoints are trained on UTF-8 bytes (256 text tokens) instead of the GPT-2 BPE of
the original models; the special tokens, their order and their meaning are Whisper's, so the
decoding logic (``<|startoftranscript|>``, language and task tokens, timestamps) is unchanged.
"""

import string
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Dict, List, Optional, Tuple

LANGUAGES = {
    "en": "english",
    "zh": "chinese",
    "de": "german",
    "es": "spanish",
    "ru": "russian",
    "ko": "korean",
    "fr": "french",
    "ja": "japanese",
}

# language code lookup by name, with a few language aliases
TO_LANGUAGE_CODE = {
    **{language: code for code, language in LANGUAGES.items()},
    "castilian": "es",
    "mandarin": "zh",
}

N_TEXT_TOKENS = 256
N_TIMESTAMPS = 1501
NON_LANGUAGE_TOKENS = N_TEXT_TOKENS + 2 + 6 + N_TIMESTAMPS  # text, eot/sot, task and misc, timestamps


def special_tokens(num_languages: int) -> List[str]:
    specials = [
        "<|endoftext|>",
        "<|startoftranscript|>",
        *[f"<|{lang}|>" for lang in list(LANGUAGES.keys())[:num_languages]],
        "<|translate|>",
        "<|transcribe|>",
        "<|startoflm|>",
        "<|startofprev|>",
        "<|nospeech|>",
        "<|notimestamps|>",
        *[f"<|{i * 0.02:.2f}|>" for i in range(N_TIMESTAMPS)],
    ]
    return specials


@dataclass
class Tokenizer:
    """A thin wrapper around the byte vocabulary providing quick access to special tokens"""

    num_languages: int
    language: Optional[str] = None
    task: Optional[str] = None
    sot_sequence: Tuple[int] = ()
    special_tokens: Dict[str, int] = field(default_factory=dict)

    def __post_init__(self):
        for offset, special in enumerate(special_tokens(self.num_languages)):
            self.special_tokens[special] = N_TEXT_TOKENS + offset

        sot: int = self.special_tokens["<|startoftranscript|>"]
        translate: int = self.special_tokens["<|translate|>"]
        transcribe: int = self.special_tokens["<|transcribe|>"]

        langs = tuple(LANGUAGES.keys())[: self.num_languages]
        sot_sequence = [sot]
        if self.language is not None:
            sot_sequence.append(sot + 1 + langs.index(self.language))
        if self.task is not None:
            task_token: int = transcribe if self.task == "transcribe" else translate
            sot_sequence.append(task_token)

        self.sot_sequence = tuple(sot_sequence)

    @property
    def n_vocab(self) -> int:
        return N_TEXT_TOKENS + len(self.special_tokens)

    def encode(self, text: str, **kwargs) -> List[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: List[int], **kwargs) -> str:
        data = bytes(t for t in token_ids if t < N_TEXT_TOKENS)
        return data.decode("utf-8", errors="replace")

    def decode_with_timestamps(self, token_ids: List[int], **kwargs) -> str:
        """Timestamp tokens are above other special tokens' id range and are written as ``<|1.08|>``."""
        pieces, text = [], []
        for token in token_ids:
            if token >= self.timestamp_begin:
                pieces.append(bytes(text).decode("utf-8", errors="replace"))
                pieces.append(f"<|{(token - self.timestamp_begin) * 0.02:.2f}|>")
                text = []
            elif token < N_TEXT_TOKENS:
                text.append(token)
        pieces.append(bytes(text).decode("utf-8", errors="replace"))
        return "".join(pieces)

    @cached_property
    def eot(self) -> int:
        return self.special_tokens["<|endoftext|>"]

    @cached_property
    def transcribe(self) -> int:
        return self.special_tokens["<|transcribe|>"]

    @cached_property
    def translate(self) -> int:
        return self.special_tokens["<|translate|>"]

    @cached_property
    def sot(self) -> int:
        return self.special_tokens["<|startoftranscript|>"]

    @cached_property
    def sot_lm(self) -> int:
        return self.special_tokens["<|startoflm|>"]

    @cached_property
    def sot_prev(self) -> int:
        return self.special_tokens["<|startofprev|>"]

    @cached_property
    def no_speech(self) -> int:
        return self.special_tokens["<|nospeech|>"]

    @cached_property
    def no_timestamps(self) -> int:
        return self.special_tokens["<|notimestamps|>"]

    @cached_property
    def timestamp_begin(self) -> int:
        return self.special_tokens["<|0.00|>"]

    @cached_property
    def language_token(self) -> int:
        """Returns the token id corresponding to the value of the `language` field"""
        if self.language is None:
            raise ValueError("This tokenizer does not have language token configured")
        return self.to_language_token(self.language)

    def to_language_token(self, language):
        if token := self.special_tokens.get(f"<|{language}|>", None):
            return token
        raise KeyError(f"Language {language} not found in tokenizer.")

    @cached_property
    def all_language_tokens(self) -> Tuple[int]:
        result = []
        for token, token_id in self.special_tokens.items():
            if token.strip("<|>") in LANGUAGES:
                result.append(token_id)
        return tuple(result)[: self.num_languages]

    @cached_property
    def all_language_codes(self) -> Tuple[str]:
        return tuple(self.special_tokens_by_id[i].strip("<|>") for i in self.all_language_tokens)

    @cached_property
    def special_tokens_by_id(self) -> Dict[int, str]:
        return {token_id: token for token, token_id in self.special_tokens.items()}

    @cached_property
    def sot_sequence_including_notimestamps(self) -> Tuple[int]:
        return tuple(list(self.sot_sequence) + [self.no_timestamps])

    @cached_property
    def non_speech_tokens(self) -> Tuple[int]:
        """Tokens of symbols a speaker would not say: suppressed unless `suppress_tokens` is empty."""
        symbols = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』')
        symbols += "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split()
        result = set()
        for symbol in symbols:
            encoded = self.encode(symbol)
            if len(encoded) == 1:
                result.add(encoded[0])
            result.add(self.encode(" " + symbol)[0])
        return tuple(sorted(result))

    def split_to_word_tokens(self, tokens: List[int]):
        return self.split_tokens_on_spaces(tokens)

    def split_tokens_on_spaces(self, tokens: List[int]):
        words: List[str] = []
        word_tokens: List[List[int]] = []
        for token in tokens:
            special = token >= self.eot
            starts_word = special or token == ord(" ") or not word_tokens or chr(token) in string.punctuation
            if starts_word:
                words.append("")
                word_tokens.append([])
            word_tokens[-1].append(token)
            words[-1] = self.decode(word_tokens[-1]) if not special else self.special_tokens_by_id[token]
        return words, word_tokens


# a non-tensor cache: language name -> code lookups resolved by `get_tokenizer`
_language_cache: Dict[str, str] = {}


@lru_cache(maxsize=None)
def get_tokenizer(
    multilingual: bool,
    *,
    num_languages: int = len(LANGUAGES),
    language: Optional[str] = None,
    task: Optional[str] = None,  # Literal["transcribe", "translate", None]
) -> Tokenizer:
    if language is not None:
        language = language.lower()
        if language not in LANGUAGES:
            if language in TO_LANGUAGE_CODE:
                language = _language_cache.setdefault(language, TO_LANGUAGE_CODE[language])
            else:
                raise ValueError(f"Unsupported language: {language}")

    if multilingual:
        language = language or "en"
        task = task or "transcribe"
    else:
        language = None
        task = None

    return Tokenizer(num_languages=num_languages, language=language, task=task)
