"""`make demo` (examples/demo.py): trains to a meaningful accuracy and leaves nothing behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys

DEMO = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "demo.py")


def test_demo_reaches_real_accuracy_and_removes_its_files(tmp_path):
    # tempfile honours TMPDIR: whatever the demo writes lands in tmp_path.
    env = {**os.environ, "TMPDIR": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "2"}
    run = subprocess.run(
        [sys.executable, DEMO], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    found = re.search(r"accuracy on \d+ held-out digits ([0-9.]+)", run.stdout)
    assert found, run.stdout
    assert float(found.group(1)) >= 0.9, run.stdout
    assert run.stdout.count("identical after load: True") == 2, run.stdout
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith("superserial-demo-")]
    assert leftovers == []
