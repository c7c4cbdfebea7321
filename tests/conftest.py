"""Shared fixtures: an isolated home for every test, one tiny demo model per session, no network, and
the one Slurm test cluster of a session (for tests/slurm and the Slurm scenarios of tests/scenarios)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.fake_hub import FakeHub
from tests.helpers import built_once, processes_with_env, wait_gone
from tests.slurm_cluster import ClusterError, SlurmCluster

# ``--dist loadgroup`` (make test): every xdist_group on one worker, the longest work first, written
# against xdist's public scheduler protocol; its hooks, imported here, are this conftest's.
from tests.xdist_groups import (  # noqa: F401
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_sessionfinish,
    pytest_xdist_make_scheduler,
)

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"

# No test may reach the network: the Hub libraries honour these, and every child inherits them.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# A user's default accelerate config must never change what a test launches.
os.environ.pop("ACCELERATE_CONFIG_FILE", None)
# The suite runs two workers on two cores (make test: -n 2): each child's torch spinning two OpenMP
# threads made four on two cores, and their busy-waits cost 6-8 % of the CPU of a training test
# (test_train_job + test_sft under -n 2: 149 -> 137 s of CPU, 83 -> 77 s). A test that sets it keeps
# its own value (the benchmark sets its ranks').
os.environ.setdefault("OMP_NUM_THREADS", "1")


#: How long a modal dialog may stay open during a test's teardown before it is closed and the test
#: fails (a window closed with a job running asks what to do; nobody answers in a teardown).
MODAL_AT_TEARDOWN_S = 15.0


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> object:
    """A modal dialog left open in a teardown (pytest-qt closing a window whose close asks about
    running jobs) waits in Qt's own event loop, where pytest-timeout's signal never gets through: the
    suite hung for good. A timer (timers do run in that loop) closes such a dialog after
    ``MODAL_AT_TEARDOWN_S`` and the test fails naming it."""
    try:
        from PySide6.QtCore import QTimer
        from PySide6.QtWidgets import QApplication, QDialog, QMessageBox
    except ImportError:
        return (yield)
    if QApplication.instance() is None:
        return (yield)
    left: list[str] = []
    since: list[float | None] = [None]

    def look() -> None:
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, QDialog):
            since[0] = None
            return
        now = time.monotonic()
        first = since[0] = since[0] or now
        if now - first > MODAL_AT_TEARDOWN_S:
            text = (f"{dialog.text()} {dialog.informativeText()}" if isinstance(dialog, QMessageBox)
                    else dialog.windowTitle())
            left.append(text.strip())
            dialog.reject()
            since[0] = None

    timer = QTimer()
    timer.setInterval(250)
    timer.timeout.connect(look)
    timer.start()
    try:
        result = yield
    finally:
        timer.stop()
    if left:
        pytest.fail(f"a modal dialog was left open at teardown (closed after {MODAL_AT_TEARDOWN_S:g} s): "
                    f"{left[0][:300]}")
    return result


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """tests/fake_hub.py's Hub on 127.0.0.1 for this test: the Hub libraries (and every child) reach
    it through HF_ENDPOINT, plain HTTP (no Xet), online and with no token of the user's."""
    server = FakeHub().start()
    assert server.url.startswith("http://127.0.0.1:")
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HF_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def session_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the session's read-only models are built: under xdist, one folder for the whole run (its
    workers share the run's base folder), so each model is built by the first worker that needs it
    and read by the others; each worker building its own cost a minute of the two cores per run."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "session-home"  # .../pytest-N/, this run's
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("session-home")


@pytest.fixture(scope="session")
def tiny_model_dir(session_home: Path) -> Path:
    """The demo model recipe with few pre-training steps, built once per run in a real child."""
    out = session_home / "tiny-model"
    return built_once(out, lambda: subprocess.run(
        [sys.executable, "-m", "gaudi_gui.workers.demo", str(out), "--steps", "30"],
        check=True, capture_output=True, timeout=300))


@pytest.fixture(scope="session")
def schema_json(session_home: Path) -> Path:
    """The installed transformers' TrainingArguments schema as the real child prints it, once per run."""
    out = session_home / "schema.json"

    def ask_the_child() -> None:
        text = subprocess.run([sys.executable, "-m", "gaudi_gui.workers.schema"], capture_output=True,
                              text=True, timeout=180, check=True).stdout
        out.write_text(text)

    return built_once(out, ask_the_child)


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                  request: pytest.FixtureRequest) -> Iterator[Path]:
    """Every test gets its own GAUDI_GUI_HOME (settings, runs, cache) and a fresh HF cache. A Qt test's
    cache holds the run's schema (the real child's, ``schema_json``), as the app's does after its first
    start: each Training tab built (every main window builds one) asked the schema child otherwise, 4 s
    of CPU each; so does every other test's (the commands check jobs by it). ``@pytest.mark.fresh_install``
    leaves the cache empty."""
    # What is alive now is frozen (gc.freeze: the collector's permanent generation, which
    # gc.get_objects does not list): the end-of-test checks below scan only what this test made. Scanning
    # every object instead cost 0.5-0.7 s per test late in a worker's life (the heap grows as windows
    # of earlier tests linger): 780 s of a whole run's 3,260 s of test time.
    gc.freeze()
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("GAUDI_GUI_HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("GAUDI_GUI_RUNS_DIR", raising=False)
    monkeypatch.delenv("GAUDI_GUI_HL_SMI", raising=False)
    if "tiny_model_dir" in request.fixturenames or "demo_model" in request.fixturenames:
        monkeypatch.setenv("GAUDI_GUI_DEMO_MODEL_DIR", str(request.getfixturevalue("tiny_model_dir")))
    if request.node.get_closest_marker("fresh_install") is None:
        # Every test, not only a Qt one: `train` and `queue add` check a job's training arguments by
        # this schema (core/jobcheck.py), and asked the child for it otherwise, 4 s of CPU each.
        from gaudi_gui.core.training_args import Schema, save_cached
        text = request.getfixturevalue("schema_json").read_text()
        save_cached(Schema.from_dict(json.loads(text[text.find("{"):])))
    try:
        yield home
        _close_agent_clients()
        _assert_no_background_work_left()
    finally:
        gc.unfreeze()  # earlier tests' objects are the collector's again (their cycles can be freed)
    if "gaudi_gui.services.agent_child" in sys.modules:  # the window's client of this test's agent
        sys.modules["gaudi_gui.services.agent_child"].close_shared()
    _end_agent()
    _assert_no_process_left(home)


def _assert_no_background_work_left() -> None:
    """Every test: no poller or timer of the app that it made outlives it (objects from before
    the test are frozen, see isolated_home: an earlier test's leftovers were that test's to report). A device
    poller still running (its window or tab never shut down), a service's or view's timer still ticking (a
    host's queue listing, a health check, a restart after back-off) would ask for its hl-smi or ssh
    child again later, inside another test, with that test's home and ssh config
    (or, with no child left, make every later test's teardown wait for it). Each is stopped here and the
    test that left it fails, naming it."""
    if not any(name.startswith("gaudi_gui.services.") for name in sys.modules):
        return  # nothing of the app's Qt side was imported: none can exist

    from PySide6.QtCore import QTimer

    poller_module = sys.modules.get("gaudi_gui.services.device_poller")
    poller_type = poller_module.DevicePoller if poller_module is not None else ()
    pollers: list[str] = []
    timers: list[str] = []
    for obj in gc.get_objects():
        with contextlib.suppress(RuntimeError):  # its C++ side is gone: it runs nothing
            if isinstance(obj, poller_type) and obj.is_running():
                pollers.append(obj.host.name if obj.host is not None else "local")
                obj.stop()
            elif isinstance(obj, QTimer) and obj.isActive() and (owner := _app_owner(obj)):
                timers.append(owner)
                obj.stop()
    left = [f"{what}: {names}" for what, names in (("device pollers", pollers), ("timers", timers)) if names]
    if left:
        pytest.fail(f"the test left background work running (never shut down): {'; '.join(left)}")


def _close_agent_clients() -> None:
    """The window's agent clients the test made (``AppServices.ensure_agent``: Browse, the Hosts tab's
    handshakes) are closed, as the window closes its own when it ends: one left open would retry its
    connection inside the next test once this test's agent ends."""
    module = sys.modules.get("gaudi_gui.services.agent_client")
    if module is None:
        return
    for obj in gc.get_objects():
        if isinstance(obj, module.AgentClient):
            with contextlib.suppress(RuntimeError):  # its C++ side is gone already
                obj.close()


#: What ending the test's agent ran into (said when something of the test is left running).
_AGENT_NOTES: list[str] = []


def _end_agent() -> None:
    """The test's agent (its GAUDI_GUI_HOME names its own), if one was started, ends with the test: it
    would otherwise wait out its idle time. Work it started is the test's to have ended. One being
    started as the test ended (a client asked for it at the last moment) is waited for and ended too."""
    from gaudi_gui.core import agentwire
    home = os.environ.get("GAUDI_GUI_HOME", "")
    _AGENT_NOTES.clear()

    def agent_processes() -> list[psutil.Process]:
        found = []
        for proc in processes_with_env("GAUDI_GUI_HOME", home):
            with contextlib.suppress(psutil.Error):
                if "agent" in proc.cmdline():
                    found.append(proc)
        return found

    for _round in range(3):
        try:
            sock = agentwire.try_connect()
        except agentwire.AgentError:
            return  # the test made its folder unusable: no agent could listen there
        deadline = time.monotonic() + 15
        while sock is None and time.monotonic() < deadline and agent_processes():
            time.sleep(0.1)
            with contextlib.suppress(agentwire.AgentError):
                sock = agentwire.try_connect()
        if sock is None:
            return
        try:
            with agentwire.Connection(sock, "test") as conn:
                pid = int(conn.agent.get("pid") or 0)
                conn.request("shutdown", timeout=10, force=True)
                wait_gone(pid, 10)
        except (agentwire.AgentError, OSError) as exc:
            _AGENT_NOTES.append(f"round {_round}: {type(exc).__name__}: {exc}")
        if not agent_processes():
            return
        _AGENT_NOTES.append(f"round {_round}: still there: {[p.pid for p in agent_processes()]}")


def _app_owner(timer: Any) -> str:
    """``Class.attribute`` of the app's object (a service or a view) that owns ``timer`` through its
    parents, "" when none does (pytest-qt's, Qt's own)."""
    owner = timer.parent()
    while owner is not None:
        if type(owner).__name__ == "GarbageCollector":
            return ""  # services.garbage: one per process, by design (the window thread's collector)
        if type(owner).__module__.startswith(("gaudi_gui.services", "gaudi_gui.ui")):
            name = next((k for k, v in getattr(owner, "__dict__", {}).items() if v is timer), "")
            return f"{type(owner).__name__}.{name or type(timer).__name__}"
        owner = owner.parent()
    return ""


def _assert_no_process_left(home: Path) -> None:
    """Every test, unit to integration: nothing it started may outlive it."""
    deadline = time.monotonic() + 20
    left = processes_with_env("GAUDI_GUI_HOME", str(home))
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = processes_with_env("GAUDI_GUI_HOME", str(home))
    if left:
        described = [(p.pid, " ".join(p.cmdline())[:120]) for p in left if p.is_running()]
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        notes = f" (ending its agent: {'; '.join(_AGENT_NOTES)})" if _AGENT_NOTES else ""
        pytest.fail(f"the test left processes running: {described}{notes}")


_CHAT_MODEL_SCRIPT = """
import shutil, sys
from pathlib import Path
import trl
from transformers import AutoTokenizer
src, out = Path(sys.argv[1]), Path(sys.argv[2])
shutil.copytree(src, out)
tok = AutoTokenizer.from_pretrained(out)
tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
tok.save_pretrained(out)
"""


@pytest.fixture(scope="session")
def chat_model_dir(tiny_model_dir: Path, session_home: Path) -> Path:
    """The tiny model with a real chat template (Qwen2.5's, as TRL ships it), built once per session."""
    out = session_home / "chat-model"
    return built_once(out, lambda: subprocess.run(
        [sys.executable, "-c", _CHAT_MODEL_SCRIPT, str(tiny_model_dir), str(out)], check=True,
        capture_output=True, timeout=120))


@pytest.fixture
def demo_model(tiny_model_dir: Path) -> Path:
    """Makes ``builtin:demo`` resolve to the session's tiny model (no 8-second rebuild per test)."""
    return tiny_model_dir


@pytest.fixture
def fake_hl_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ``hl-smi`` on PATH replaying recorded output; returns its path. Tune it with the
    FAKE_HLSMI_* variables (see tests/fake_hl_smi.py)."""
    folder = tmp_path / "fake-bin"
    folder.mkdir()
    program = folder / "hl-smi"
    fake = Path(__file__).parent / "fake_hl_smi.py"
    # fake.env beside it (tests.helpers.set_fake_hl_smi): what a test changes while the agent, whose
    # environment was fixed when it started, runs the loop.
    program.write_text(f"#!/bin/sh\n[ -r '{folder}/fake.env' ] && . '{folder}/fake.env'\n"
                       f"exec {sys.executable} {fake} \"$@\"\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_HLSMI_PERIOD", "0.1")
    return program


_BIG_MODEL_SCRIPT = """
import shutil, sys
from pathlib import Path
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
src, out, hidden, layers = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tok = AutoTokenizer.from_pretrained(src)
config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 4,
                     num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=8,
                     max_position_embeddings=256, tie_word_embeddings=False,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id)
model = LlamaForCausalLM(config)
model.save_pretrained(out)
tok.save_pretrained(out)
print(sum(p.numel() for p in model.parameters()))
"""


@pytest.fixture(scope="session")
def sized_model_dir(tiny_model_dir: Path, session_home: Path) -> Path:
    """A real Llama (hidden 256, 4 layers, ~5M parameters) with the demo tokenizer: its checkpoint
    (weights + Adam state, ~60 MB) takes seconds to write on the slow disk (``helpers.slow_disk_env``)."""
    out = session_home / "sized-model"
    return built_once(out, lambda: subprocess.run(
        [sys.executable, "-c", _BIG_MODEL_SCRIPT, str(tiny_model_dir), str(out), "256", "4"],
        check=True, capture_output=True, timeout=300))


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The real one-node Slurm cluster (tests/slurm_cluster.py), started once for the session as root,
    as CI runs. A machine where it cannot start fails the test with the reason (not root, slurm-wlm /
    munge not installed, a daemon's log): it is never skipped. Defined here, once, so that every
    folder's Slurm tests share one cluster per session (their xdist_group("slurm") puts them on one
    worker)."""
    cluster = SlurmCluster()
    try:
        cluster.start()
    except ClusterError as exc:
        cluster.stop()
        pytest.fail(f"the Slurm test cluster could not start: {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """The cluster, with SLURM_CONF set for this test's commands (and what they start)."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    return slurm_cluster

