"""Token sets: which vocabulary tokens can start a given word, in the spellings a model may use.

The logit lens asks how much probability a layer puts on "the answer", but an answer is a word and
the model predicts tokens. Following the token-prefix approach of Wendler et al. (2024, "Do Llamas
work in English?"), the probability of a word is the total probability of every token that can begin
it: every vocabulary token whose bytes are a prefix of the word, written
  - as given, in lower case, or with a capital first letter (case), and
  - with or without a leading space (SentencePiece `▁`, byte-level BPE `Ġ`);
prefixes end on whole characters (a CJK, Cyrillic or Arabic character is never cut in the middle) and
are never only whitespace. The first token of the tokenizer's own encoding of each spelling is always
included: when the tokenizer falls back to bytes (`<0xF0>` for a character it has no token for) that
byte token is how the model writes the word, so it counts, while a byte token that merely begins a
character's UTF-8 encoding does not (it begins thousands of other characters too).

Tokens are compared as bytes: `<0xNN>` byte-fallback tokens are that byte, SentencePiece pieces are
UTF-8 with `▁` for a space, byte-level BPE pieces are decoded through their byte alphabet; special
tokens (BOS, EOS, padding, ...) begin no word.

`token_script` names the writing system of a token's first letter (Latin, Han, Kana, Hangul,
Cyrillic, Arabic, ...), the coarse "language of a token" the lens reports for its top-k tokens.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import cache

from babelprobe.languages import language_table

BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
SPACE_MARKER = "\u2581"  # SentencePiece's ▁


@dataclass
class Vocabulary:
    """The bytes each token id stands for, and the ids of each byte string (several ids may share one)."""

    tokenizer: object
    pieces: list[bytes]
    ids_of: dict[bytes, list[int]]

    def text(self, token_id: int) -> str:
        """The token as text (a partial UTF-8 character is shown as U+FFFD)."""
        return self.pieces[token_id].decode("utf-8", errors="replace")

    def shown(self, token_id: int) -> str:
        """The token as text for a table: control characters (newline, tab, ...) written as escapes, so a
        CSV cell never holds a line break."""
        return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                       for c in self.text(token_id))


_VOCABULARIES: dict[int, Vocabulary] = {}


def vocabulary(tokenizer) -> Vocabulary:
    """The `Vocabulary` of a tokenizer, built once per tokenizer object (262k tokens: about a second)."""
    known = _VOCABULARIES.get(id(tokenizer))
    if known is not None and known.tokenizer is tokenizer:
        return known
    table = tokenizer.get_vocab()
    pieces = [b""] * max(len(tokenizer), max(table.values()) + 1)
    decode = _byte_level_decoder() if _is_byte_level(tokenizer) else _piece_bytes
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids_of: dict[bytes, list[int]] = {}
    for piece, token_id in table.items():
        if token_id in special:
            continue
        pieces[token_id] = decode(piece)
        if not BYTE_TOKEN.match(piece):  # byte-fallback tokens count only as a word's own first token
            ids_of.setdefault(pieces[token_id], []).append(token_id)
    vocab = Vocabulary(tokenizer, pieces, ids_of)
    _VOCABULARIES[id(tokenizer)] = vocab
    return vocab


def _piece_bytes(piece: str) -> bytes:
    match = BYTE_TOKEN.match(piece)
    if match:
        return bytes([int(match.group(1), 16)])
    return piece.replace(SPACE_MARKER, " ").encode("utf-8")


def _is_byte_level(tokenizer) -> bool:
    """GPT-2-style byte-level BPE (pieces are written in a byte alphabet) rather than SentencePiece."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and "ByteLevel(" in repr(backend.decoder)


@cache
def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-printable-character table (Radford et al. 2019, `bytes_to_unicode`), reversed."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def _byte_level_decoder():
    alphabet = _byte_alphabet()

    def decode(piece: str) -> bytes:
        try:
            return bytes(alphabet[c] for c in piece)
        except KeyError:  # an added token written in plain text
            return piece.encode("utf-8")
    return decode


# --------------------------------------------------------------------------------------- token sets

def spellings(word: str) -> list[str]:
    """The word as given, in lower case and with a capital first letter (duplicates dropped)."""
    word = word.strip()
    return list(dict.fromkeys([word, word.lower(), word[:1].upper() + word[1:]]))


def token_set(tokenizer, word: str) -> frozenset[int]:
    """Ids of every token that can begin `word` (module docstring); empty for an empty word."""
    vocab = vocabulary(tokenizer)
    word = str(word).strip()
    if not word:
        return frozenset()
    ids: set[int] = set()
    for spelling in spellings(word):
        for text in (spelling, " " + spelling):
            target = text.encode("utf-8")
            for end in range(1, len(target) + 1):
                prefix = target[:end]
                if prefix.strip() and _whole_characters(prefix):
                    ids.update(vocab.ids_of.get(prefix, ()))
            first = tokenizer(text, add_special_tokens=False)["input_ids"][:1]
            if first and vocab.pieces[first[0]].strip() and target.startswith(vocab.pieces[first[0]]):
                ids.add(first[0])
    return frozenset(ids)


def _whole_characters(prefix: bytes) -> bool:
    try:
        prefix.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def word_tokens(tokenizer, word: str) -> int:
    """How many tokens the word takes after a space (how the tokenizer writes it mid-sentence)."""
    return len(tokenizer(" " + str(word).strip(), add_special_tokens=False)["input_ids"])


# -------------------------------------------------------------------------------------------- scripts

SCRIPT_OF_NAME = {"CJK": "Han", "HIRAGANA": "Kana", "KATAKANA": "Kana", "HALFWIDTH": "Kana"}


def token_script(text: str) -> str:
    """Writing system of the first letter in `text` ('Latin', 'Han', 'Kana', 'Hangul', 'Cyrillic',
    'Arabic', 'Greek', 'Hebrew', ...), or 'none' when it has no letter (digits, punctuation, spaces)."""
    for char in text:
        if unicodedata.category(char).startswith("L"):
            first = unicodedata.name(char, "UNKNOWN").split()[0]
            return SCRIPT_OF_NAME.get(first, first.title())
    return "none"


@cache
def language_scripts(language: str) -> frozenset[str]:
    """The scripts `language` is written in, from the language table's `script` column (Japanese:
    Han and Kana); an unknown language has none."""
    table = language_table()
    if language not in table.index:
        return frozenset()
    script = table.at[language, "script"]
    if language == "ja" or "kana" in script.lower():
        return frozenset({"Han", "Kana"})
    return frozenset({script.split()[0].title()})
