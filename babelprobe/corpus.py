"""Text corpora as an item source for the token-level analyses (`--corpus`): read per language, with a
held-out split, tokenised and packed into full-context rows, each with BOS first.

    corpus = read_corpus("udhr")                        # bundled: 22 languages, babelprobe/data/corpus_udhr
    corpus = read_corpus("texts/", languages=["en", "de"])      # a folder of <lang>.txt
    rows = pack_rows(lm, corpus.train["en"], window=128)          # [[BOS, t1 .. t128], ...]

Sources:
  - a bundled name (`udhr`: the Universal Declaration of Human Rights, README beside its files);
  - a folder of `<lang>.txt` (ISO 639-1 names), one text per line; `heldout/<lang>.txt` beside them is
    the held-out split;
  - a table (`.parquet`, `.jsonl`, `.csv`) with a `text` and a `language` column (and optionally `split`:
    rows marked heldout, test or validation are held out);
  - `hf:ORG/NAME[:CONFIG[:SPLIT]]`, streamed from the hub (online only), `{lang}` in CONFIG replaced by
    each of `--languages` (`hf:wikimedia/wikipedia:20231101.{lang}`), or a `language` column.

Held-out split: the one a source declares; where it declares none, the last `HELDOUT_SHARE` of each
language's lines (at least one line). Analyses that fit something (an SAE) train on `train` and report on
`heldout`; readouts (perplexity) read `heldout`.

Packing (`pack_rows`): each language's lines are tokenised without special tokens, joined into one token
stream and cut into rows of `window` text tokens, BOS first in every row: the release of Tang et al.
(`activation.py`, `ppl.py`) cuts its token stream into rows of the model's context the same way, and
SAELens' `concat_and_batch_sequences` packs its rows with BOS first. A row of fewer tokens at the end is
dropped (`ppl.py`: `l // max_length * max_length`), unless it is the language's only one or `keep_last`.
`tokens` caps a language's stream (`ppl.py`: `min(l, 2**20)`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from babelprobe.errors import BabelprobeError

HELDOUT_SHARE = 0.1  # a source without a declared split holds out the last 10% of each language's lines
HELDOUT_NAMES = ("heldout", "test", "validation", "valid")
TABLE_SUFFIXES = (".parquet", ".jsonl", ".csv")


@dataclass
class Corpus:
    """Texts per language: `train` and `heldout` ({language: [texts]}), and where they came from."""

    source: str
    train: dict[str, list[str]]
    heldout: dict[str, list[str]]
    split: str = "declared"  # or "last share": the held-out lines were the last HELDOUT_SHARE
    info: dict = field(default_factory=dict)

    @property
    def languages(self) -> list[str]:
        return sorted(self.train)

    def part(self, name: str) -> dict[str, list[str]]:
        if name not in ("train", "heldout"):
            raise ValueError(f"corpus part {name!r}: train or heldout")
        return self.train if name == "train" else self.heldout

    def digest(self) -> str:
        """A content hash of both parts (part of a run's identity)."""
        h = hashlib.sha256()
        for name in ("train", "heldout"):
            for code in sorted(self.part(name)):
                h.update(f"{name}\0{code}\0".encode() + "\n".join(self.part(name)[code]).encode() + b"\0")
        return h.hexdigest()[:16]

    def describe(self) -> dict:
        return {"corpus": self.source, "corpus_digest": self.digest(), "split": self.split,
                "languages": self.languages}


# --------------------------------------------------------------------------------------------- reading

def read_corpus(source, languages: list[str] | None = None, *, tokens: int | None = None,
                flag: str = "--corpus") -> Corpus:
    """The corpus `source` names (module docstring), restricted to `languages` (each must be there).
    `tokens` only bounds how much of a streamed `hf:` source is read (the cap itself is `pack_rows`')."""
    from babelprobe.bundled import bundled_sets

    if isinstance(source, Corpus):
        return _restricted(source, languages, flag)
    text = str(source)
    if text.startswith("hf:"):
        return _from_hub(text[3:], languages, tokens, flag)
    bundled = bundled_sets("corpus")
    if text in bundled:
        return _restricted(_from_folder(bundled[text].location, flag, name=text), languages, flag)
    path = Path(text).expanduser()
    if path.is_dir():
        return _restricted(_from_folder(path, flag), languages, flag)
    if path.is_file():
        return _restricted(_from_table(path, flag), languages, flag)
    raise BabelprobeError(f"{flag} {source}: no such file or directory (a folder of <lang>.txt, a .parquet/.jsonl/.csv "
                          f"with text and language columns, hf:ORG/NAME, or a bundled corpus: "
                          f"{', '.join(bundled)})")


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _check_code(code: str, where, flag: str) -> None:
    from babelprobe.languages import iso_codes

    if code not in iso_codes():
        raise BabelprobeError(f"{flag} {where}: {code!r} is not an ISO 639-1 language code (name files en.txt, zh.txt; "
                              "give a language column of such codes)")


def _from_folder(directory: Path, flag: str, name: str | None = None) -> Corpus:
    from babelprobe.tables import read_text

    files = {p.stem: p for p in sorted(directory.glob("*.txt"))}
    if not files:
        raise BabelprobeError(f"{flag} {directory}: no <lang>.txt files in it")
    for code, path in files.items():
        _check_code(code, path, flag)
    train = {code: _lines(read_text(path)) for code, path in files.items()}
    held_dir = next((directory / n for n in HELDOUT_NAMES if (directory / n).is_dir()), None)
    if held_dir is not None:
        held = {p.stem: _lines(read_text(p)) for p in sorted(held_dir.glob("*.txt")) if p.stem in train}
        missing = [code for code in train if not held.get(code)]
        if missing:
            raise BabelprobeError(f"{flag} {held_dir}: no held-out text for {missing[0]} ({missing[0]}.txt); give one "
                                  f"per language of {directory}, or remove {held_dir.name}/ to hold out the last "
                                  f"{HELDOUT_SHARE:.0%} of each language's lines")
        return _checked(Corpus(name or str(directory), train, held), flag)
    return _checked(_split_last(name or str(directory), train), flag)


def _from_table(path: Path, flag: str) -> Corpus:
    import pandas as pd

    if path.suffix not in TABLE_SUFFIXES:
        raise BabelprobeError(f"{flag} {path}: a corpus file is {', '.join(TABLE_SUFFIXES)} (or give a folder of "
                              "<lang>.txt)")
    try:
        if path.suffix == ".parquet":
            frame = pd.read_parquet(path)
        elif path.suffix == ".jsonl":
            frame = pd.read_json(path, lines=True, dtype=False)
        else:
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, ValueError) as err:
        raise BabelprobeError(f"{flag} {path}: cannot read it ({str(err).splitlines()[0]})") from err
    language = "language" if "language" in frame.columns else "lang" if "lang" in frame.columns else None
    if "text" not in frame.columns or language is None:
        raise BabelprobeError(f"{flag} {path}: needs a text and a language column (it has "
                              f"{', '.join(map(str, frame.columns)) or 'none'})")
    frame = frame.assign(text=frame["text"].astype(str), language=frame[language].astype(str))
    frame = frame[frame["text"].str.strip() != ""]
    if frame.empty:
        raise BabelprobeError(f"{flag} {path}: no text in it")
    for code in frame["language"].unique():
        _check_code(code, path, flag)
    held_mask = frame["split"].astype(str).str.lower().isin(HELDOUT_NAMES) if "split" in frame.columns else None
    if held_mask is None or not held_mask.any():
        train = {code: [t for text in part["text"] for t in _lines(text)] for code, part in frame.groupby("language")}
        return _checked(_split_last(str(path), train), flag)
    parts = {}
    for name, mask in (("train", ~held_mask), ("heldout", held_mask)):
        parts[name] = {code: [t for text in part["text"] for t in _lines(text)]
                       for code, part in frame[mask].groupby("language")}
    missing = [code for code in parts["train"] if not parts["heldout"].get(code)]
    if missing:
        raise BabelprobeError(f"{flag} {path}: language {missing[0]} has no held-out rows (split column); mark some, or "
                              f"drop the split column to hold out the last {HELDOUT_SHARE:.0%} of each language's lines")
    return _checked(Corpus(str(path), parts["train"], parts["heldout"]), flag)


def _from_hub(spec: str, languages: list[str] | None, tokens: int | None, flag: str) -> Corpus:
    """hf:ORG/NAME[:CONFIG[:SPLIT]], streamed (module docstring); reads until each language has about
    `tokens` tokens' worth of characters (8 per token) in its train part, then its held-out share."""
    name, _, rest = spec.partition(":")
    config, _, split = rest.partition(":")
    if "{lang}" in config and not languages:
        raise BabelprobeError(f"{flag} hf:{spec}: the config names a language ({{lang}}); give --languages")
    try:
        import datasets
    except ImportError as err:
        raise BabelprobeError(f"{flag} hf:{spec} needs the datasets package (pip install datasets)") from err
    budget = (tokens or 200_000) * 8
    texts: dict[str, list[str]] = {}
    for code in (languages if "{lang}" in config else [None]):
        try:
            stream = datasets.load_dataset(name, config.replace("{lang}", code or "") or None,
                                           split=split or "train", streaming=True)
            got: dict[str, int] = {}
            for row in stream:
                language = code or str(row.get("language") or row.get("lang") or "")
                if not language or (languages and language not in languages) or "text" not in row:
                    continue
                if got.get(language, 0) < budget:
                    lines = _lines(str(row["text"]))
                    texts.setdefault(language, []).extend(lines)
                    got[language] = got.get(language, 0) + sum(map(len, lines))
                if _enough(got, budget, [code] if code else languages):
                    break
        except Exception as err:  # offline, a missing dataset, config or split: all user-facing
            raise BabelprobeError(f"{flag} hf:{spec}: cannot stream it ({str(err).splitlines()[0]})") from err
    if not texts:
        raise BabelprobeError(f"{flag} hf:{spec}: no rows with text (and a language) came back")
    corpus = _split_last(f"hf:{spec}", texts)
    return _restricted(_checked(corpus, flag), languages, flag)


def _enough(got: dict[str, int], budget: int, languages) -> bool:
    """Whether a stream has given every wanted language its budget (without a list: the first language
    seen stands for all, so an unlabelled stream stops)."""
    wanted = list(languages) if languages else list(got)[:1]
    return bool(wanted) and all(got.get(code, 0) >= budget for code in wanted)


def _split_last(source: str, texts: dict[str, list[str]]) -> Corpus:
    """The last HELDOUT_SHARE of each language's lines held out (at least one line, when there are two)."""
    train, held = {}, {}
    for code, lines in texts.items():
        n = max(1, round(len(lines) * HELDOUT_SHARE)) if len(lines) > 1 else 0
        train[code], held[code] = lines[:len(lines) - n], lines[len(lines) - n:]
    return Corpus(source, train, held, split="last share")


def _checked(corpus: Corpus, flag: str) -> Corpus:
    empty = [code for code in corpus.train if not corpus.train[code]]
    if empty:
        raise BabelprobeError(f"{flag} {corpus.source}: no text in {empty[0]}")
    return corpus


def _restricted(corpus: Corpus, languages, flag: str) -> Corpus:
    if not languages:
        return corpus
    missing = [code for code in languages if code not in corpus.train]
    if missing:
        raise BabelprobeError(f"{flag} {corpus.source}: no {missing[0]} text (it has {', '.join(corpus.languages)})")
    keep = list(dict.fromkeys(languages))
    return Corpus(corpus.source, {c: corpus.train[c] for c in keep}, {c: corpus.heldout.get(c, []) for c in keep},
                  corpus.split, dict(corpus.info))


# --------------------------------------------------------------------------------------------- packing

def token_stream(tokenizer, lines: list[str]) -> list[int]:
    """The lines tokenised without special tokens and joined, a newline's tokens between lines (so the
    stream reads as the text did)."""
    if not lines:
        return []
    ids = tokenizer(["\n".join(lines)], add_special_tokens=False)["input_ids"][0]
    return list(ids)


def pack_rows(lm, lines: list[str], window: int, *, tokens: int | None = None, keep_last: bool = False) -> list[list[int]]:
    """Rows of `window` text tokens, BOS first in each (module docstring): the stream of `lines`, at most
    `tokens` of it; a shorter last row is kept when `keep_last` or when it is the only one."""
    if window < 1:
        raise BabelprobeError(f"--window must be at least 1, got {window}")
    stream = token_stream(lm.tokenizer, lines)
    if tokens is not None:
        stream = stream[:tokens]
    bos = [lm.bos_token_id] if lm.bos_token_id is not None else []
    rows = [bos + stream[start:start + window] for start in range(0, len(stream), window)]
    if rows and len(rows[-1]) - len(bos) < window and not keep_last and len(rows) > 1:
        rows = rows[:-1]
    return [row for row in rows if len(row) > len(bos)]


def packed(lm, corpus: Corpus, part: str, window: int, *, tokens: int | None = None,
           keep_last: bool = False) -> dict[str, list[list[int]]]:
    """{language: rows} of one part of the corpus (`pack_rows` for each language)."""
    return {code: pack_rows(lm, lines, window, tokens=tokens, keep_last=keep_last)
            for code, lines in sorted(corpus.part(part).items())}


def row_tokens(lm, rows: list[list[int]]) -> int:
    """The text tokens of some rows: every token but each row's BOS."""
    return sum(len(r) - (lm.bos_token_id is not None) for r in rows)
