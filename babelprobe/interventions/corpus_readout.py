"""The corpus readout of an intervention (`--readouts ppl --corpus SOURCE`): each language's mean token
negative log-likelihood and perplexity on held-out corpus text, with an edit and without it, the
readout of Tang et al.'s language-neuron ablation and of Deng et al.'s SAE-feature ablation.

    rows = readout_rows(lm, corpus, settings)            # {language: [[BOS, t1, ...], ...]}
    table = corpus_nll(lm, rows)                         # language, nll, ppl, n_rows, n_tokens

Per row, the mean over its tokens t ≥ 1 of −log p(t | the row's tokens before it); per language the mean
over its rows; perplexity exp of that. This is the released `ppl.py` of Tang et al.
(RUCAIBox/Language-Specific-Neurons: per row `np.mean` of vLLM's prompt log-probs, the first token's
left out, then the mean over rows; it prints that mean log-likelihood negated) and Deng et al.'s
`compute_ce_loss` (`SAE/inference.py`: one text per forward pass, Hugging Face's mean token loss with the
first label masked, averaged over texts), for the rows each builds:

  - `--corpus-rows packed` (Tang et al.): the held-out text's token stream cut into rows of `--window`
    tokens, BOS first (`corpus.pack_rows`; ppl.py cuts rows of the model's context from its stream);
  - `--corpus-rows lines` (Deng et al.): each held-out line its own row, BOS first (their tokenizer
    call), cut to the model's context.

`--tokens N` caps each language's held-out tokens (ppl.py: 2^20). The edits are the source's
(`corpus_edits`): one language's neurons or SAE features at a time, and the controls. `corpus.csv` has
one row per edit × evaluated language: the edit's labels (`off`: the language edited, `direction`,
`draw`, ...), `language`, `nll`, `nll_base`, `delta_nll`, `ppl`, `ppl_base`, `delta_ppl`, `n_rows`,
`n_tokens`. The matrices drawn from it: Δ perplexity (`ppl_change`, Tang et al.'s figures) and Δ cross-
entropy (`ce_change`, Deng et al.'s), edited language × evaluated language.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import torch

from babelprobe.models import Encoding, LoadedModel, length_batches, pad_batch

COLUMNS = ("edit_source", "off", "direction", "draw", "language", "nll", "nll_base", "delta_nll", "ppl", "ppl_base",
           "delta_ppl", "n_rows", "n_tokens")


def readout_rows(lm: LoadedModel, corpus, settings) -> dict[str, list[list[int]]]:
    """{language: rows} of the corpus's held-out part, as `settings.corpus_rows` says (module docstring)."""
    from babelprobe.corpus import pack_rows, token_stream

    rows = {}
    for code, lines in sorted(corpus.heldout.items()):
        if settings.corpus_rows == "packed":
            rows[code] = pack_rows(lm, lines, settings.window, tokens=settings.tokens, keep_last=True)
            continue
        bos = [lm.bos_token_id] if lm.bos_token_id is not None else []
        out, left = [], settings.tokens
        for line in lines:
            ids = token_stream(lm.tokenizer, [line])[: lm.max_length - len(bos)]
            if left is not None:
                ids, left = ids[:left], left - len(ids[:left])
            if ids:
                out.append(bos + ids)
            if left == 0:
                break
        rows[code] = out
    return rows


def row_nll(lm: LoadedModel, rows: list[list[int]], batch_tokens: int = 4096) -> np.ndarray:
    """float64 [rows]: each row's mean −log p(t_i | t_<i) over its positions i ≥ 1 (module docstring)."""
    from babelprobe.benchmarks.core.logprobs import logprobs_of_states

    out = np.full(len(rows), np.nan)
    encodings = [Encoding(row, [(0, 0)] * len(row)) for row in rows]
    with torch.inference_mode():
        for batch in length_batches([len(r) for r in rows], batch_tokens):
            padded = pad_batch([encodings[i] for i in batch], lm.pad_token_id, "right", lm.device)
            hidden = lm.parts.body(**padded, use_cache=False).last_hidden_state  # after the final norm
            where = [(k, p) for k, i in enumerate(batch) for p in range(len(rows[i]) - 1)]
            if not where:
                continue
            k_index = torch.tensor([k for k, _ in where], device=hidden.device)
            p_index = torch.tensor([p for _, p in where], device=hidden.device)
            targets = [rows[batch[k]][p + 1] for k, p in where]
            logprobs = logprobs_of_states(lm, hidden[k_index, p_index], targets)
            counts = [len(rows[i]) - 1 for i in batch]
            for i, part in zip(batch, np.split(logprobs, np.cumsum(counts)[:-1])):
                out[i] = -float(np.mean(part)) if len(part) else np.nan
    return out


def corpus_nll(lm: LoadedModel, rows_by_language: dict[str, list[list[int]]], batch_tokens: int = 4096) -> pd.DataFrame:
    """language, nll (the mean of the rows' mean token NLL), ppl = exp(nll), n_rows, n_tokens (predicted)."""
    records = []
    for code, rows in rows_by_language.items():
        nll = row_nll(lm, rows, batch_tokens)
        kept = np.isfinite(nll)
        records.append({"language": code, "nll": float(np.mean(nll[kept])) if kept.any() else np.nan,
                        "n_rows": int(kept.sum()), "n_tokens": int(sum(len(r) - 1 for r in rows))})
    table = pd.DataFrame(records, columns=["language", "nll", "n_rows", "n_tokens"])
    table.insert(2, "ppl", np.exp(table["nll"]))
    return table


def corpus_table(lm: LoadedModel, source, rows_by_language: dict, batch_tokens: int = 4096,
                 progress: bool = False, memo=None) -> pd.DataFrame:
    """corpus.csv (module docstring): the baseline, then every edit of the source, on every language.
    `memo` (a `runs.JsonlMemo`), if given, keeps each edit's readout as it is made, so an interrupted
    readout resumes after the edits it finished."""
    from tqdm.auto import tqdm

    from babelprobe.runs import JsonlMemo

    memo = memo if memo is not None else JsonlMemo(None)

    def readout(key: str) -> pd.DataFrame:
        if key not in memo:  # Python's json writes floats exactly (repr): a resumed table equals a whole run's
            memo.add([(key, json.dumps(corpus_nll(lm, rows_by_language, batch_tokens).to_dict(orient="records")))])
        return pd.DataFrame.from_records(json.loads(memo[key])).set_index("language")

    base = readout("base")
    frames = []
    for labels, edit in tqdm(source.corpus_edits(lm), desc="corpus readout", unit="edit", disable=not progress):
        key = json.dumps(labels, sort_keys=True, default=str)
        if key in memo:
            after = readout(key)
        else:
            with edit:
                after = readout(key)
        frame = pd.DataFrame({"language": after.index, "nll": after["nll"].to_numpy(),
                              "nll_base": base.loc[after.index, "nll"].to_numpy(), "ppl": after["ppl"].to_numpy(),
                              "ppl_base": base.loc[after.index, "ppl"].to_numpy(),
                              "n_rows": after["n_rows"].to_numpy(), "n_tokens": after["n_tokens"].to_numpy()})
        frame["delta_nll"] = frame["nll"] - frame["nll_base"]
        frame["delta_ppl"] = frame["ppl"] - frame["ppl_base"]
        for name, value in reversed(list(labels.items())):
            frame.insert(0, name, value)
        frame.insert(0, "edit_source", source.name)
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    first = [c for c in COLUMNS if c in table.columns]
    return table[first + [c for c in table.columns if c not in first]]
