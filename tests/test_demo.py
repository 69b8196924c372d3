"""`make demo` (examples/demo.py): trains to a meaningful accuracy and leaves nothing behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from PIL import Image

DEMO = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "demo.py")


def test_demo_reaches_real_accuracy_and_removes_its_files(tmp_path):
    # tempfile honours TMPDIR: whatever the demo writes lands in tmp_path.
    env = {**os.environ, "TMPDIR": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "2"}
    images = tmp_path / "images"
    run = subprocess.run(
        [sys.executable, DEMO, "--images", str(images)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    found = re.search(r"accuracy on \d+ held-out digits ([0-9.]+)", run.stdout)
    assert found, run.stdout
    assert float(found.group(1)) >= 0.9, run.stdout
    assert run.stdout.count("identical after load: True") == 2, run.stdout
    assert "pixels scaled float64 [0, 16] -> uint8 [0, 255]" in run.stdout, run.stdout
    with Image.open(images / "digits_grid.png") as grid:  # 8 x 4 tiles of 8x8 digits, x8
        assert grid.mode == "L" and grid.width == 4 + 8 * (64 + 4) and grid.height > 4 * 64
    assert "value counts (10 distinct)" in run.stdout, run.stdout  # the labels, from stats
    with Image.open(images / "digits_stats.png") as plot:  # two panels: image, label
        assert plot.mode in ("RGB", "RGBA") and plot.width > plot.height > 0
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith("superserial-demo-")]
    assert leftovers == []
