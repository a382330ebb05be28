"""`babelprobe sae fetch`: copy one published SAE folder from the Hugging Face hub, so that `--sae DIR`
reads it offline afterwards.

A release and SAE id name the folder as SAELens' registry does (`sae_lens/pretrained_saes.yaml`):
`--release gemma-scope-2-270m-pt-res --sae-id layer_12_width_16k_l0_medium` is the folder
`resid_post/layer_12_width_16k_l0_medium` of the hub repository `google/gemma-scope-2-270m-pt`. With
`sae_lens` installed its registry resolves every release (and gives the entry's published L0);
without it, Gemma Scope 2 residual releases (`gemma-scope-2-{size}-{pt|it}-res`, folder
`resid_post/ID`, and `-res-all`, folder `resid_post_all/ID`) are resolved by that rule, and
`--release ORG/REPO --sae-id FOLDER` names any repository's folder directly.

The folder is downloaded into a temporary folder beside OUT, checked (`load_sae`) and renamed to OUT,
with `babelprobe_sae.json` recording where it came from; an unreachable hub writes nothing.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from babelprobe.errors import BabelprobeError

OFFLINE = "cannot reach huggingface.co; fetch the folder elsewhere, pass --sae DIR"
GEMMA_SCOPE_2 = re.compile(r"^gemma-scope-2-(?P<model>[\w.]+)-(?P<variant>pt|it)-(?P<kind>res|res-all)$")
GEMMA_SCOPE_2_FOLDERS = {"res": "resid_post", "res-all": "resid_post_all"}


def resolve(release: str, sae_id: str) -> dict:
    """{repo_id, folder, l0_published} of a release's SAE (module docstring)."""
    registry = _registry_entry(release, sae_id)
    if registry is not None:
        return registry
    match = GEMMA_SCOPE_2.match(release)
    if match:
        return {"repo_id": f"google/gemma-scope-2-{match['model']}-{match['variant']}",
                "folder": f"{GEMMA_SCOPE_2_FOLDERS[match['kind']]}/{sae_id}", "l0_published": None}
    if re.match(r"^[\w.-]+/[\w.-]+$", release):
        return {"repo_id": release, "folder": sae_id.strip("/"), "l0_published": None}
    raise BabelprobeError(f"unknown --release {release!r}: without sae_lens installed, babelprobe knows the Gemma Scope "
                          "2 residual releases (gemma-scope-2-270m-pt-res, ...-res-all); or pass --release ORG/REPO "
                          "--sae-id FOLDER")


def _registry_entry(release: str, sae_id: str) -> dict | None:
    """The entry of SAELens' registry, when sae_lens is installed and knows the release."""
    try:
        from sae_lens.loading.pretrained_saes_directory import get_pretrained_saes_directory
    except ImportError:
        return None
    lookup = get_pretrained_saes_directory().get(release)
    if lookup is None:
        return None
    if sae_id not in lookup.saes_map:
        raise BabelprobeError(f"--sae-id {sae_id!r} is not in release {release} (sae_lens registry); e.g. "
                              f"{', '.join(list(lookup.saes_map)[:3])}")
    l0 = (getattr(lookup, "expected_l0", None) or {}).get(sae_id)
    return {"repo_id": lookup.repo_id, "folder": lookup.saes_map[sae_id], "l0_published": l0}


def fetch_sae(release: str, sae_id: str, out: str | Path, *, revision: str | None = None,
              overwrite: bool = False) -> Path:
    """Download the SAE folder named by `release` and `sae_id` into `out` (module docstring)."""
    from babelprobe.sae.weights import load_sae
    from babelprobe.tables import atomic_path, check_writable_dir

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise BabelprobeError(f"--out {out} already exists and is not empty; choose another --out or pass --overwrite")
    check_writable_dir(out.parent)
    where = resolve(release, sae_id)
    tmp = out.parent / f".{out.name}.fetching"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _download(where["repo_id"], where["folder"], tmp, revision)
        folder = tmp / where["folder"]
        if not folder.is_dir() or not any(folder.iterdir()):
            raise BabelprobeError(f"{where['repo_id']} has no folder {where['folder']!r}; check --sae-id")
        with atomic_path(folder / "babelprobe_sae.json") as file:
            file.write_text(json.dumps({"release": release, "sae_id": sae_id, "revision": revision, **where},
                                       indent=1), encoding="utf-8")
        load_sae(folder)  # a folder babelprobe can read, or a one-line error before it lands under OUT
        if out.exists():
            shutil.rmtree(out)
        folder.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _download(repo_id: str, folder: str, into: Path, revision: str | None) -> None:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            OfflineModeIsEnabled,
            RepositoryNotFoundError,
        )
    except ImportError as err:  # pragma: no cover - a dependency of transformers
        raise BabelprobeError("sae fetch needs huggingface_hub (pip install huggingface_hub)") from err
    try:
        snapshot_download(repo_id, revision=revision, allow_patterns=[f"{folder}/*"], local_dir=str(into))
    except GatedRepoError as err:
        raise BabelprobeError(f"huggingface.co refuses {repo_id} without a login: accept its licence on the hub, run "
                              "`hf auth login`, and fetch again") from err
    except RepositoryNotFoundError as err:
        raise BabelprobeError(f"no repository {repo_id} on huggingface.co (or it is private); check --release") from err
    except (OfflineModeIsEnabled, LocalEntryNotFoundError, ConnectionError, TimeoutError, OSError) as err:
        raise BabelprobeError(OFFLINE) from err
    except HfHubHTTPError as err:
        raise BabelprobeError(f"huggingface.co answered {str(err).splitlines()[0]}") from err
    except Exception as err:  # httpx/requests transport errors when no network is there at all
        if "connect" in type(err).__name__.lower() or "timeout" in type(err).__name__.lower():
            raise BabelprobeError(OFFLINE) from err
        raise
