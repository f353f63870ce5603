"""ShardedImages on real HDF5 files written here to docs/shard-format.md (h5py directly)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from hpc_train.data.sampler import SampleKey
from hpc_train.data.shard_dataset import ShardedImages
from hpc_train.data.transforms import TrainTransform, ValTransform
from hpc_train.errors import DataError


def encode_jpeg(pixels: np.ndarray, quality: int = 90) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def write_split(root: Path, split: str, pixels: list[np.ndarray], labels: list[int],
                counts: list[int], encoding: str = "jpeg", class_names: list[str] | None = None,
                format_version: int = 2, encoded_options: dict | None = None) -> Path:
    """Shards holding `counts[i]` samples each (0 allowed), then the manifest, as the doc says:
    JPEG records in `encoded` + `offsets` (format 2; `encoded_options`: h5py's chunks,
    compression, ...) or one variable-length `images` (format 1)."""
    assert sum(counts) == len(pixels) == len(labels)
    class_names = class_names or [f"c{i}" for i in range(max(labels) + 1)]
    split_dir = root / split
    split_dir.mkdir(parents=True, exist_ok=True)
    entries, first = [], 0
    for index, n in enumerate(counts):
        chunk = range(first, first + n)
        first += n
        name = f"shard-{index:05d}.h5"
        with h5py.File(split_dir / name, "w") as f:
            if encoding == "raw":
                size = pixels[0].shape[0]
                data = np.stack([pixels[i] for i in chunk]) if n else np.zeros((0, size, size, 3))
                f.create_dataset("images", data=data.astype(np.uint8), chunks=(1, size, size, 3))
                f.attrs["raw_size"] = size
            else:
                _write_records(f, [encode_jpeg(pixels[i]) for i in chunk], format_version,
                               encoded_options or {})
            f.create_dataset("labels", data=np.array([labels[i] for i in chunk], np.int64))
            f.create_dataset("keys", data=[f"{labels[i]}/img{i}.jpg" for i in chunk], shape=(n,),
                             dtype=h5py.string_dtype("utf-8"))
            f.create_dataset("shapes", data=np.array([pixels[i].shape for i in chunk],
                                                     np.int32).reshape(n, 3))
            f.attrs.update(format_version=format_version, encoding=encoding, split=split,
                           num_samples=n, class_names=json.dumps(class_names), shard_index=index)
        data = (split_dir / name).read_bytes()
        entries.append({"file": name, "num_samples": n, "bytes": len(data),
                        "sha256": hashlib.sha256(data).hexdigest(), "skipped": 0})
    manifest = {"format_version": format_version, "split": split, "encoding": encoding,
                "num_samples": len(pixels), "num_skipped": 0, "class_names": class_names,
                "class_to_index": {c: i for i, c in enumerate(class_names)},
                "shard_size": max(counts), "seed": 0, "shards": entries}
    (split_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return split_dir


def _write_records(f, records: list[bytes], format_version: int, encoded_options: dict) -> None:
    if format_version == 1:
        ds = f.create_dataset("images", (len(records),), dtype=h5py.vlen_dtype(np.uint8))
        for j, data in enumerate(records):
            ds[j] = np.frombuffer(data, dtype=np.uint8)
        return
    flat = np.frombuffer(b"".join(records), dtype=np.uint8)
    f.create_dataset("encoded", data=flat, **encoded_options)
    f.create_dataset("offsets", data=np.cumsum([0] + [len(d) for d in records], dtype=np.int64))


def _records(f) -> list[bytes]:
    if "images" in f:
        return [bytes(r.tobytes()) for r in f["images"][()]]
    encoded, offsets = f["encoded"][()], f["offsets"][()]
    return [bytes(encoded[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]


def coded_pixels(i: int, height: int = 24, width: int = 32) -> np.ndarray:
    """A flat colour that survives JPEG: sample i is recognisable after decoding."""
    return np.full((height, width, 3), (i * 9 % 256, i * 5 % 256, 100), np.uint8)


def sample_id(image: np.ndarray) -> int:
    red, green = int(round(image[..., 0].mean())), int(round(image[..., 1].mean()))
    return next(i for i in range(200) if abs(i * 9 % 256 - red) <= 2 and abs(i * 5 % 256 - green) <= 2)


COUNTS = [5, 0, 3, 4]   # a shard that lost every sample, and a short last shard


@pytest.fixture(params=[2, 1], ids=["format2", "format1"])
def jpeg_dir(tmp_path, request):
    """Both layouts of JPEG records: what the converter writes now, and the earlier one."""
    n = sum(COUNTS)
    write_split(tmp_path, "train", [coded_pixels(i) for i in range(n)], [i % 3 for i in range(n)],
                COUNTS, format_version=request.param)
    return tmp_path


def test_global_index_maps_across_shard_boundaries(jpeg_dir):
    ds = ShardedImages(jpeg_dir, "train")
    assert len(ds) == 12 and ds.class_names == ["c0", "c1", "c2"]
    assert [ds.locate(g) for g in (0, 4, 5, 7, 8, 11)] == [(0, 0), (0, 4), (2, 0), (2, 2), (3, 0),
                                                          (3, 3)]
    for g in range(12):
        image, label = ds[g]
        assert image.shape == (24, 32, 3) and image.dtype == np.uint8
        assert sample_id(image) == g and label == g % 3
    with pytest.raises(IndexError):
        ds[12]


def test_raw_encoding_returns_stored_pixels_without_decoding(tmp_path):
    pixels = [np.random.default_rng(i).integers(0, 256, (16, 16, 3), dtype=np.uint8)
              for i in range(7)]
    write_split(tmp_path, "val", pixels, [0, 1, 0, 1, 0, 1, 0], [4, 3], encoding="raw")
    ds = ShardedImages(tmp_path, "val")
    assert all(np.array_equal(ds[g][0], pixels[g]) for g in range(7))
    out, label = ShardedImages(tmp_path, "val", ValTransform(8))[5]
    assert out.shape == (3, 8, 8) and out.dtype == torch.float32 and label == 1


def test_files_open_lazily_and_never_cross_a_fork(jpeg_dir):
    ds = ShardedImages(jpeg_dir, "train")
    assert not ds._open and ds._pid is None                   # nothing opened by construction
    ds[0]
    parent_id = ds._open[0].file.id.id
    assert ds._pid == os.getpid()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:                                               # child: must open its own handle
        try:
            image, _ = ds[1]
            report = [os.getpid() == ds._pid, ds._open[0].file.id.id != parent_id,
                      sample_id(image) == 1]
            os.write(write_end, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    report = json.loads(os.read(read_end, 1000))
    os.waitpid(pid, 0)
    assert report == [True, True, True]
    assert sample_id(ds[2][0]) == 2 and ds._open[0].file.id.id == parent_id   # parent unharmed


class ProbeDataset(torch.utils.data.Dataset):
    """Reports, from inside a DataLoader worker, which process opened the shard it read."""

    def __init__(self, ds: ShardedImages):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, g):
        image, _ = self.ds[g]
        k, _ = self.ds.locate(g)
        return sample_id(image), os.getpid(), self.ds._pid, self.ds._open[k].file.id.id


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_dataloader_workers_open_their_own_files(jpeg_dir, start_method):
    ds = ShardedImages(jpeg_dir, "train")
    ds[0]                                                      # the parent holds a handle first
    parent_id = ds._open[0].file.id.id
    loader = DataLoader(ProbeDataset(ds), batch_size=2, num_workers=2,
                        multiprocessing_context=start_method)
    rows = [tuple(map(int, row)) for batch in loader for row in zip(*batch)]
    assert [r[0] for r in rows] == list(range(12))
    worker_pids = {r[1] for r in rows}
    assert len(worker_pids) == 2 and os.getpid() not in worker_pids
    assert all(r[1] == r[2] for r in rows)                     # opened by the reading process
    if start_method == "fork":                                 # same library state copied: ids
        assert all(r[3] != parent_id for r in rows if r[0] < 5)  # of shard 0 must be new ones
    assert ds._open[0].file.id.id == parent_id


def test_pickled_dataset_carries_no_handles(jpeg_dir):
    ds = ShardedImages(jpeg_dir, "train")
    ds[0]
    copy = pickle.loads(pickle.dumps(ds))
    assert not copy._open and copy._pid is None
    assert sample_id(copy[3][0]) == 3 and copy._pid == os.getpid()


def test_getitems_matches_item_by_item(jpeg_dir):
    ds = ShardedImages(jpeg_dir, "train", ValTransform(16))
    order = [11, 3, 5, 0, 4, 8, 9, 1, 7, 3]                    # unsorted, shards mixed, a repeat
    batched = ds.__getitems__(order)
    single = [ds[g] for g in order]
    assert [label for _, label in batched] == [label for _, label in single]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(batched, single))
    loader = DataLoader(ds, batch_size=4, sampler=order)
    images, labels = next(iter(loader))
    assert images.shape == (4, 3, 16, 16) and labels.tolist() == [11 % 3, 0, 2, 0]


def test_getitems_draws_each_key_its_own_augmentation(tmp_path):
    n = sum(COUNTS)
    noise = [np.random.default_rng(i).integers(0, 256, (24, 32, 3), dtype=np.uint8) for i in range(n)]
    write_split(tmp_path, "train", noise, [i % 3 for i in range(n)], COUNTS)   # crops differ
    ds = ShardedImages(tmp_path, "train", TrainTransform(16, normalize=False), seed=1)
    # Sorting by shard and offset must keep each key with its sample: the same index twice in
    # other epochs, across shards, out of order.
    keys = [SampleKey(0, 9), SampleKey(1, 3), SampleKey(0, 3), SampleKey(2, 0), SampleKey(1, 9)]
    batched = [image for image, _ in ds.__getitems__(keys)]
    assert all(torch.equal(image, ds[key][0]) for image, key in zip(batched, keys))
    assert not torch.equal(batched[1], batched[2]) and not torch.equal(batched[0], batched[4])


def _overwrite_record(split_dir: Path, shard: int, offset: int, data: bytes) -> None:
    with h5py.File(split_dir / f"shard-{shard:05d}.h5", "r+") as f:
        records = _records(f)
        records[offset] = data
        version = 1 if "images" in f else 2
        for name in ("images", "encoded", "offsets"):
            if name in f:
                del f[name]
        _write_records(f, records, version, {})


def test_corrupt_record_names_the_shard_and_index(jpeg_dir):
    _overwrite_record(jpeg_dir / "train", 2, 1, b"\xff\xd8garbage, not a jpeg")
    ds = ShardedImages(jpeg_dir, "train", TrainTransform(16))
    ds[5]                                                      # its neighbours still read
    for read in (lambda: ds[6], lambda: ds.__getitems__([5, 6, 7])):
        with pytest.raises(DataError, match=r"shard-00002\.h5 record 1 \(global index 6, "
                                            r"key 0/img6\.jpg\): cannot decode"):
            read()


def test_truncated_and_misshapen_records_are_data_errors(jpeg_dir):
    whole = encode_jpeg(coded_pixels(3))
    _overwrite_record(jpeg_dir / "train", 0, 3, whole[: len(whole) // 2])
    _overwrite_record(jpeg_dir / "train", 3, 0, encode_jpeg(coded_pixels(8, 10, 10)))
    ds = ShardedImages(jpeg_dir, "train")
    with pytest.raises(DataError, match=r"shard-00000\.h5 record 3 .*cannot decode"):
        ds[3]
    with pytest.raises(DataError, match=r"shard-00003\.h5 record 0 .*decodes to 10x10, "
                                        r"shapes says 24x32"):
        ds[8]


def test_data_error_reaches_the_trainer_from_a_worker(jpeg_dir):
    _overwrite_record(jpeg_dir / "train", 3, 2, b"junk")
    loader = DataLoader(ShardedImages(jpeg_dir, "train"), batch_size=4, num_workers=1)
    with pytest.raises(DataError, match=r"shard-00003\.h5 record 2"):
        list(loader)


def test_unknown_format_version_and_missing_manifest_are_refused(tmp_path):
    write_split(tmp_path, "train", [coded_pixels(0)], [0], [1], format_version=3)
    with pytest.raises(DataError, match="format_version 3 is not supported.*reads versions 1 and 2"):
        ShardedImages(tmp_path, "train")
    with pytest.raises(DataError, match="manifest.json is missing"):
        ShardedImages(tmp_path, "val")


def test_flat_records_read_from_the_mapped_file_and_by_slicing_give_the_stored_bytes(tmp_path):
    n = sum(COUNTS)
    pixels, labels = [coded_pixels(i) for i in range(n)], [i % 3 for i in range(n)]
    write_split(tmp_path / "contiguous", "train", pixels, labels, COUNTS)
    # Chunked and compressed (another tool's writer): HDF5 has no single extent to map.
    write_split(tmp_path / "chunked", "train", pixels, labels, COUNTS,
                encoded_options={"chunks": True, "maxshape": (None,), "compression": "gzip"})
    for name, maps in (("contiguous", True), ("chunked", False)):
        ds = ShardedImages(tmp_path / name, "train")
        order = [11, 3, 5, 0, 4, 8, 9, 1, 7, 3]
        assert [sample_id(image) for image, _ in ds.__getitems__(order)] == order
        assert all(ds.record(g)[0].tobytes() == encode_jpeg(pixels[g]) for g in range(n))
        assert (ds._open[0].records.mapped is not None) == maps, name


def test_damaged_flat_shards_are_data_errors_naming_the_file(tmp_path):
    n = sum(COUNTS)
    split = write_split(tmp_path, "train", [coded_pixels(i) for i in range(n)],
                        [i % 3 for i in range(n)], COUNTS)
    with h5py.File(split / "shard-00002.h5", "r+") as f:
        offsets = f["offsets"][()]
        f["offsets"][1] = offsets[2] + 1                       # no longer increasing
    ds = ShardedImages(tmp_path, "train")
    ds[0]
    with pytest.raises(DataError, match=r"shard-00002\.h5: offsets do not tile the \d+ bytes"):
        ds[5]
    whole = (split / "shard-00003.h5").read_bytes()           # a copy cut short
    (split / "shard-00003.h5").write_bytes(whole[: len(whole) - 200])
    with pytest.raises(DataError, match=r"shard-00003\.h5"):
        ds.__getitems__([8, 9, 10, 11])


def test_at_most_max_open_files_stay_open(jpeg_dir):
    ds = ShardedImages(jpeg_dir, "train", max_open=2)
    for g in (0, 5, 8, 0):
        ds[g]
    assert list(ds._open) == [3, 0]
    ds.close()
    assert not ds._open


@pytest.mark.slow
def test_bench_data_measures_every_configuration(tmp_path, capsys):
    from hpc_train.cli import main

    n = 16
    pixels = [coded_pixels(i) for i in range(n)]
    for i in range(n):
        folder = tmp_path / "src" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img{i}.jpg").write_bytes(encode_jpeg(pixels[i]))
    write_split(tmp_path / "shards", "train", pixels, [i % 2 for i in range(n)], [10, 6])
    write_split(tmp_path / "raw", "train", [p[:24, :24] for p in pixels],
                [i % 2 for i in range(n)], [16], encoding="raw")
    assert main(["bench", "data", "--src", str(tmp_path / "src"), "--shards",
                 str(tmp_path / "shards"), "--raw-shards", str(tmp_path / "raw"), "--workers", "0",
                 "--batch", "4", "--image-size", "16", "--images", "16", "--rounds", "2",
                 "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["config"]: r for r in report["rows"]}
    from hpc_train.data import decode

    slower = {f"shards-jpeg-{d}" for d in decode.installed_decoders()[1:]}
    assert set(rows) == {"torchvision", "folder", "shards-jpeg", "shards-jpeg-1", "shards-raw",
                         "memory", *slower}
    assert report["settings"]["jpeg_fallbacks"] == {}          # all baseline RGB JPEGs
    assert all(r["images_per_s"] > 0 and len(r["rounds"]) == 2 for r in rows.values())
    assert rows["torchvision"]["vs_torchvision"] == 1.0 and rows["memory"]["vs_ceiling"] == 1.0
    for r in rows.values():   # --workers 0: the main process is the one core
        assert r["images_per_s_per_core"] == r["images_per_s"]
        # From the unrounded rate: within what rounding images_per_s to 0.1 allows (a slow
        # machine's small rate makes that more than a fixed 0.01).
        rate = r["images_per_s"]
        assert 3000 / (rate + 0.05) - 0.005 <= r["cores_per_gpu"] <= 3000 / (rate - 0.05) + 0.005, r
    assert report["settings"]["page_cache"].startswith("warm")
