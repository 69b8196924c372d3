"""Golden files of format_version 1: what this version wrote must stay readable."""

from __future__ import annotations

import os
import shutil

import superserial
from conftest import assert_same_dataset
from make_golden import HERE, golden_v1_dataset

V1 = os.path.join(HERE, "v1")


def test_v1_golden_dataset_loads_exactly(tmp_path):
    # Copied, so that nothing (a lock file, say) is ever written into the repo.
    path = shutil.copytree(V1, tmp_path / "v1")
    header = superserial.read_header(str(path))
    assert header.format_version == 1
    assert header.element_count == 3
    assert_same_dataset(golden_v1_dataset(), superserial.load(str(path)))


def test_v1_golden_header_is_what_save_writes_today(tmp_path):
    fresh = superserial.save(golden_v1_dataset(), str(tmp_path / "fresh"), progress=False)
    golden = superserial.read_header(V1)
    assert fresh.structure == golden.structure
    assert [s.records for s in fresh.shards] == [s.records for s in golden.shards]
