"""One decision of the "auto" device (issue 26): the runner, Serve, Evaluate and training agree, even
where habana_frameworks is installed but unusable (Serve said hpu, the runner cpu)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_ASK = """
import json
from gaudi_gui.core import serve, prepare
from gaudi_gui.workers import device
print(json.dumps({"serve": serve.device_here("auto"), "probe": prepare.probe_device(),
                  "worker": device.auto()}))
"""


def _ask(env: dict[str, str]) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-c", _ASK], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_kind_of_job_decides_auto_the_same_way(tmp_path: Path) -> None:
    answers = _ask(dict(os.environ))
    assert set(answers.values()) == {"cpu"}  # no accelerator here


def test_a_habana_install_that_cannot_run_is_the_cpu_for_everyone(tmp_path: Path) -> None:
    """A habana_frameworks that imports but has no working bridge (what a mismatched accelerate or a
    broken install looks like): importable, so a look-up alone said "hpu"."""
    stub = tmp_path / "stub" / "habana_frameworks"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("__version__ = '1.18.0'\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(stub.parent),
                                                                       os.environ.get("PYTHONPATH", "")]))}
    answers = _ask(env)
    assert answers == {"serve": "cpu", "probe": "cpu", "worker": "cpu"}, answers
