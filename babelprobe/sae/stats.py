"""The SAE's view of every token, summed per language inside the forward pass: how often and how strongly
each feature fires in each language, how well the SAE reconstructs, and which features are language
specific (monolinguality ν).

    stats = sae_stats(lm, items, sae)       # one pass over the items' texts
    stats.features(top=100)                  # layer, feature, language, mean_act, freq, nu, rank
    stats.fit()                              # layer, language, fvu, l0, l0_published, n_tokens

The states are read by the hf extraction backend's hooks at the SAE's layer (the output of block
`layer`, docs/design.md "Layers (numbering)"), and the forward pass stops there. Each token of a text
counts, except the BOS token (an attention sink whose state is unlike any text token's; Deng et al.
drop it too, `acts[0, 1:]`) and padding. Inside the hook, per language L, only sums are kept:

    n_L        tokens
    Σ f        feature activations            → mean_act μ_s^L = Σ f_s / n_L
    Σ 1[f>0]   firing counts                  → freq_s^L, and L0 = Σ_s freq_s^L (features firing per token)
    Σ ‖x−x̂‖²   squared reconstruction error
    Σ (x−c), Σ ‖x−c‖²   (c: a fixed shift, the first batch's mean, for a cancellation-free variance)
                                              → Σ ‖x − x̄_L‖² = Σ ‖x−c‖² − ‖Σ (x−c)‖² / n_L

so no token's code leaves the hook and memory does not grow with the number of tokens.
FVU_L = Σ ‖x−x̂‖² / Σ ‖x−x̄_L‖² (the fraction of the variance around the language's own mean state that
the SAE leaves unexplained). Monolinguality, as Deng et al.'s released code computes it
(Mongjin/multilingual-llm-features `SAE/latent_analysis.py`, `generate_top_index_magnitude`): μ over all
of language L's tokens, then ν_s^L = μ_s^L − mean_{L'≠L} μ_s^{L'}, features ranked by ν descending.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from babelprobe.errors import BabelprobeError
from babelprobe.models import LoadedModel, length_batches, on_device, pad_host, to_device
from babelprobe.sae.weights import SAE, check_fits

CHUNK_BYTES = 256 * 2**20  # working memory of one chunk of codes (pre-activations and codes, float32)


@dataclass
class SAEStats:
    """Per-language sums of one pass (module docstring); `languages` index the rows of every array."""

    layer: int
    languages: list[str]
    n_tokens: np.ndarray  # [G] int64
    sum_f: np.ndarray  # [G, d_sae] float64
    count: np.ndarray  # [G, d_sae] float64 (whole numbers)
    sq_error: np.ndarray  # [G]
    sum_x: np.ndarray  # [G, d] Σ (x − shift)
    sum_sq: np.ndarray  # [G] Σ ‖x − shift‖²
    info: dict = field(default_factory=dict)  # the SAE's description (l0_published, ...)
    last: np.ndarray | None = field(default=None, repr=False)  # [n_texts, d] each text's last-token state

    @property
    def mean_act(self) -> np.ndarray:
        """μ [G, d_sae]: mean activation of each feature over the language's tokens."""
        return self.sum_f / np.maximum(self.n_tokens, 1)[:, None]

    @property
    def freq(self) -> np.ndarray:
        """[G, d_sae]: share of the language's tokens on which each feature fires (f > 0)."""
        return self.count / np.maximum(self.n_tokens, 1)[:, None]

    def nu(self) -> np.ndarray:
        """ν [G, d_sae]: μ_s^L − mean over the other languages of μ_s^{L'} (Deng et al.)."""
        mu = self.mean_act
        if len(mu) < 2:
            raise BabelprobeError("monolinguality compares languages: the items have only one "
                                  f"({', '.join(self.languages)})")
        others = (mu.sum(0, keepdims=True) - mu) / (len(mu) - 1)
        return mu - others

    def ranks(self) -> np.ndarray:
        """[G, d_sae]: each feature's rank by ν within each language (1 = the most specific; ties by index)."""
        order = np.argsort(-self.nu(), axis=1, kind="stable")
        ranks = np.empty_like(order)
        np.put_along_axis(ranks, order, np.arange(1, order.shape[1] + 1)[None].repeat(len(order), 0), axis=1)
        return ranks

    def top_features(self, m: int) -> dict[str, np.ndarray]:
        """{language: its m features of highest ν, most specific first}."""
        order = np.argsort(-self.nu(), axis=1, kind="stable")[:, :m]
        return dict(zip(self.languages, order))

    def variance(self) -> np.ndarray:
        """Σ ‖x − x̄_L‖² per language."""
        n = np.maximum(self.n_tokens, 1)
        return self.sum_sq - (self.sum_x ** 2).sum(1) / n

    def features(self, top: int | None = 100) -> pd.DataFrame:
        """One row per feature × language for every feature among some language's `top` by ν (None or
        0: every feature): layer, feature, language, mean_act, freq, nu, rank (its rank in that language)."""
        nu, ranks = self.nu(), self.ranks()
        keep = np.arange(nu.shape[1]) if not top else np.flatnonzero((ranks <= top).any(0))
        G = len(self.languages)
        frame = pd.DataFrame({
            "layer": self.layer, "feature": np.tile(keep, G), "language": np.repeat(self.languages, len(keep)),
            "mean_act": self.mean_act[:, keep].ravel(), "freq": self.freq[:, keep].ravel(),
            "nu": nu[:, keep].ravel(), "rank": ranks[:, keep].ravel()})
        return frame.sort_values(["language", "rank"], ignore_index=True)

    def fit(self) -> pd.DataFrame:
        """One row per language and one for all tokens ("all"): layer, language, fvu, l0, l0_published, n_tokens."""
        rows = []
        published = self.info.get("l0_published")
        for i, language in enumerate(self.languages):
            rows.append(self._fit_row(language, self.n_tokens[i], self.sq_error[i], self.variance()[i],
                                      self.count[i].sum(), published))
        n = self.n_tokens.sum()
        pooled_variance = self.sum_sq.sum() - (self.sum_x.sum(0) ** 2).sum() / max(n, 1)
        rows.append(self._fit_row("all", n, self.sq_error.sum(), pooled_variance, self.count.sum(), published))
        return pd.DataFrame(rows)

    def save(self, path) -> None:
        """The sums as one .npz file (plain arrays, read back without pickle by `SAEStats.load`)."""
        from babelprobe.tables import atomic_path

        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, layer=self.layer, languages=np.array(self.languages, dtype=str), n_tokens=self.n_tokens,
                         sum_f=self.sum_f, count=self.count, sq_error=self.sq_error, sum_x=self.sum_x,
                         sum_sq=self.sum_sq, l0_published=np.nan if self.info.get("l0_published") is None
                         else float(self.info["l0_published"]))

    @classmethod
    def load(cls, path) -> SAEStats:
        with np.load(path, allow_pickle=False) as z:
            published = float(z["l0_published"])
            return cls(layer=int(z["layer"]), languages=[str(x) for x in z["languages"]],
                       **{k: z[k] for k in ("n_tokens", "sum_f", "count", "sq_error", "sum_x", "sum_sq")},
                       info={"l0_published": None if np.isnan(published) else published})

    def _fit_row(self, language, n, sq_error, variance, fired, published) -> dict:
        return {"layer": self.layer, "language": language, "fvu": sq_error / variance if variance > 0 else np.nan,
                "l0": fired / n if n else np.nan, "l0_published": np.nan if published is None else float(published),
                "n_tokens": int(n)}


# --------------------------------------------------------------------------------------------- the pass

def counted_tokens(attention_mask: torch.Tensor, exclude_bos: bool) -> np.ndarray:
    """[rows, width] bool: the real tokens of a host batch, each text's first left out when it is BOS."""
    mask = attention_mask.numpy().astype(bool)
    if exclude_bos:
        mask[np.arange(len(mask)), mask.argmax(axis=1)] = False
    return mask


class StatsAccumulator:
    """Receives one layer's hidden states per batch from an extraction backend (`add`, the `Pooler`
    interface) and adds the SAE's per-language sums; `begin` is called before each batch with its host tensors.

    The batch's positions that count, their languages and the token counts come from the host's padded batch,
    so a batch reads back from the device only what the host cannot know: the codes' non-zeros, once per chunk
    (their number sizes the reconstruction, which gathers only the decoder rows of the features that fired). The
    sums stay on the device until `result`, and the last-token states leave it a block of texts at a time
    (`HostRows`). On a GPU each read makes the host wait for the pass that made it."""

    def __init__(self, sae: SAE, n_groups: int, d_model: int, device: torch.device, n_texts: int = 0):
        self.sae = sae
        self.device = device
        self.d_sae = d_sae = sae.d_sae
        rescaled = sae.architecture == "topk" and sae.rescale_acts_by_decoder_norm
        self.decoder = sae.W_dec / sae.decoder_norms()[:, None] if rescaled else sae.W_dec  # x̂ = f·decoder + b_dec
        self.chunk = max(1, CHUNK_BYTES // (3 * 4 * d_sae))
        # float32 sums of one batch, folded into the float64 totals after it (exact enough for ≤ a batch); the totals
        # stay on the device until `result`
        self.batch_f = torch.zeros(n_groups, d_sae, device=device)
        self.batch_count = torch.zeros(n_groups, d_sae, device=device)
        self.sum_f = torch.zeros(n_groups, d_sae, dtype=torch.float64, device=device)
        self.count = torch.zeros(n_groups, d_sae, dtype=torch.float64, device=device)
        self.sq_error = torch.zeros(n_groups, dtype=torch.float64, device=device)
        self.sum_x = torch.zeros(n_groups, d_model, dtype=torch.float64, device=device)
        self.sum_sq = torch.zeros(n_groups, dtype=torch.float64, device=device)
        self.n_tokens = np.zeros(n_groups, dtype=np.int64)  # counted on the host
        self.shift: torch.Tensor | None = None
        self.last = HostRows(n_texts, d_model)  # each text's last-token state
        self.positions = self.groups = self.rows = self.last_index = None

    def begin(self, attention_mask: torch.Tensor, groups: torch.Tensor, exclude_bos: bool, rows=None) -> None:
        """The batch's host tensors: its attention mask (real tokens count, each text's first left out when it is
        BOS: a text of BOS alone adds nothing, as Deng et al. skip it) and the language group of each row; `rows`:
        where its texts' last-token states go."""
        self.rows = rows
        width = attention_mask.shape[1]
        last_index = width - 1 - attention_mask.numpy()[:, ::-1].argmax(axis=1)
        positions = np.flatnonzero(counted_tokens(attention_mask, exclude_bos))  # into the [rows × width] states
        groups = groups.numpy()[positions // width]
        self.n_tokens += np.bincount(groups, minlength=len(self.n_tokens))
        self.positions, self.groups, self.last_index = (on_device(torch.from_numpy(values), self.device)
                                                        for values in (positions, groups, last_index))

    def add(self, column: int, hidden: torch.Tensor) -> None:
        if self.rows is not None:
            batch = torch.arange(len(hidden), device=hidden.device)
            self.last.put(self.rows, hidden[batch, self.last_index.to(hidden.device)])
        x = hidden.reshape(-1, hidden.shape[-1]).index_select(0, self.positions.to(hidden.device)).to(torch.float32)
        groups = self.groups.to(hidden.device)
        if self.shift is None:
            self.shift = x.double().mean(0) if len(x) else torch.zeros(x.shape[1], dtype=torch.float64)
        flat_f, flat_count = self.batch_f.view(-1), self.batch_count.view(-1)
        for start in range(0, len(x), self.chunk):
            xc, gc = x[start:start + self.chunk], groups[start:start + self.chunk]
            # the codes are sparse: their non-zeros feed every sum, and the reconstruction gathers only
            # the decoder rows of the features that fired (the same sums as the dense product f W_dec)
            f = self.sae.encode(xc)
            rows, cols = f.nonzero(as_tuple=True)  # the chunk's one read back
            values = f[rows, cols]
            del f
            cell = gc[rows] * self.d_sae + cols
            flat_f.index_add_(0, cell, values)
            flat_count.index_add_(0, cell, torch.ones_like(values))
            recon = torch.zeros_like(xc)
            # the gathered decoder rows are [non-zeros, d_in]: a block of non-zeros at a time keeps them within
            # CHUNK_BYTES however many features fire (an SAE far from its training data fires hundreds per token)
            step = max(1, CHUNK_BYTES // (4 * self.decoder.shape[1]))
            for at in range(0, len(values), step):
                r, c, v = rows[at:at + step], cols[at:at + step], values[at:at + step]
                recon.index_add_(0, r, v[:, None] * self.decoder.index_select(0, c))
            error = (xc - recon - self.sae.b_dec).double().square().sum(1)
            self.sq_error.index_add_(0, gc, error)
        centred = x.double() - self.shift.to(x.device)
        self.sum_x.index_add_(0, groups, centred)
        self.sum_sq.index_add_(0, groups, centred.square().sum(1))
        self.sum_f += self.batch_f.double().to(self.sum_f.device)
        self.count += self.batch_count.double().to(self.count.device)
        self.batch_f.zero_()
        self.batch_count.zero_()

    def result(self, layer: int, languages: list[str], info: dict) -> SAEStats:
        last = self.last.result()
        sums = {name: getattr(self, name).cpu().numpy() for name in ("sum_f", "count", "sq_error", "sum_x", "sum_sq")}
        return SAEStats(layer=layer, languages=languages, n_tokens=self.n_tokens.copy(), info=info, last=last, **sums)


class HostRows:
    """Rows [n, d] made on a device in any order (`put(rows, values)`), gathered into a float32 host array: they wait
    on the device in the order they came and are copied off it a block of BLOCK_BYTES at a time (one wait for the
    device per block, not per batch)."""

    BLOCK_BYTES = 256 * 2**20

    def __init__(self, n: int, d: int):
        self.out = np.zeros((n, d), dtype=np.float32)
        self.capacity = min(n, max(1, self.BLOCK_BYTES // (4 * max(d, 1))))
        self.block: torch.Tensor | None = None
        self.rows: list[np.ndarray] = []  # the host rows of what waits in the block, in its order
        self.filled = 0

    def put(self, rows, values: torch.Tensor) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        if self.block is None or self.filled + len(rows) > len(self.block):
            self.flush()
            size = max(self.capacity, len(rows))
            if self.block is None or len(self.block) < size:
                self.block = torch.empty((size, self.out.shape[1]), dtype=torch.float32, device=values.device)
        self.block[self.filled:self.filled + len(rows)] = values
        self.rows.append(rows)
        self.filled += len(rows)

    def flush(self) -> None:
        if self.filled:
            self.out[np.concatenate(self.rows)] = self.block[:self.filled].cpu().numpy()
        self.rows, self.filled = [], 0

    def result(self) -> np.ndarray:
        self.flush()
        return self.out


def sae_stats(lm: LoadedModel, items: pd.DataFrame, sae: SAE, *, batch_tokens: int = 4096,
              progress: bool = False) -> SAEStats:
    """One forward pass over the items' texts to the SAE's layer, keeping the per-language sums of the
    module docstring (items: a DataFrame with `text` and `language`, e.g. `load_items(...)`) and each
    text's last-token state there (`SAEStats.last`, in item order: what `extract --pool last` stores)."""
    check_fits(sae, lm.d_model, lm.n_layers)
    if items is None or len(items) == 0:
        raise BabelprobeError("no items to run the SAE on")
    languages = sorted(items["language"].astype(str).unique())
    group_of = {language: i for i, language in enumerate(languages)}
    groups = torch.tensor(items["language"].astype(str).map(group_of).to_numpy(np.int64))
    encodings = lm.encode(items["text"].tolist(), names=items["item_id"].tolist() if "item_id" in items else None)
    return stats_pass(lm, sae, encodings, groups, languages, batch_tokens, progress)


def stats_pass(lm: LoadedModel, sae: SAE, encodings: list, groups: torch.Tensor, languages: list[str],
               batch_tokens: int, progress: bool = False) -> SAEStats:
    """The pass of `sae_stats` over encoded texts (`groups`: each text's index in `languages`), in batches of
    similar lengths, right-padded on the host."""
    from babelprobe.extract.backends import make_backend

    sae = sae.to(lm.device)
    acc = StatsAccumulator(sae, len(languages), lm.d_model, lm.device, n_texts=len(encodings))
    batches = length_batches([len(e.ids) for e in encodings], batch_tokens)
    with make_backend("hf", lm, [sae.layer]) as backend, torch.inference_mode():
        for batch in tqdm(batches, desc="sae stats", unit="batch", disable=not progress):
            padded = pad_host([encodings[i] for i in batch], lm.pad_token_id, "right")
            acc.begin(padded["attention_mask"], groups[batch], lm.bos_policy == "bos", rows=batch)
            backend.run(to_device(padded, lm.device), acc)
    return acc.result(sae.layer, languages, sae.describe())
