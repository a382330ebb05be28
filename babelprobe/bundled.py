"""The one registry of every data set shipped inside babelprobe (`babelprobe items list` prints it).

Each bundled set belongs to one benchmark: `xcomps` sets are minimal pairs in the item schema
(read by `load_items`, scored by `score`, `extract`, `probe` and `compare`); the others are read by
their benchmark's `load` (`babelprobe bench NAME --items SET`); `corpus` sets are running text per
language for the token-level analyses (`--corpus NAME`, `babelprobe.corpus`). Every item set here was
written for babelprobe (see the README beside its files); none is copied from the benchmark's release.
The corpus `udhr` is the Universal Declaration of Human Rights, whose translations may be freely
reproduced (its README gives the source and the licence).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

DATA = files("babelprobe") / "data"


@dataclass(frozen=True)
class BundledSet:
    name: str
    benchmark: str  # "xcomps" (item schema) or the name of the benchmark module that loads it
    path: str       # file or directory under babelprobe/data
    description: str

    @property
    def location(self) -> Path:
        return Path(str(DATA / self.path))


BUNDLED = {s.name: s for s in (
    BundledSet("xcomps-sample", "xcomps", "xcomps_sample",
               "XCOMPS-style conceptual minimal pairs in 10 languages, written for babelprobe"),
    BundledSet("stingray-sample", "stingray", "stingray_sample",
               "StingrayBench-style false friends and true cognates (en-de, zh-ja), written for babelprobe"),
    BundledSet("eclektic-sample", "eclektic", "eclektic_sample/eclektic_sample.jsonl",
               "ECLeKTiC-style closed-book questions in 5 languages, written for babelprobe"),
    BundledSet("eclektic-popular-sample", "eclektic", "eclektic_sample/eclektic_popular_sample.jsonl",
               "ECLeKTiC 'popular pages'-style questions (§5), asked only in some target languages, written for "
               "babelprobe"),
    BundledSet("consistency-sample", "consistency", "consistency_sample/pawsx_sample.jsonl",
               "PAWS-X-style paraphrase pairs with de/fr/zh references, written for babelprobe"),
    BundledSet("consistency-xnli-sample", "consistency", "consistency_sample/xnli_sample.jsonl",
               "XNLI-style premise/hypothesis pairs with de/zh references, written for babelprobe"),
    BundledSet("pitfalls-sample", "pitfalls", "pitfalls_sample",
               "Cross-Lingual Pitfalls-style bilingual questions (French, German, Chinese), written for babelprobe"),
    BundledSet("multiblimp-sample", "multiblimp", "bridges/multiblimp_sample",
               "MultiBLiMP-style agreement minimal pairs in 6 languages (4 scripts), written for babelprobe"),
    BundledSet("belebele-sample", "belebele", "bridges/belebele_sample",
               "Belebele-style passages and questions in 5 language variants (4 scripts), written for babelprobe"),
    BundledSet("xnli-sample", "xnli", "bridges/xnli_sample/xnli.dev.tsv",
               "XNLI-style premise/hypothesis pairs in 5 languages (4 scripts), written for babelprobe"),
    BundledSet("pawsx-sample", "pawsx", "bridges/pawsx_sample",
               "PAWS-X-style paraphrase pairs in 5 languages (3 scripts), written for babelprobe"),
    BundledSet("lm-eval-sample", "lm-eval", "lmeval_sample",
               "XCOPA-style questions in 4 languages (written for babelprobe) and belebele-sample, read through the "
               "installed lm-evaluation-harness's xcopa and belebele tasks (the lm-eval extra)"),
    BundledSet("dumas-concepts", "patching", "patching_concepts/concepts.csv",
               "concept words in the 12 languages of Dumas et al.'s patching configurations, written for babelprobe"),
    BundledSet("udhr", "corpus", "corpus_udhr",
               "the Universal Declaration of Human Rights in 22 languages (articles 25-30 held out), a text corpus"),
)}


def bundled_sets(benchmark: str) -> dict[str, BundledSet]:
    """The bundled sets of one benchmark, by name."""
    return {name: s for name, s in BUNDLED.items() if s.benchmark == benchmark}
