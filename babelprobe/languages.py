"""Language tables: ISO 639-1 codes and English names, and the typology table of the XCOMPS languages.

Every stage that needs to know about a language (is this a code? what is it called? how are a COMPS
prefix and its continuation joined? which typology class is it?) asks here, so the answer is the same
everywhere. The tables are data files in `babelprobe/data/` (`iso639_1.csv`, `languages.csv`).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from babelprobe.bundled import DATA
from babelprobe.errors import BabelprobeError

if TYPE_CHECKING:
    import pandas as pd


@cache
def language_table() -> pd.DataFrame:
    """The bundled language table (XCOMPS Table 3 plus English): code, name, typology, family, script,
    the separator between a COMPS prefix and its continuation, and the language's full stop."""
    return _read_csv(DATA / "languages.csv", keep_default_na=False, dtype=str).set_index("code")


@cache
def iso_codes() -> frozenset[str]:
    return frozenset(_read_csv(DATA / "iso639_1.csv", keep_default_na=False)["code"])


@cache
def bridge_configs() -> pd.DataFrame:
    """The configs of the MultiBLiMP and Belebele releases (data/bridges/configs.csv): `dataset`, `config`
    (ISO 639-3, Belebele with its script: `deu_Latn`), the `language` code babelprobe gives their items
    (ISO 639-1 where the language or, for a macrolanguage's standard variety, the macrolanguage has one,
    else ISO 639-3; a script suffix where Belebele has the language in a second script: `hi-Latn`) and
    MultiBLiMP's English `name`."""
    return _read_csv(DATA / "bridges" / "configs.csv", keep_default_na=False, dtype=str)


@cache
def language_codes() -> frozenset[str]:
    """Codes an item's language may have: ISO 639-1, and ISO 639-3 for the languages of the bridged
    benchmarks that have no 639-1 code (MultiBLiMP's `aln`, Belebele's `acm`, ...)."""
    return iso_codes() | frozenset(code for code in bridge_configs()["language"] if len(code) == 3)


@cache
def language_names() -> dict[str, str]:
    """English name of every ISO 639-1 code (`de` -> German), for prompts that name a language."""
    table = _read_csv(DATA / "iso639_1.csv", keep_default_na=False, dtype=str)
    return dict(zip(table["code"], table["name"]))


@cache
def codes_by_name() -> dict[str, str]:
    """Lower-cased English language name (each of a code's listed names) -> ISO 639-1 code."""
    table = _read_csv(DATA / "iso639_1.csv", keep_default_na=False)
    codes = {}
    for code, names in zip(table["code"], table["name"], strict=True):
        for name in str(names).replace(",", ";").split(";"):
            codes.setdefault(name.strip().lower(), code)
    return codes


def language_code(name: str) -> str:
    """ISO 639-1 code of a language named in English ('Chinese' -> 'zh')."""
    codes = codes_by_name()
    if name.lower() not in codes:
        raise BabelprobeError(f"cannot map language {name!r} to an ISO 639-1 code; name files after the "
                              "language's English name (Chinese.json, French.json, ...)")
    return codes[name.lower()]


@cache
def separator(language: str) -> str:
    """What joins a COMPS prefix and its continuation in `language` (a space; nothing in zh, ja)."""
    table = language_table()
    return table.at[language, "separator"] if language in table.index else " "


def _read_csv(path, **options) -> pd.DataFrame:
    import pandas as pd  # here, not at the top: the CLI's --help reads language tables without pandas

    return pd.read_csv(path, **options)
