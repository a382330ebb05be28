"""The activation store: format (plain h5py), dtypes, bounded reads, verify, and bad input."""

import json
import tracemalloc

import h5py
import numpy as np
import pandas as pd
import pytest
import torch

from babelprobe.errors import BabelprobeError
from babelprobe.extract import open_store, verify_store, write_store
from babelprobe.extract.store import CHUNK_BYTES, StoreWriter, check_value_rows, first_rows, sha256_of


def make_keys(n, language="en"):
    return pd.DataFrame({"item_id": [f"{language}-{i}" for i in range(n)], "pair_id": [f"p{i // 2}" for i in range(n)],
                         "language": language, "subset": ["taxonomic", "random"] * (n // 2) + ["x"] * (n % 2),
                         "label": [1, 0] * (n // 2) + [1] * (n % 2), "n_tokens": np.arange(n) % 7 + 2})


def activations(n, layers=4, d=16, scale=1.0, seed=0):
    return (np.random.default_rng(seed).normal(size=(n, layers, d)) * scale).astype(np.float32)


def test_round_trip_float32_is_exact_across_shards_in_any_row_order(tmp_path):
    keys, last, mean = make_keys(50), activations(50), activations(50, seed=1)
    write_store(tmp_path / "s", keys, last, mean, layers=[0, 3, 6, 9], shard_size=7)
    store = open_store(tmp_path / "s")
    assert store.layers == [0, 3, 6, 9] and store.pools == ("last", "mean") and store.d_model == 16
    assert len(store) == 50 and len(list((tmp_path / "s").glob("shard-*.h5"))) == 8
    rows = [49, 0, 13, 13, 7, 6]
    np.testing.assert_array_equal(store.read(6, rows), last[rows, 2])
    np.testing.assert_array_equal(store.read(9, pool="mean"), mean[:, 3])
    np.testing.assert_array_equal(store.read_layers(rows=rows, pool="mean"), mean[rows])
    np.testing.assert_array_equal(store.read_layers([9, 0], rows=np.array(rows)), last[rows][:, [3, 0]])
    assert store.read(0, []).shape == (0, 16)
    pd.testing.assert_frame_equal(store.keys[["item_id", "pair_id", "language", "subset"]],
                                  keys[["item_id", "pair_id", "language", "subset"]].astype(store.keys["item_id"].dtype),
                                  check_dtype=False)
    assert store.keys["label"].dtype == np.int8 and store.keys["n_tokens"].dtype == np.int32
    assert store.keys["n_tokens"].tolist() == keys["n_tokens"].tolist()
    assert verify_store(tmp_path / "s") == []


@pytest.mark.parametrize("dtype, torch_dtype", [("float16", torch.float16), ("bfloat16", torch.bfloat16)])
def test_half_dtypes_decode_like_torch_rounding(tmp_path, dtype, torch_dtype):
    keys, last = make_keys(20), activations(20, scale=300.0)
    write_store(tmp_path / "s", keys, last, dtype=dtype)
    expected = torch.from_numpy(last).to(torch_dtype).float().numpy()  # independent reference
    np.testing.assert_array_equal(open_store(tmp_path / "s").read_layers(), expected)
    with h5py.File(tmp_path / "s" / "shard-00000.h5") as f:
        assert f["last"].attrs["dtype"] == dtype
        assert f["last"].dtype == (np.uint16 if dtype == "bfloat16" else np.float16)


@pytest.mark.parametrize("n", [410, 1228])
def test_a_shard_takes_about_its_values_bytes_on_disk(tmp_path, n):
    """A shard's rows are split evenly into chunks of at most `CHUNK_BYTES` (409 float32 rows at 640): HDF5 keeps
    a last chunk whole on disk, so 410 rows in chunks of 409 took twice their bytes, 1,228 rows 1.33 times."""
    d = 640
    values = activations(n, layers=2, d=d)
    write_store(tmp_path / "s", make_keys(n), values, layers=[0, 1], shard_size=n)
    shard = tmp_path / "s" / "shard-00000.h5"
    with h5py.File(shard) as f:
        rows = f["last"].chunks[0]
    chunks = -(-n // rows)
    assert rows * d * 4 <= CHUNK_BYTES and chunks * rows - n < chunks  # less than a row to spare per chunk
    assert shard.stat().st_size < 1.1 * values.nbytes  # the rest: the keys (~200 bytes a row) and HDF5's own
    np.testing.assert_array_equal(open_store(tmp_path / "s").read_layers(), values)


def test_shard_is_readable_with_plain_h5py_and_chunked_by_layer(tmp_path):
    n, d = 3000, 640
    keys = make_keys(n)
    write_store(tmp_path / "s", keys, activations(n, layers=3, d=d), layers=[0, 1, 2], shard_size=n,
                provenance={"model": {"name": "m", "fingerprint": "abc"}, "items": {"source": "x", "hash": "h"}})
    with h5py.File(tmp_path / "s" / "shard-00000.h5") as f:
        assert f["last"].shape == (n, 3, d)
        rows, one_layer, width = f["last"].chunks
        assert one_layer == 1 and width == d and rows * d * 4 <= CHUNK_BYTES and rows * d * 4 > CHUNK_BYTES // 2
        assert f["item_id"].asstr()[0] == "en-0" and f["label"].dtype == np.int8 and f["n_tokens"].dtype == np.int32
        assert list(f["last"].attrs["layers"]) == [0, 1, 2]
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["complete"] and manifest["model"]["fingerprint"] == "abc" and manifest["shards"][0]["sha256"]["last"]
    store = open_store(tmp_path / "s")
    assert store.fingerprint == "abc" and store.items_hash == "h" and store.n_layers == 2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reads_of_consecutive_and_scattered_rows_across_chunks_and_shards(tmp_path, dtype):
    n, d = 700, 2048  # 128 float32 rows (256 bfloat16 rows) per chunk; two shards
    last = activations(n, layers=3, d=d, scale=50.0)
    write_store(tmp_path / "s", make_keys(n), last, dtype=dtype, shard_size=400)
    expected = torch.from_numpy(last).to(torch.bfloat16).float().numpy() if dtype == "bfloat16" else last
    store = open_store(tmp_path / "s")
    for rows in (np.arange(100, 650), np.arange(650, 100, -1), np.r_[5:300, 3, 399:401, 690:700]):
        for layers in ([0, 1, 2], [1, 2], [2, 0]):
            np.testing.assert_array_equal(store.read_layers(layers, rows=rows), expected[rows][:, layers])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_reads_to_a_device_decode_there_to_the_same_values(tmp_path, dtype):
    """A read with `device` (the probe phase on a GPU: stored bits copied, decoded by torch there) gives the
    host read's values bit for bit, consecutive and scattered rows, one shard or two, any layer order."""
    n, d = 700, 2048
    last = activations(n, layers=3, d=d, scale=5.0)
    write_store(tmp_path / "s", make_keys(n), last, dtype=dtype, shard_size=400)
    store = open_store(tmp_path / "s")
    for rows in (np.arange(100, 650), np.r_[5:300, 3, 399:401, 690:700]):
        for layers in ([0, 1, 2], [2, 0]):
            on_device = store.read_layers(layers, rows=rows, device=torch.device("cpu"))
            assert isinstance(on_device, torch.Tensor) and on_device.dtype == torch.float32
            np.testing.assert_array_equal(on_device.numpy(), store.read_layers(layers, rows=rows))


def test_reads_on_several_threads_at_once_each_get_their_own_rows(tmp_path):
    """Each reading thread decodes from its own reused buffer (the probe phase reads groups on several threads):
    reads of different rows at the same time give what each gives alone."""
    from concurrent.futures import ThreadPoolExecutor

    n, d = 600, 512
    last = activations(n, layers=3, d=d, scale=5.0)
    write_store(tmp_path / "s", make_keys(n), last, dtype="bfloat16", shard_size=300)
    expected = torch.from_numpy(last).to(torch.bfloat16).float().numpy()
    store = open_store(tmp_path / "s")
    groups = [np.arange(a, a + 50) for a in range(0, n, 50)] * 4
    device = torch.device("cpu")
    with ThreadPoolExecutor(4) as pool:
        reads = list(pool.map(lambda rows: (store.read_layers([0, 1, 2], rows=rows),
                                            store.read_layers([1, 2], rows=rows, device=device)), groups))
    for rows, (host, on_device) in zip(groups, reads):
        np.testing.assert_array_equal(host, expected[rows])
        np.testing.assert_array_equal(on_device.numpy(), expected[rows][:, 1:])


def test_a_device_read_refuses_nan_naming_the_item(tmp_path):
    """The check of a read to a device runs there; a NaN is named by layer and item as on the host."""
    from babelprobe.probes.source import read_checked

    keys, last = make_keys(40), activations(40, layers=3, d=16)
    write_store(tmp_path / "s", keys, last, dtype="bfloat16", shard_size=400)
    store, rows = open_store(tmp_path / "s"), np.arange(40)

    class Rotten:  # the store's values with one NaN, as a shard edited behind its checksum would give
        keys = store.keys

        def read_layers(self, layers, rows, pool, device=None):
            X = store.read_layers(layers, rows=rows, pool=pool, device=device)
            X[7, 2, 5] = float("nan")
            return X

    with pytest.raises(BabelprobeError, match=rf"layer 2 are NaN or inf for item '{keys['item_id'][7]}'"):
        read_checked(Rotten(), rows, [0, 1, 2], "last", "g", device=torch.device("cpu"))
    fine = read_checked(store, rows, [0, 1, 2], "last", "g", device=torch.device("cpu"))
    np.testing.assert_array_equal(fine.numpy(), store.read_layers([0, 1, 2], rows=rows))


def test_compression_round_trip(tmp_path):
    keys, last = make_keys(30), activations(30)
    for method in ("lzf", "gzip"):
        write_store(tmp_path / method, keys, last, compression=method, shard_size=11)
        np.testing.assert_array_equal(open_store(tmp_path / method).read_layers(), last)
        with h5py.File(tmp_path / method / "shard-00000.h5") as f:
            assert f["last"].compression == method
        assert verify_store(tmp_path / method) == []


def test_read_memory_is_bounded_by_the_request(tmp_path):
    n, layers, d = 8000, 8, 256  # 64 MB of float32 in one shard
    write_store(tmp_path / "s", make_keys(n), activations(n, layers=layers, d=d), shard_size=n)
    store = open_store(tmp_path / "s")
    store.keys  # noqa: B018 (keys are read once and cached; not part of the measured read)
    tracemalloc.start()
    part = store.read(5, rows=[3, 4000, 7999])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert part.shape == (3, d)
    assert peak < 3 * CHUNK_BYTES, f"reading 3 rows of one layer allocated {peak / 1e6:.1f} MB"


def test_float16_overflow_is_refused_naming_layer_and_value(tmp_path):
    last = activations(6)
    last[2, 3, 5] = 37000.0
    last[4, 3, 1] = -70000.0
    with pytest.raises(BabelprobeError, match=r"layer 3 reach \|x\| = 70000"):
        write_store(tmp_path / "s", make_keys(6), last, dtype="float16")
    assert not (tmp_path / "s" / "shard-00000.h5").exists()
    write_store(tmp_path / "t", make_keys(6), last, dtype="float16", on_overflow="bfloat16", shard_size=3)
    store = open_store(tmp_path / "t")
    assert [s["dtype"]["last"] for s in store.manifest["shards"]] == ["float16", "bfloat16"]
    assert store.read(3, [4])[0, 1] == torch.tensor(-70000.0).to(torch.bfloat16).item()
    assert verify_store(tmp_path / "t") == []


def test_non_finite_values_are_refused(tmp_path):
    last = activations(4)
    last[1, 2, 0] = np.nan
    with pytest.raises(BabelprobeError, match="layer 2 are not finite.*en-1"):
        write_store(tmp_path / "s", make_keys(4), last)


def test_open_store_errors(tmp_path):
    with pytest.raises(BabelprobeError, match="does not exist"):
        open_store(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BabelprobeError, match="no manifest.json"):
        open_store(tmp_path / "empty")
    write_store(tmp_path / "s", make_keys(4), activations(4))
    store = open_store(tmp_path / "s")
    with pytest.raises(BabelprobeError, match="layer 7 is not in store"):
        store.read(7)
    with pytest.raises(BabelprobeError, match="no 'mean' pooling"):
        store.read(0, pool="mean")
    with pytest.raises(BabelprobeError, match="row 4 is out of range"):
        store.read(0, [4])
    manifest = tmp_path / "s" / "manifest.json"
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "complete": False}))
    with pytest.raises(BabelprobeError, match="incomplete"):
        open_store(tmp_path / "s")
    manifest.write_text("{not json")
    with pytest.raises(BabelprobeError, match="unreadable manifest"):
        open_store(tmp_path / "s")


def test_write_store_bad_input(tmp_path):
    with pytest.raises(BabelprobeError, match="needs `last` or `mean`"):
        write_store(tmp_path / "a", make_keys(2))
    with pytest.raises(BabelprobeError, match="keys have 3 rows"):
        write_store(tmp_path / "b", make_keys(3), activations(2))
    with pytest.raises(BabelprobeError, match="lack column"):
        write_store(tmp_path / "c", make_keys(2).drop(columns="label"), activations(2))
    with pytest.raises(BabelprobeError, match="empty"):
        write_store(tmp_path / "d", make_keys(0), np.zeros((0, 2, 4), np.float32))
    write_store(tmp_path / "e", make_keys(2), activations(2))
    with pytest.raises(BabelprobeError, match="already holds"):
        write_store(tmp_path / "e", make_keys(2), activations(2))
    write_store(tmp_path / "e", make_keys(2), activations(2, seed=5), overwrite=True)
    np.testing.assert_array_equal(open_store(tmp_path / "e").read(1), activations(2, seed=5)[:, 1])


def test_verify_names_each_problem(tmp_path):
    write_store(tmp_path / "s", make_keys(10), activations(10), activations(10), shard_size=4)
    assert verify_store(tmp_path / "s") == []
    with h5py.File(tmp_path / "s" / "shard-00001.h5", "r+") as f:
        f["mean"][0, 0, 0] = np.inf
    (tmp_path / "s" / "shard-00002.h5").unlink()
    (tmp_path / "s" / "shard-00009.h5").write_bytes(b"stray")
    problems = verify_store(tmp_path / "s")
    assert any("shard-00001.h5/mean: checksum mismatch" in p for p in problems)
    assert any("shard-00001.h5/mean: 1 non-finite" in p for p in problems)
    assert "shard-00002.h5: missing" in problems
    assert any("shard-00009.h5: shard file not listed" in p for p in problems)
    assert not any("shard-00000" in p for p in problems)


@pytest.mark.parametrize("recurring", [False, True])
def test_background_writer_reuses_every_written_shards_memory(tmp_path, recurring):
    """Fused scoring fills several shards at once (scattered rows); once written, each shard's arrays serve a
    later shard, all of them, not a fixed few (fresh memory is filled at page-fault speed): the second wave of
    three shards assembled at once allocates nothing, and every shard holds its own rows. Also when texts recur
    and shards store different numbers of rows (here 4, 4, 4, 2, 0 and 0)."""
    from babelprobe.extract.background import BackgroundWriter
    from babelprobe.extract.capture import PooledRows
    n, layers, d = 24, 2, 8
    keys, own = make_keys(n), activations(n, layers=layers, d=d)
    texts = [f"t{i % 14}" if recurring else f"t{i}" for i in range(n)]
    value_rows = first_rows(texts)
    writer = StoreWriter(tmp_path / "s", n_rows=n, layers=list(range(layers)), d_model=d, n_layers=layers,
                         pools=("last",), shard_size=4, value_rows=value_rows)
    writer.prepare(overwrite=False)
    assert [writer.stored_rows(k) for k in range(6)] == ([4, 4, 4, 2, 0, 0] if recurring else [4] * 6)
    background = BackgroundWriter(writer, keys, (layers, d), [], update_manifest=True, threaded=False)
    made, arrays = [], background._arrays
    background._arrays = lambda span: made.append(arrays(span)["last"]) or {"last": made[-1]}
    last = own[value_rows]  # a recurring text's rows come with its values, as a model gives them
    for wave in (np.arange(0, 12), np.arange(12, 24)):  # three shards at a time, rows interleaved
        for rows in np.array_split(wave[np.argsort(wave % 4, kind="stable")], 4):  # each batch touches all three
            background.scattered(rows, PooledRows({"last": torch.from_numpy(last[rows])}))
    background.close()
    writer.finish()
    memory = {id(a if a.base is None else a.base) for a in made}
    assert len(made) == 6 and len(memory) == 3  # the second wave took the first wave's memory
    np.testing.assert_array_equal(open_store(tmp_path / "s").read_layers(), last)


def bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """bfloat16 round to nearest even, written out on the float32 bits (the reference for finite values)."""
    bits = values.view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def test_pooled_rows_encoded_where_pooled_equal_the_rounding_and_flag_non_finite_rows():
    """`Pooler.result_async(encode=...)` gives the rows as the store keeps them: bfloat16 bits equal to round to
    nearest even (ties included), float32 as they are, and a flag per row and layer that is False where any value
    is NaN or infinite."""
    from babelprobe.extract.capture import Pooler

    hidden = torch.from_numpy(activations(3, layers=4, d=16, scale=300.0).reshape(3, 4, 16))
    hidden[0, 1, 0] = float(np.array(0x3F808000, dtype=np.uint32).view(np.float32))  # a tie: 1.00390625
    hidden[2, 3, 5] = float("nan")
    pooler = Pooler(torch.ones(3, 4, dtype=torch.long), ("last",), 4, 16, exclude_bos=False)
    for column in range(4):  # "layer" j's states: hidden[:, j] at every position, so its last token's too
        pooler.add(column, hidden[:, column, None].expand(3, 4, 16))
    expected = hidden.numpy()
    rows = pooler.result_async(encode="bfloat16")
    finite = rows.finite()["last"]
    assert finite.tolist() == [[True] * 4, [True] * 4, [True, True, True, False]]
    assert rows.wait()["last"].dtype == np.uint16
    np.testing.assert_array_equal(rows.wait()["last"][finite], bfloat16_bits(expected[finite]))
    assert bfloat16_bits(expected)[0, 1, 0] == 0x3F80  # the tie went to the even neighbour
    np.testing.assert_array_equal(pooler.result_async(encode="float32").wait()["last"], expected)
    assert pooler.result_async().finite() is None  # unencoded rows are not checked


@pytest.mark.parametrize("encode", [True, False])
def test_rows_encoded_on_the_device_write_the_bytes_the_host_writes(tmp_path, encode):
    """A bfloat16 store assembled from rows encoded where they were pooled holds the bytes (and sha256) of the
    same values encoded on the host (`write_store`); rows that come unencoded are encoded by the writer."""
    from babelprobe.extract.background import BackgroundWriter
    from babelprobe.extract.capture import PooledRows, Pooler
    n, layers, d = 10, 3, 8
    keys, last = make_keys(n), activations(n, layers=layers, d=d, scale=1e3)
    write_store(tmp_path / "host", keys, last, dtype="bfloat16", shard_size=4)
    writer = StoreWriter(tmp_path / "dev", n_rows=n, layers=list(range(layers)), d_model=d, n_layers=layers,
                         pools=("last",), dtype="bfloat16", shard_size=4)
    writer.prepare(overwrite=False)
    background = BackgroundWriter(writer, keys, (layers, d), [], update_manifest=True, threaded=False)
    for rows in (np.array([9, 0, 4]), np.array([1, 2, 3, 5, 6, 7, 8])):
        pooler = Pooler(torch.ones(len(rows), 1, dtype=torch.long), ("last",), layers, d, exclude_bos=False)
        pooler.set("last", torch.from_numpy(last[rows]))
        background.scattered(rows, pooler.result_async(encode="bfloat16") if encode else
                             PooledRows({"last": torch.from_numpy(last[rows])}))
    background.close()
    writer.finish()
    host, device = open_store(tmp_path / "host"), open_store(tmp_path / "dev")
    assert [s["sha256"] for s in device.manifest["shards"]] == [s["sha256"] for s in host.manifest["shards"]]
    np.testing.assert_array_equal(device.read_layers(), host.read_layers())
    assert verify_store(tmp_path / "dev") == []


@pytest.mark.parametrize("encode", ["bfloat16", "float32"])
def test_a_non_finite_row_found_on_the_device_names_item_and_layer_and_writes_nothing(tmp_path, encode):
    from babelprobe.extract.background import BackgroundWriter
    from babelprobe.extract.capture import Pooler
    n, layers, d = 4, 3, 8
    last = activations(n, layers=layers, d=d)
    last[2, 1, 5] = np.inf
    writer = StoreWriter(tmp_path / "s", n_rows=n, layers=[0, 4, 8], d_model=d, n_layers=8, pools=("last",),
                         dtype=encode, shard_size=4)
    writer.prepare(overwrite=False)
    background = BackgroundWriter(writer, make_keys(n), (layers, d), [], update_manifest=True, threaded=False)
    pooler = Pooler(torch.ones(n, 1, dtype=torch.long), ("last",), layers, d, exclude_bos=False)
    pooler.set("last", torch.from_numpy(last[[3, 2, 1, 0]]))
    with pytest.raises(BabelprobeError, match="last activations of layer 4 are not finite.*'en-2'"):
        background.scattered(np.array([3, 2, 1, 0]), pooler.result_async(encode=encode))
    assert not list((tmp_path / "s").glob("*.h5")) and not list((tmp_path / "s").glob(".*.tmp"))


# ------------------------------------------------------------------ a recurring text stored once (format 2)

def pointing_store(path, texts, dtype="float32", shard_size=5, pools=("last", "mean")):
    """A store of `texts` (one item each) written as extraction writes it: a text's first row holds its values,
    its later rows point there. Returns the values every row has, the reference a reader must give back."""
    n, layers, d = len(texts), 3, 2048  # 128 float32 rows a chunk: reads cross chunks and shards
    own = activations(n, layers=layers, d=d, scale=50.0)
    value_rows = first_rows(texts)
    writer = StoreWriter(path, n_rows=n, layers=list(range(layers)), d_model=d, n_layers=layers - 1, pools=pools,
                         dtype=dtype, shard_size=shard_size, value_rows=value_rows)
    writer.prepare()
    keys = make_keys(n)
    for k in range(writer.n_shards):
        start, stop = writer.shard_rows(k)
        stored = (writer.value_rows == np.arange(n))[start:stop]
        writer.write_shard(k, keys.iloc[start:stop], {p: own[start:stop][stored] for p in pools})
    writer.finish()
    values = own[value_rows]  # every row has its first row's values (numpy indexing, not the reader)
    return torch.from_numpy(values).to(torch.bfloat16).float().numpy() if dtype == "bfloat16" else values


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_a_recurring_text_is_stored_once_and_read_at_each_of_its_rows(tmp_path, dtype):
    """XCOMPS-like: each pair's acceptable sentence recurs in the pairs of four negative types, far apart.
    Shards hold only their first occurrences; any rows, in any order, host or device, read every row's values."""
    sentences = [f"good {i}" for i in range(60)]
    texts = [t for kind in range(4) for i, good in enumerate(sentences) for t in (good, f"bad {kind} {i}")]
    expected = pointing_store(tmp_path / "s", texts, dtype, shard_size=97)
    if dtype == "float16":
        expected = expected.astype(np.float16).astype(np.float32)
    store = open_store(tmp_path / "s")
    distinct = len(set(texts))
    assert store.manifest["stored_rows"] == distinct == 300 and len(store) == len(texts) == 480
    with h5py.File(tmp_path / "s" / "shard-00003.h5") as f:  # rows 291..387: good sentences all seen before
        assert f["last"].shape == (int((f["value_row"][()] == np.arange(291, 388)).sum()), 3, 2048)
        assert f["last"].shape[0] == 49  # its unacceptable sentences, rows 291, 293, ..., 387
    assert sum(f.stat().st_size for f in (tmp_path / "s").glob("shard-*.h5")) < 0.7 * len(texts) * 3 * 2048 * 2 * (
        4 if dtype == "float32" else 2)
    subset_b = np.arange(120, 240)  # one negative type's rows: half point to the first type's
    for rows in (None, subset_b, subset_b[::-1], np.r_[470:480, 3, 3, 130, 0:40]):
        for layers in ([0, 1, 2], [2, 0]):
            want = expected[slice(None) if rows is None else rows][:, layers]
            np.testing.assert_array_equal(store.read_layers(layers, rows=rows, pool="mean"), want)
            on_device = store.read_layers(layers, rows=rows, device=torch.device("cpu"))
            np.testing.assert_array_equal(on_device.numpy(), expected[slice(None) if rows is None else rows][:, layers])
    assert verify_store(tmp_path / "s") == []


def test_a_shard_whose_texts_all_came_before_stores_no_values(tmp_path):
    texts = ["a", "b", "c", "a", "b", "c", "d"]
    expected = pointing_store(tmp_path / "s", texts, shard_size=3, pools=("last",))
    with h5py.File(tmp_path / "s" / "shard-00001.h5") as f:
        assert f["last"].shape == (0, 3, 2048) and f["value_row"][()].tolist() == [0, 1, 2]
    np.testing.assert_array_equal(open_store(tmp_path / "s").read_layers(), expected)
    assert verify_store(tmp_path / "s") == []


def test_an_incomplete_store_reads_the_rows_of_the_shards_it_has(tmp_path):
    """A store whose middle shard is missing (a run stopped; `compare` opens such a store to look at it): its other
    shards' rows, pointing ones included, read their values."""
    texts = ["a", "b", "c", "d", "e", "f", "a", "g", "b"]
    expected = pointing_store(tmp_path / "s", texts, shard_size=3, pools=("last",))
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    del manifest["shards"][1]
    (tmp_path / "s" / "manifest.json").write_text(json.dumps({**manifest, "complete": False}))
    store = open_store(tmp_path / "s", allow_incomplete=True)
    np.testing.assert_array_equal(store.read_layers(rows=[8, 6, 7, 0]), expected[[8, 6, 7, 0]])


def test_verify_finds_a_changed_or_dangling_value_row(tmp_path):
    texts = ["a", "b", "a", "c", "b", "a"]
    pointing_store(tmp_path / "s", texts, shard_size=3, pools=("last",))
    with h5py.File(tmp_path / "s" / "shard-00001.h5", "r+") as f:
        f["value_row"][0] = 1  # "c" would read "b"'s values
    assert verify_store(tmp_path / "s") == ["shard-00001.h5: value_row does not match the manifest checksum"]
    with pytest.raises(BabelprobeError, match="shard-00001.h5/value_row changed after it was written"):
        open_store(tmp_path / "s").check()  # what `probe` checks before it reads
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    manifest["shards"][1]["value_rows_sha256"] = sha256_of(np.array([1, 1, 0]))
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(manifest))
    with h5py.File(tmp_path / "s" / "shard-00001.h5", "r+") as f:
        f["value_row"][...] = [1, 1, 0]  # row 3 points to row 1, which holds "b": checksum right, shape wrong
    assert verify_store(tmp_path / "s") == [
        "shard-00001.h5/last: shape (1, 3, 2048), expected (0, 3, 2048)"]
    with pytest.raises(BabelprobeError, match=r"row 3 points to row 4, which does not hold values"):
        check_value_rows(np.array([0, 1, 0, 4, 4]), "store s")


def format_1(path):
    """A store as babelprobe wrote it before format 2: every row stored, no `value_row`, version 1 recorded."""
    manifest = json.loads((path / "manifest.json").read_text())
    for record in manifest["shards"]:
        with h5py.File(path / record["name"], "r+") as f:
            assert (f["value_row"][()] == np.arange(*record["rows"])).all()  # written with every row stored
            del f["value_row"]
            f.attrs["format_version"] = 1
        del record["value_rows_sha256"], record["stored_rows"]
    manifest["format_version"] = manifest["settings"]["format_version"] = 1
    del manifest["stored_rows"]
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_a_format_1_store_is_read_and_a_newer_format_refused(tmp_path):
    keys, last = make_keys(9), activations(9)
    write_store(tmp_path / "s", keys, last, shard_size=4)
    format_1(tmp_path / "s")
    np.testing.assert_array_equal(open_store(tmp_path / "s").read_layers(rows=[8, 0, 5]), last[[8, 0, 5]])
    assert verify_store(tmp_path / "s") == []
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    (tmp_path / "s" / "manifest.json").write_text(json.dumps({**manifest, "format_version": 3}))
    with pytest.raises(BabelprobeError, match="format_version 3 is not one this babelprobe reads"):
        open_store(tmp_path / "s")
