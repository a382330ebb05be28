"""The logit lens with language attribution: what each layer would predict next, and in which language.

Every layer's stored last-token state goes through the model's own final norm and unembedding (and
logit scale and final-logit soft-capping, if the model has them), exactly as the model treats its last layer, so at the
last layer the lens is the model's real next-token distribution (docs/design.md: layer L in a store is
the output of the last block, before the final norm). No model re-run is needed for states a store
holds; prompts whose next token is the answer (the meta question) are extracted once into a store of
their own (`meta_lens`).

Per item and layer (`lens_table`):
  entropy               of the next-token distribution, in nats;
  p_own, rank_own       total probability of the tokens that can begin the expected answer in the
                        item's language, and the rank of the best of them (1 = the top token);
  p_pivot, rank_pivot   the same for the answer of the item's parallel item in the pivot language
                        (English by default; `parallel_id` links them); NaN for pivot-language items;
  top_token, p_top      the layer's top token;  top_tokens  its five best, for reading;
  topk_own_script       share of the top-k tokens written in the item language's script(s);
  topk_latin            share of the top-k tokens in Latin script.
Token sets come from `tokens.token_set` (prefixes, `▁`, case, byte fallback). A token that can begin
both answers (`chat` / `cat`: `c`, `▁c`) says nothing about the language, so it is removed from both
sets (`n_shared` counts them); an item left with an empty set gets NaN for that answer.

The vocabulary projection is done one layer at a time in chunks of rows, so no [rows, vocab] array
larger than a chunk exists (262k tokens × 32 rows × 4 bytes = 34 MB).

`lens_curves` averages p_own and p_pivot per language and layer with bootstrap bands (pairs resampled:
both meta orders of a pair are one unit), `lens_turns` says per language where the pivot leads, and
`join_compare` joins per pair with a compare directory's meta/direct/neuro correctness and probe peaks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from babelprobe.errors import BabelprobeError
from babelprobe.latent.tokens import language_scripts, token_script, token_set, vocabulary, word_tokens
from babelprobe.models import LoadedModel
from babelprobe.stats import paired_bootstrap

TOP_K = 10
SHOWN = 5  # tokens written into `top_tokens`
CHUNK_ROWS = 32
ORDERS = ("gf", "bf")


# ------------------------------------------------------------------------------------- the projection

def lens_logits(lm: LoadedModel, hidden: torch.Tensor) -> torch.Tensor:
    """float32 next-token logits [rows, vocab] from pre-final-norm states [rows, d_model] of any layer:
    the model's final norm (`Parts.normed`: refused in one line where it was not found), head, logit scale
    and soft-capping (`Parts.logits`), the sites of babelprobe/data/families.csv."""
    parts = lm.parts
    hidden = hidden.to(device=lm.device, dtype=lm.dtype)
    with torch.inference_mode():
        return parts.logits(parts.normed(hidden)).float()


def _set_stats(logits: torch.Tensor, logp: torch.Tensor, sets: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per row: total probability of the row's token set and the rank of its best token (NaN: no set)."""
    n = len(sets)
    prob, rank = np.full(n, np.nan), np.full(n, np.nan)
    for i, ids in enumerate(sets):
        if not ids:
            continue
        index = torch.tensor(ids, device=logits.device)
        prob[i] = float(torch.logsumexp(logp[i, index], dim=0).exp())
        rank[i] = float((logits[i] > logits[i, index].max()).sum()) + 1
    return prob, rank


# ------------------------------------------------------------------------------------------- targets

def answer_sets(lm: LoadedModel, items: pd.DataFrame, target: str | None, pivot: str | None) -> pd.DataFrame:
    """Per item: the expected answer (`answer_own`, from column `target`) and its pivot-language
    counterpart (`answer_pivot`: the `target` of the pivot item with the same `parallel_id`), their token
    sets with shared tokens removed (`own_ids`, `pivot_ids`), `n_shared` and the answers' token counts."""
    out = pd.DataFrame(index=items.index)
    if target is None:
        out["answer_own"] = out["answer_pivot"] = None
        out["own_ids"] = out["pivot_ids"] = [[] for _ in range(len(items))]
        out["n_shared"] = 0
        return out
    if target not in items.columns:
        raise BabelprobeError(f"the items have no {target!r} field (--target); fields: {', '.join(items.columns)}")
    out["answer_own"] = items[target].astype(str)
    out["answer_pivot"] = None
    if pivot:
        if "parallel_id" not in items.columns:
            raise BabelprobeError("the items have no 'parallel_id' field, which links an item to its pivot-language "
                                  "counterpart; add it (README, Items) or pass --pivot none")
        in_pivot = items[items["language"] == pivot].drop_duplicates("parallel_id")
        counterpart = dict(zip(in_pivot["parallel_id"].astype(str), in_pivot[target].astype(str)))
        others = items["language"] != pivot
        out.loc[others, "answer_pivot"] = items.loc[others, "parallel_id"].astype(str).map(counterpart)
    words = set(out["answer_own"]) | set(out["answer_pivot"].dropna())
    sets = {w: token_set(lm.tokenizer, w) for w in words}
    own, piv, shared = [], [], []
    for word, other in zip(out["answer_own"], out["answer_pivot"]):
        a, b = sets[word], sets[other] if isinstance(other, str) else frozenset()
        common = a & b if isinstance(other, str) else frozenset()
        own.append(sorted(a - common))
        piv.append(sorted(b - common))
        shared.append(len(common))
    out["own_ids"], out["pivot_ids"], out["n_shared"] = own, piv, shared
    lengths = {w: word_tokens(lm.tokenizer, w) for w in words}
    out["answer_tokens_own"] = out["answer_own"].map(lengths)
    out["answer_tokens_pivot"] = out["answer_pivot"].map(lengths)
    return out


# ---------------------------------------------------------------------------------------------- lens

def lens_table(lm: LoadedModel, store, items: pd.DataFrame | None = None, target: str | None = None,
               pivot: str | None = "en", top_k: int = TOP_K, layers=None, chunk_rows: int = CHUNK_ROWS,
               progress: bool = True) -> pd.DataFrame:
    """The logit lens on every stored layer (or `layers`) of a store's last-token states: one row per
    item × layer (module docstring). `items` default to the store's own (reloaded from its manifest);
    `target` names the item field holding the expected answer (None: entropy and top-k only)."""
    from babelprobe.extract import open_store

    store = open_store(store) if isinstance(store, (str, Path)) else store
    if store.fingerprint and store.fingerprint != lm.fingerprint:
        raise BabelprobeError(f"store {store.path} was extracted with another model (fingerprint "
                              f"{store.fingerprint}, this one {lm.fingerprint}); the lens needs the same model")
    if "last" not in store.pools:
        raise BabelprobeError(f"store {store.path} has no last-token states (pooling {', '.join(store.pools)}); "
                              "the lens reads the state that predicts the next token: extract with --pool last")
    items = _items_of_store(store, items)
    answers = answer_sets(lm, items, target, pivot)
    layers = store.layers if layers is None else [int(x) for x in layers]
    vocab = vocabulary(lm.tokenizer)
    own_scripts = [language_scripts(lang) for lang in items["language"]]
    frames = []
    bar = tqdm(total=len(layers) * len(items), unit="row", desc="lens", disable=not progress, dynamic_ncols=True)
    for layer in layers:
        states = store.read(layer)
        for start in range(0, len(items), chunk_rows):
            rows = slice(start, min(start + chunk_rows, len(items)))
            frames.append(_chunk(lm, torch.from_numpy(states[rows]), answers.iloc[rows], own_scripts[rows], vocab,
                                 top_k).assign(row=np.arange(rows.start, rows.stop), layer=layer))
            bar.update(rows.stop - rows.start)
    bar.close()
    table = pd.concat(frames, ignore_index=True)
    keys = [c for c in ("item_id", "pair_id", "language", "subset", "label", "parallel_id", "order") if c in items]
    info = items[keys].reset_index(drop=True).join(
        answers.drop(columns=["own_ids", "pivot_ids"]).reset_index(drop=True))
    table = info.iloc[table["row"]].reset_index(drop=True).join(table.drop(columns="row"))
    table["relative_depth"] = table["layer"] / store.n_layers
    table.loc[table["language"] == pivot, ["p_pivot", "rank_pivot"]] = np.nan
    return table


def _items_of_store(store, items: pd.DataFrame | None) -> pd.DataFrame:
    """The items in store-row order (every stored item must be among them)."""
    items = store.load_items() if items is None else items
    by_id = items.drop_duplicates("item_id").set_index("item_id", drop=False)
    missing = set(store.keys["item_id"]) - set(by_id.index)
    if missing:
        raise BabelprobeError(f"store {store.path} holds items that are not in the item set given "
                              f"(e.g. {sorted(missing)[0]!r}); give the items the store was extracted from")
    return by_id.loc[store.keys["item_id"]].reset_index(drop=True)


def _chunk(lm, hidden, answers, own_scripts, vocab, top_k) -> pd.DataFrame:
    logits = lens_logits(lm, hidden)
    logp = torch.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(dim=-1)
    p_own, rank_own = _set_stats(logits, logp, list(answers["own_ids"]))
    p_pivot, rank_pivot = _set_stats(logits, logp, list(answers["pivot_ids"]))
    top_p, top_ids = logp.topk(top_k, dim=-1)
    top_ids, top_p = top_ids.cpu().numpy(), top_p.exp().cpu().numpy()
    scripts = np.array([[token_script(vocab.text(t)) for t in row] for row in top_ids])
    own = np.array([[s in mine for s in row] for row, mine in zip(scripts, own_scripts)])
    return pd.DataFrame({
        "entropy": entropy.cpu().numpy(), "p_own": p_own, "rank_own": rank_own, "p_pivot": p_pivot,
        "rank_pivot": rank_pivot, "top_token": [vocab.shown(row[0]) for row in top_ids], "p_top": top_p[:, 0],
        "top_tokens": [" | ".join(vocab.shown(t) for t in row[:SHOWN]) for row in top_ids],
        "topk_own_script": own.mean(axis=1), "topk_latin": (scripts == "Latin").mean(axis=1)})


def last_layer_check(lm: LoadedModel, store, texts: list[str], n: int = 4) -> float:
    """The largest relative difference |lens − model| / max|model| between the lens at the last layer
    (from the store's first `n` rows) and the model's own forward pass on the same texts (NaN when the
    store does not hold the last layer)."""
    if store.n_layers not in store.layers:
        return float("nan")
    n = min(n, len(texts))
    lens = lens_logits(lm, torch.from_numpy(store.read(store.n_layers, rows=np.arange(n))))
    worst = 0.0
    for i, encoding in enumerate(lm.encode(texts[:n])):
        with torch.inference_mode():
            ids = torch.tensor([encoding.ids], device=lm.device)
            real = lm.model(input_ids=ids).logits[0, -1].float()
        worst = max(worst, float((lens[i] - real).abs().max() / real.abs().max()))
    return worst


# ---------------------------------------------------------------------------------------- meta prompts

def meta_prompt_items(items: pd.DataFrame, prompts: str | Path = "xcomps", orders=ORDERS) -> pd.DataFrame:
    """One item per pair and order: the meta question in the pair's language up to the opening quote of
    the answer (benchmarks/meta.py), whose next token begins the acceptable concept (`answer`).
    `parallel_id` is the acceptable item's, so the pivot counterpart is the same concept's word."""
    from babelprobe.benchmarks.meta import meta_requests

    bad = [o for o in orders if o not in ORDERS]
    if bad or not orders:
        raise BabelprobeError(f"unknown order {bad[0] if bad else ''!r}; use gf (acceptable concept first), bf or both")
    pairs, asked, templates = meta_requests(items, prompts)
    good = items[items["label"] == 1].set_index("pair_id")
    rows = []
    for pair, lang in zip(pairs.itertuples(index=False), asked):
        template = templates[lang]
        for order in orders:
            words = (pair.acceptable_concept, pair.unacceptable_concept)
            text = template.plain(pair.property, *(words if order == "gf" else words[::-1]))
            rows.append({"item_id": f"{pair.pair_id}-{order}", "pair_id": pair.pair_id, "language": pair.language,
                         "subset": pair.subset, "label": -1, "text": text, "order": order,
                         "answer": pair.acceptable_concept, "unacceptable_concept": pair.unacceptable_concept,
                         "parallel_id": good.at[pair.pair_id, "parallel_id"] if "parallel_id" in good else None})
    return pd.DataFrame(rows)


def meta_lens(lm: LoadedModel, items: pd.DataFrame, out: str | Path, pivot: str | None = "en",
              prompts: str | Path = "xcomps", orders=ORDERS, top_k: int = TOP_K, batch_tokens: int = 4096,
              overwrite: bool = False, progress: bool = True) -> tuple[pd.DataFrame, float]:
    """The lens on the meta questions of `items` (one fresh pass, kept as the store OUT/states): the lens
    table and the last-layer check (relative difference from the model's own logits)."""
    from babelprobe.extract import extract, open_store

    prompt_items = meta_prompt_items(items, prompts, orders)
    states = Path(out) / "states"
    extract(lm, prompt_items, states, pool="last", batch_tokens=batch_tokens, overwrite=overwrite,
            progress=progress, provenance={"items": {"made_by": "babelprobe lens: the meta questions of the items",
                                                     "prompts": str(prompts), "orders": list(orders)}})
    store = open_store(states)
    table = lens_table(lm, store, prompt_items, target="answer", pivot=pivot, top_k=top_k, progress=progress)
    return table, last_layer_check(lm, store, prompt_items["text"].tolist())


# ---------------------------------------------------------------------------------------------- curves

def lens_curves(table: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per language × layer: means of p_own, p_pivot, their difference (pivot − own), log10 of both ranks,
    entropy and the top-k script shares, each mean with a 95% bootstrap interval over pairs (`*_low`, `*_high`);
    `n_pairs`. Items whose answer sets are empty are left out of the probability means."""
    rng = np.random.default_rng(seed)
    rows = []
    table = table.assign(diff=table["p_pivot"] - table["p_own"], log10_rank_own=np.log10(table["rank_own"]),
                         log10_rank_pivot=np.log10(table["rank_pivot"]))
    for (language, layer), group in table.groupby(["language", "layer"], sort=True):
        per_pair = group.groupby("pair_id")[["p_own", "p_pivot", "diff", "log10_rank_own", "log10_rank_pivot",
                                             "entropy", "topk_own_script", "topk_latin"]].mean()
        row = {"language": language, "layer": layer, "relative_depth": group["relative_depth"].iloc[0],
               "n_pairs": len(per_pair)}
        for column in per_pair.columns:
            values = per_pair[column].dropna().to_numpy()
            low, high = paired_bootstrap(values, rng, n_boot) if len(values) else (np.nan, np.nan)
            row.update({column: values.mean() if len(values) else np.nan, f"{column}_low": low,
                        f"{column}_high": high})
        rows.append(row)
    return pd.DataFrame(rows).rename(columns={"diff": "pivot_minus_own", "diff_low": "pivot_minus_own_low",
                                              "diff_high": "pivot_minus_own_high"})


def lens_turns(curves: pd.DataFrame) -> pd.DataFrame:
    """Per language: the layers where the pivot answer is more probable than the own-language one (its
    interval above 0: `pivot_leads`, as a list; `own_leads` the reverse), the first and last of them, the
    largest lead (p_pivot − p_own) and its layer, the layer of the highest p_pivot and p_own, and the final
    layer's p_own and p_pivot. A lead can be tiny in absolute terms (both near 0 in early layers): read it
    with `max_lead` and the curves. A language where the pivot never leads
    has empty `pivot_leads`."""
    rows = []
    for language, group in curves.groupby("language", sort=True):
        group = group.sort_values("layer")
        if group["p_pivot"].isna().all():
            continue
        leads = group.loc[group["pivot_minus_own_low"] > 0, "layer"].astype(int).tolist()
        own_leads = group.loc[group["pivot_minus_own_high"] < 0, "layer"].astype(int).tolist()
        last = group.iloc[-1]
        rows.append({"language": language, "pivot_leads": ",".join(map(str, leads)),
                     "first_pivot_layer": leads[0] if leads else np.nan,
                     "last_pivot_layer": leads[-1] if leads else np.nan,
                     "own_leads": ",".join(map(str, own_leads)),
                     "max_lead_layer": int(group.loc[group["pivot_minus_own"].idxmax(), "layer"]),
                     "max_lead": group["pivot_minus_own"].max(),
                     "peak_pivot_layer": int(group.loc[group["p_pivot"].idxmax(), "layer"]),
                     "peak_p_pivot": group["p_pivot"].max(),
                     "peak_own_layer": int(group.loc[group["p_own"].idxmax(), "layer"]),
                     "peak_p_own": group["p_own"].max(), "final_p_own": last["p_own"],
                     "final_p_pivot": last["p_pivot"], "n_pairs": int(group["n_pairs"].max())})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------- join with compare

def pair_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per pair (meta orders averaged): the final layer's p_own, the highest p_pivot over layers and its
    layer, and whether the pivot answer led the own one at any layer (`pivot_led`)."""
    last = table["layer"].max()
    by_layer = table.groupby(["pair_id", "layer"])[["p_own", "p_pivot"]].mean().reset_index()
    by_layer["lead"] = by_layer["p_pivot"] > by_layer["p_own"]
    known = by_layer.dropna(subset=["p_pivot"])
    peak = known.loc[known.groupby("pair_id")["p_pivot"].idxmax()]
    out = by_layer[by_layer["layer"] == last][["pair_id", "p_own", "p_pivot"]].rename(
        columns={"p_own": "final_p_own", "p_pivot": "final_p_pivot"})
    out = out.merge(peak[["pair_id", "layer", "p_pivot"]].rename(columns={"layer": "peak_pivot_layer",
                                                                        "p_pivot": "peak_p_pivot"}),
                    on="pair_id", how="left")
    led = known[known["layer"] < last].groupby("pair_id")["lead"].any().rename("pivot_led")
    keys = table.drop_duplicates("pair_id")[["pair_id", "language", "subset"]]
    return keys.merge(out, on="pair_id").merge(led, on="pair_id", how="left")


def pair_correlations(pairs: pd.DataFrame) -> pd.DataFrame:
    """Across pairs: Pearson (point-biserial for 0/1) and Spearman correlations of the lens measures
    (final_p_own, peak_p_pivot, pivot_led) with each `*_correct` column of a joined `pairs` table;
    pivot-language pairs have no pivot measures and drop out of those."""
    from babelprobe.latent.outcomes import correlate

    rows = []
    for measure in ("final_p_own", "peak_p_pivot", "pivot_led"):
        for outcome in [c for c in pairs.columns if c.endswith("_correct")]:
            rows.append({"measure": measure, "outcome": outcome,
                         **correlate(pairs[measure].astype(float), pairs[outcome].astype(float))})
    return pd.DataFrame(rows)


def join_compare(pairs: pd.DataFrame, compare_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`pairs` (one row per pair) joined with a compare directory's per-pair correctness (items.csv:
    meta_correct, direct_correct, neuro_correct) and, per language, with meta/direct accuracy and the
    probe's peak layer and F1 (summary.csv, layers.csv). Returns (per pair, per language)."""
    from babelprobe.latent.outcomes import check_compare_dir, language_accuracy
    from babelprobe.tables import read_table

    joined = read_table(check_compare_dir(compare_dir) / "items.csv")
    correct = [c for c in joined.columns if c.endswith("_correct")]
    per_pair = pairs.merge(joined[["pair_id", *correct]], on="pair_id", how="left")
    return per_pair, language_accuracy(compare_dir)
