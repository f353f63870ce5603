"""Pure pieces of the converter: label parsing, class indices, matching, order, shard assignment."""

from __future__ import annotations

import pytest

from hpc_train.data.convert import (
    array_task_from_env,
    mpi_world_size,
    resolve_task,
    sample_order,
    shards_for_writer,
    split_into_shards,
)
from hpc_train.data.manifest import build_manifest
from hpc_train.data.sources import is_image_name, match_labels, parse_labels_text, resolve_classes
from hpc_train.errors import DataError


def test_labels_whitespace_lines_skip_blanks_and_comments():
    text = "# header comment\nILSVRC2012_val_00000001.JPEG n01751748\n\n  b.jpg\t n09193705 \n"
    assert parse_labels_text(text) == [("ILSVRC2012_val_00000001.JPEG", "n01751748"),
                                       ("b.jpg", "n09193705")]


def test_labels_kaggle_csv_takes_first_token_of_prediction_string():
    text = ("ImageId,PredictionString\n"
            "ILSVRC2012_val_00008726,n02119789 255 142 454 329 n02119789 44 21 322 295 \n"
            "ILSVRC2012_val_00024235,n03000134 1 2 3 4\n")
    assert parse_labels_text(text) == [("ILSVRC2012_val_00008726", "n02119789"),
                                       ("ILSVRC2012_val_00024235", "n03000134")]


@pytest.mark.parametrize("header", ["", "filename,label\n"])
def test_labels_plain_csv_with_or_without_header(header):
    assert parse_labels_text(header + "a.jpg,3\nb.png,0\n") == [("a.jpg", "3"), ("b.png", "0")]


@pytest.mark.parametrize("text,needle", [("", "no label lines"), ("onlyname\n", "line 1"),
                                         ("a.jpg,\n", "CSV row 1")])
def test_labels_bad_lines_name_the_line(text, needle):
    with pytest.raises(DataError, match=needle):
        parse_labels_text(text, origin="val.txt")


def test_classes_names_sorted_or_from_list():
    assert resolve_classes(["n2", "n1", "n2"], None) == (["n1", "n2"], {"n1": 0, "n2": 1})
    names, index = resolve_classes(["b"], ["c", "b", "a"])
    assert names == ["c", "b", "a"] and index == {"b": 1}
    with pytest.raises(DataError, match=r"not in --classes: \['zz'\]"):
        resolve_classes(["zz"], ["a"])


def test_classes_integer_labels_are_indices():
    # 10 must not sort before 2: integers keep their value as the index.
    names, index = resolve_classes(["2", "10", "0"], None)
    assert names == [str(i) for i in range(11)] and index == {"2": 2, "10": 10, "0": 0}
    names, index = resolve_classes(["1"], ["cat", "dog"])
    assert names == ["cat", "dog"] and index == {"1": 1}
    with pytest.raises(DataError, match="outside 0..1"):
        resolve_classes(["2"], ["cat", "dog"])


def test_match_by_name_then_stem_and_report_both_mismatches():
    files = ["a.JPEG", "b.jpg", "c.png", "extra.jpg"]
    matched, unlabeled, missing = match_labels(files, [("a.JPEG", "x"), ("b", "y"), ("c", "x"),
                                                       ("gone", "y")])
    assert matched == {"a.JPEG": "x", "b.jpg": "y", "c.png": "x"}
    assert unlabeled == ["extra.jpg"] and missing == ["gone"]


def test_match_refuses_ambiguous_stem_and_conflicting_labels():
    with pytest.raises(DataError, match="several files"):
        match_labels(["a.jpg", "a.png"], [("a", "x")])
    with pytest.raises(DataError, match="two labels"):
        match_labels(["a.jpg"], [("a.jpg", "x"), ("a", "y")])


def test_image_names():
    assert is_image_name("x.JPEG") and is_image_name("y.WebP") and is_image_name("z.bmp")
    assert not is_image_name(".hidden.jpg") and not is_image_name("notes.txt")


def test_order_is_sorted_then_seeded_shuffle():
    items = [(f"k{i:03d}", i % 3) for i in range(50)]
    a = sample_order(list(reversed(items)), seed=0)
    assert a == sample_order(items, seed=0)          # input order does not matter
    assert a != sample_order(items, seed=1) and sorted(a) == items
    shards = split_into_shards(a, 16)
    assert [len(s) for s in shards] == [16, 16, 16, 2] and [x for s in shards for x in s] == a


def test_writer_takes_every_nth_shard():
    assert shards_for_writer(7, 0, 3) == [0, 3, 6]
    assert shards_for_writer(7, 2, 3) == [2, 5]
    assert shards_for_writer(2, 3, 4) == []
    assert sorted(i for r in range(4) for i in shards_for_writer(9, r, 4)) == list(range(9))


def test_array_task_from_env_uses_offset_and_step():
    assert array_task_from_env({}) is None
    env = {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "4", "SLURM_ARRAY_TASK_COUNT": "3"}
    assert array_task_from_env(env) == (1, 3)
    env.update(SLURM_ARRAY_TASK_ID="8", SLURM_ARRAY_TASK_STEP="2", SLURM_ARRAY_TASK_MIN="0",
               SLURM_ARRAY_TASK_COUNT="5")
    assert array_task_from_env(env) == (4, 5)
    with pytest.raises(DataError, match="--task-index"):
        array_task_from_env({"SLURM_ARRAY_TASK_ID": "9", "SLURM_ARRAY_TASK_MIN": "1",
                             "SLURM_ARRAY_TASK_COUNT": "3"})


def test_resolve_task_flags_win_and_are_checked():
    env = {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2"}
    assert resolve_task(None, None, env) == (1, 2)
    assert resolve_task(0, 4, env) == (0, 4)
    assert resolve_task(None, None, {}) == (0, 1)
    with pytest.raises(DataError, match="go together"):
        resolve_task(1, None, {})
    with pytest.raises(DataError, match="0..1"):
        resolve_task(2, 2, {})


def test_mpi_size_from_env_only():
    assert mpi_world_size({}) == 1
    assert mpi_world_size({"OMPI_COMM_WORLD_SIZE": "4"}) == 4
    assert mpi_world_size({"PMI_SIZE": "2"}) == 2


def test_manifest_keeps_only_entry_keys_and_sums():
    sidecars = [{"file": "shard-00000.h5", "num_samples": 3, "bytes": 10, "sha256": "a",
                 "skipped": 1, "skipped_items": [{"key": "x", "reason": "r"}], "fingerprint": "f"},
                {"file": "shard-00001.h5", "num_samples": 2, "bytes": 9, "sha256": "b", "skipped": 0}]
    m = build_manifest("val", "jpeg", ["a", "b"], 4, 0, sidecars)
    assert m["num_samples"] == 5 and m["num_skipped"] == 1
    assert m["class_to_index"] == {"a": 0, "b": 1}
    assert m["shards"][0] == {"file": "shard-00000.h5", "num_samples": 3, "bytes": 10,
                              "sha256": "a", "skipped": 1}
    assert list(m) == ["format_version", "split", "encoding", "num_samples", "num_skipped",
                       "class_names", "class_to_index", "shard_size", "seed", "shards"]
