"""Read and write tidy result tables (CSV, Parquet, JSONL, JSON by extension), atomically.

Every result file babelprobe writes goes through `write_table`: it writes to a temporary file in the
same directory and renames it into place, so a crash never leaves a half-written table under its
final name and an earlier result stays intact until the new one is complete. A long run's CSV can also be
joined from lines its chunks made as they finished (`csv_rows`, `write_csv_rows`): the same bytes, written the
same way.

A list-valued field (say COMPS-WUGS's `nonsense_words`) is written to CSV as a JSON list
(`["wug", "fep"]`), not as Python's or numpy's repr, and `read_table` turns such a column back into
lists (`decode_json_lists`); JSON and Parquet keep lists as they are.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from babelprobe.errors import BabelprobeError

FORMATS = (".csv", ".parquet", ".jsonl", ".json")


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path next to `path`; on success fsync it and rename it to `path`."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results should be as readable as any file
    except OSError as err:
        raise BabelprobeError(f"cannot write {path}: {err.strerror}{io_hint(err)}") from err
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        raise BabelprobeError(f"cannot write {path}: {err.strerror}{io_hint(err)}") from err
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def io_hint(err: OSError) -> str:
    """What to do about a failed write, for the end of a one-line error."""
    if err.errno == errno.ENOSPC:
        return "; free some space and run the same command again (finished parts are kept)"
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "; choose a writable output location"
    return ""


def check_output(path: str | Path, formats: tuple[str, ...] = FORMATS) -> Path:
    """Fail before the work, not after it: `path` has a known table format and its directory exists or can
    be created, and is writable."""
    path = Path(path)
    if formats and path.suffix not in formats:
        raise BabelprobeError(f"{path}: unknown table format {path.suffix!r}; use {', '.join(formats)}")
    if path.is_dir():
        raise BabelprobeError(f"{path} is a directory; give a file name like {path / ('results' + formats[0])}")
    check_writable_dir(path.parent)
    return path


def check_out_dir(out: str | Path) -> Path:
    """`out` as a Path: an output directory, which may not exist yet but must not be a file."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BabelprobeError(f"--out {out} exists and is not a directory")
    return out


def check_writable_dir(directory: str | Path) -> None:
    """`directory`, or the nearest existing folder it would be created in, is a writable folder."""
    directory = Path(directory).absolute()
    existing = next(p for p in (directory, *directory.parents) if p.exists())
    if not existing.is_dir():
        raise BabelprobeError(f"cannot write into {directory}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise BabelprobeError(f"cannot write into {directory}: {existing} is not writable; "
                              "choose a writable output location")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_table(frame: pd.DataFrame, path: str | Path) -> Path:
    path = Path(path)
    if path.suffix not in FORMATS:
        raise BabelprobeError(f"{path}: unknown table format {path.suffix!r}; use {', '.join(FORMATS)}")
    with atomic_path(path) as tmp:
        if path.suffix == ".csv":
            encode_json_lists(frame).to_csv(tmp, index=False)
        elif path.suffix == ".parquet":
            frame.to_parquet(tmp, index=False)
        elif path.suffix == ".jsonl":
            frame.to_json(tmp, orient="records", lines=True, force_ascii=False)
        else:
            frame.to_json(tmp, orient="records", force_ascii=False, indent=1)
    return path


# A table's CSV made in pieces: each chunk of a long run formats its own rows while the device runs the next one,
# and the file is then joined from them, not formatted after the device's last pass (a whole XCOMPS meta table:
# 248k rows, 170 MB, 4.9 s of pandas' writer). Rows are cut at a record separator before the line end, so a cell
# holding a line break stays in its row; a cell holding the separator itself leaves the table to `write_table`.
ROW_END = "\x1e\n"
# Rows per call of pandas' CSV writer in `csv_rows`: each call holds the GIL, and the thread that drives the device
# waits beside it (a meta chunk of 4,000 rows at pandas' default of 100,000 cells a call: up to ~100 ms at a time,
# at 128 rows ~5-10 ms; the same bytes, the same total time).
CSV_PIECE_ROWS = 128


@dataclass(frozen=True)
class CsvRows:
    """A table's rows as CSV lines (UTF-8, without their line ends), and the columns and dtypes they were made
    with."""

    columns: tuple
    dtypes: tuple
    lines: list[bytes]


def csv_rows(frame: pd.DataFrame) -> CsvRows | None:
    """Each row of `frame` as `write_table` writes it to CSV, or None where they cannot be made row by row: a
    column whose cells' text depends on the others (dates, categories: pandas formats those per column) or a
    cell holding `ROW_END`'s separator."""
    if not all(_formats_per_cell(dtype) for dtype in frame.dtypes):
        return None
    text = encode_json_lists(frame).to_csv(index=False, header=False, lineterminator=ROW_END,
                                           chunksize=CSV_PIECE_ROWS)
    if text.count(ROW_END[0]) != len(frame):
        return None
    return CsvRows(tuple(frame.columns), tuple(frame.dtypes), text.encode("utf-8").split(ROW_END.encode())[:-1])


def write_csv_rows(frame: pd.DataFrame, pieces: list[CsvRows | None], order: np.ndarray | None,
                   path: str | Path) -> Path:
    """`frame`, which is the concatenation of the tables `pieces` were made from, its rows then taken in `order`
    (None: as they are), written to CSV as `write_table` would write it, by joining the pieces' lines; by
    `write_table` where a piece is missing or its columns or dtypes are not the whole table's (a column's cells
    then read otherwise, e.g. integers as floats)."""
    like = (tuple(frame.columns), tuple(frame.dtypes))
    if Path(path).suffix != ".csv" or any(p is None or (p.columns, p.dtypes) != like for p in pieces):
        return write_table(frame, path)
    lines = [line for piece in pieces for line in piece.lines]
    if len(lines) != len(frame):
        return write_table(frame, path)
    if order is not None:
        lines = [lines[i] for i in order]
    end = os.linesep  # pandas' line end, as `write_table` writes it
    header = frame.iloc[:0].to_csv(index=False, lineterminator=end).encode("utf-8")
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(header)
        if lines:
            f.write(end.encode().join(lines))
            f.write(end.encode())
    return Path(path)


def _formats_per_cell(dtype) -> bool:
    """Whether pandas writes each cell of a column of `dtype` to CSV from that cell alone."""
    if isinstance(dtype, (pd.CategoricalDtype, pd.SparseDtype)):
        return False
    return pd.api.types.is_string_dtype(dtype) or getattr(dtype, "kind", None) in ("O", "b", "i", "u", "f")


def read_text(path: str | Path) -> str:
    """The UTF-8 text of a file a user gave; a one-line error naming it when it cannot be read."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise BabelprobeError(f"{path}: not UTF-8 text (byte {err.start}); re-save it as UTF-8") from err
    except OSError as err:
        raise BabelprobeError(f"{path}: cannot read ({err.strerror})") from err


def read_table(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise BabelprobeError(f"result table {path} does not exist")
    if path.suffix == ".csv":
        return decode_json_lists(read_csv(path, keep_default_na=False, na_values=[""]))
    if path.suffix not in FORMATS:
        raise BabelprobeError(f"{path}: unknown table format {path.suffix!r}; use {', '.join(FORMATS)}")
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        return pd.read_json(path, orient="records", lines=path.suffix == ".jsonl")
    except (ValueError, OSError) as err:  # pyarrow's and pandas' parse errors are ValueErrors
        raise BabelprobeError(f"{path}: not a readable {path.suffix[1:]} table ({_first_line(err)})") from err


def read_csv(path: str | Path, **options) -> pd.DataFrame:
    """`pd.read_csv`, with an empty or malformed file as a one-line error naming it (not pandas' traceback)."""
    try:
        return pd.read_csv(path, **options)
    except pd.errors.EmptyDataError:
        raise BabelprobeError(f"{path}: the file is empty; it needs a header line and rows") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise BabelprobeError(f"{path}: not a readable table ({_first_line(err)})") from err


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


# ---------------------------------------------------------------------------------- list-valued cells

CONTAINERS = (list, tuple, dict, np.ndarray)


def encode_json_lists(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with every list, tuple, dict or array cell as JSON text (for CSV); other cells unchanged."""
    columns = [c for c in frame.columns if frame[c].dtype == object
               and frame[c].map(lambda v: isinstance(v, CONTAINERS)).any()]
    if not columns:
        return frame
    frame = frame.copy()
    for column in columns:
        frame[column] = frame[column].map(lambda v: json.dumps(_plain(v), ensure_ascii=False)
                                          if isinstance(v, CONTAINERS) else v)
    return frame


def decode_json_lists(frame: pd.DataFrame, keep: tuple[str, ...] = ()) -> pd.DataFrame:
    """`frame` with each text column whose every non-empty cell is a JSON list turned into lists (the
    CSV form `encode_json_lists` writes). Columns in `keep` stay text; anything else (numpy's old
    `['wug' 'fep']` form included) is left as it is."""
    for column in frame.columns:
        if column in keep or not pd.api.types.is_string_dtype(frame[column]):  # object or str columns
            continue
        cells = frame[column].dropna()
        cells = cells[cells != ""]
        if cells.empty or not cells.map(lambda v: isinstance(v, str) and v.startswith("[") and v.endswith("]")).all():
            continue
        try:
            decoded = dict(zip(cells.index, cells.map(json.loads)))
        except ValueError:
            continue
        if all(isinstance(v, list) for v in decoded.values()):
            frame = frame.copy()
            frame[column] = pd.Series([decoded.get(i, v) for i, v in frame[column].items()], index=frame.index,
                                      dtype=object)
    return frame


def _plain(value):
    """A JSON-serialisable copy of a cell: arrays and numpy scalars become lists and Python numbers."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    return value
