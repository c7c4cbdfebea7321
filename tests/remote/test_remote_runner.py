"""The Model runner tab on a remote host, against a real SSH server and the system OpenSSH client: the
host chosen in the Host combo by a person's clicks and keys, the demo model loaded and answering there
with tokens streaming back, a prompt that would run code in a shell reaching the model as data, the
host's card selection set in the worker's environment on the host, an ssh failure said in words, a
worker of another gaudi-gui version refused with the fix, and nothing left on the host once the
connection drops. The worker is the host's agent's child, reached through this machine's agent: the
window starts no process."""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gaudi_gui.app import create_services
from gaudi_gui.core import remote
from gaudi_gui.core.remote import Host
from gaudi_gui.services import generation_client as gc
from gaudi_gui.ui.runner_tab import RunnerTab
from tests.helpers import choose_runner_host, click
from tests.remote.conftest import SshHost

pytestmark = pytest.mark.usefixtures("demo_model")

LOAD_TIMEOUT_MS = 180_000
EVIL = "hello '; touch /tmp/PWNED_$$ $(id) `id` \"$(touch /tmp/PWNED_x)\""


def click_load(qtbot, tab: RunnerTab) -> None:
    with qtbot.waitSignal(tab.client.model_loaded, timeout=LOAD_TIMEOUT_MS):
        click(qtbot, tab.load_button)
    qtbot.waitUntil(lambda: "Loaded" in tab.model_status.text() and tab.send_button.isEnabled())


def send(qtbot, tab: RunnerTab, text: str) -> None:
    tab.prompt.clear()
    qtbot.keyClicks(tab.prompt, text)
    assert tab.prompt.toPlainText() == text
    click(qtbot, tab.send_button)


def answer_once(qtbot, tab: RunnerTab, text: str) -> tuple[str, dict]:
    """A short greedy answer that ends by itself: (answer, stats)."""
    tab.max_new_tokens.setValue(12)
    with qtbot.waitSignal(tab.client.generation_finished, timeout=60000) as finished:
        send(qtbot, tab, text)
    return tab.conversation.last_answer(), dict(finished.args[0])


def host_workers(ssh_host: SshHost) -> list:
    """The generate workers running on the host (not the shell or the guard that started them)."""
    found = []
    for proc in ssh_host.processes():
        # A worker that ends between the listing and this look is not running: not one of them.
        with contextlib.suppress(psutil.Error):
            if proc.cmdline()[1:3] == ["-m", "gaudi_gui.workers.generate"]:
                found.append(proc)
    return found




def canaries(*folders: Path) -> set[str]:
    found = set(glob.glob("/tmp/PWNED_*"))
    for folder in folders:
        found |= {str(p) for p in folder.glob("PWNED*")}
    return found


@pytest.fixture
def tab(qtbot, ssh_host: SshHost) -> Iterator[RunnerTab]:
    remote.save_hosts([Host.parse(ssh_host.dest), Host.parse("gg-nokey")])
    services = create_services()
    # The host's card selection, made when the saved hosts were loaded (before any panel opened);
    # set as its Devices panel in the Hosts tab sets it: cards 2 and 3.
    assert services.hosts is not None
    selection = services.hosts.selection(ssh_host.dest)
    assert selection is not None and services.host_selections[ssh_host.dest] is selection
    selection.set_kind("hpu", list(range(8)))
    selection.set_selected([2, 3])
    widget = RunnerTab(services)
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    widget.activateWindow()
    yield widget
    widget.shutdown()
    qtbot.waitUntil(lambda: not widget.client.is_running(), timeout=15000)


def test_runner_on_a_host_streams_takes_the_prompt_as_data_and_leaves_nothing(
        qtbot, tab: RunnerTab, ssh_host: SshHost) -> None:
    before = canaries(ssh_host.home, Path.cwd())
    assert tab.host_combo.itemData(0) == remote.LOCAL and tab.client.host.is_local
    choose_runner_host(qtbot, tab, ssh_host.dest)
    # Browse… lists the host's folders (ui/remote_browser.py).
    assert tab.browse_button.isEnabled() and ssh_host.dest in tab.model_status.text()
    assert tab.model.currentText() == "builtin:demo"
    tab.chat_mode.setChecked(False)
    tab.do_sample.setChecked(False)

    click_load(qtbot, tab)
    assert f"of {ssh_host.dest}" in tab.model_status.text()
    # The worker runs on the host, under the guard, with the host's card selection in its environment.
    workers = host_workers(ssh_host)
    assert len(workers) == 1, [p.cmdline() for p in ssh_host.processes()]
    env = workers[0].environ()
    assert env["HABANA_VISIBLE_MODULES"] == "2,3" and env["PT_ENABLE_INT64_SUPPORT"] == "1"
    assert "HABANA_VISIBLE_MODULES" not in os.environ

    # A long answer streams back over ssh; Stop ends it.
    tab.max_new_tokens.setValue(100_000)
    send(qtbot, tab, "The learning rate")
    start = len(tab.view.toPlainText())
    qtbot.waitUntil(lambda: len(tab.view.toPlainText()) > start + 20, timeout=60000)
    click(qtbot, tab.stop_button)
    qtbot.waitUntil(lambda: "cancelled" in tab.stats.text(), timeout=15000)
    assert tab.send_button.isEnabled() and not tab.stop_button.isEnabled()

    # The same prompt, greedy, on the host and then here: the same tokens in, the same answer out,
    # so the host's model got the prompt byte for byte, as data.
    there, there_stats = answer_once(qtbot, tab, EVIL)
    assert f"▶ You: {EVIL}" in tab.view.toPlainText()
    assert there_stats["prompt_tokens"] > 10 and there
    assert canaries(ssh_host.home, Path.cwd()) == before

    choose_runner_host(qtbot, tab, remote.LOCAL)  # the host's worker is shut down; the next Load runs here
    assert tab.client.state == gc.STOPPED and tab.browse_button.isEnabled()
    qtbot.waitUntil(lambda: not host_workers(ssh_host), timeout=20000)
    click_load(qtbot, tab)
    here, here_stats = answer_once(qtbot, tab, EVIL)
    assert here == there and here_stats["prompt_tokens"] == there_stats["prompt_tokens"]

    # Back to the host: the worker is the host's agent's child (its pid is the host's), the window
    # started no process. Then the connection drops: the host's agent ends the worker with the link's
    # session, and the tab says the connection was lost.
    choose_runner_host(qtbot, tab, ssh_host.dest)
    click_load(qtbot, tab)
    (worker,) = host_workers(ssh_host)
    assert tab.client.pid() == worker.pid
    assert ssh_host.window_children() == []
    said: list[tuple[str, str]] = []
    tab.client.error_occurred.connect(lambda kind, message: said.append((kind, message)))
    with qtbot.waitSignal(tab.client.worker_exited, timeout=30000):
        ssh_host.drop()
    assert [kind for kind, _m in said] == ["dropped"], said
    assert said[0][1].startswith(f"the connection to {ssh_host.dest} was lost"), said
    qtbot.waitUntil(lambda: f"the connection to {ssh_host.dest} was lost" in tab.model_status.text(),
                    timeout=5000)
    assert tab.client.state == gc.STOPPED and tab.load_button.isEnabled()
    assert ssh_host.wait_no_processes(30, but_agent=True) == []
    assert canaries(ssh_host.home, Path.cwd()) == before


def test_an_ssh_failure_is_said_in_words(qtbot, tab: RunnerTab, ssh_host: SshHost) -> None:
    choose_runner_host(qtbot, tab, "gg-nokey")  # a host whose server does not accept our key
    said: list[tuple[str, str]] = []
    tab.client.error_occurred.connect(lambda kind, message: said.append((kind, message)))
    click(qtbot, tab.load_button)
    qtbot.waitUntil(lambda: bool(said), timeout=60000)
    assert [kind for kind, _m in said] == ["auth"], said  # what else was said, if not that
    assert "ssh-copy-id gg-nokey" in said[0][1]
    qtbot.waitUntil(lambda: "ssh-copy-id gg-nokey" in tab.model_status.text(), timeout=5000)
    assert "255" not in tab.model_status.text()
    assert tab.load_button.isEnabled() and tab.client.state == gc.STOPPED
    assert ssh_host.wait_no_processes() == []
    assert ssh_host.window_children() == []  # this machine's agent tried the host, not the window


def test_guard_sets_checked_env_and_runs_python_argv() -> None:
    """``guard --env NAME=VALUE`` (checked, never a shell) with ``--python`` running this interpreter."""
    import subprocess
    import sys

    code = "import os, sys; sys.stdout.write(os.environ['GG_X'] + '|' + os.environ['GG_Y'])"
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "guard", "--python", "--env", "GG_X=a b; $(id)",
                           "--env", "GG_Y=", "--", "-c", code], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "a b; $(id)|"
    for bad in ("1X=1", "NO_EQUALS", "A-B=1", "-X=1"):
        done = subprocess.run([sys.executable, "-m", "gaudi_gui", "guard", f"--env={bad}", "--", "true"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 2 and "--env takes NAME=VALUE" in done.stderr, (bad, done.stderr)


def test_a_worker_of_another_gaudi_gui_is_refused_with_the_fix(qtbot, ssh_host: SshHost,
                                                               tmp_path: Path) -> None:
    """A host whose remote command runs another gaudi-gui version: its worker's ready message says
    so, the worker is ended before it is given anything, and the tab says why with the fix."""
    import re
    import shutil
    import sys

    import gaudi_gui
    other = tmp_path / "other"
    shutil.copytree(Path(gaudi_gui.__file__).parent, other / "gaudi_gui",
                    ignore=shutil.ignore_patterns("__pycache__"))
    init = other / "gaudi_gui" / "__init__.py"
    init.write_text(re.sub(r'__version__ = "[^"]+"', '__version__ = "0.0.9"', init.read_text()))
    remote.save_hosts([Host.parse(ssh_host.dest, f"env PYTHONPATH={other} {sys.executable} -m gaudi_gui")])
    services = create_services()
    widget = RunnerTab(services)
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    try:
        choose_runner_host(qtbot, widget, ssh_host.dest)
        with qtbot.waitSignal(widget.client.error_occurred, timeout=60000,
                              check_params_cb=lambda kind, _m: kind == "version") as error:
            click(qtbot, widget.load_button)
        assert f"{ssh_host.dest} runs gaudi-gui 0.0.9" in error.args[1]
        assert f"gaudi-gui hosts --setup {ssh_host.dest}" in error.args[1]
        qtbot.waitUntil(lambda: "runs gaudi-gui 0.0.9" in widget.model_status.text(), timeout=5000)
        assert widget.client.state == gc.STOPPED and widget.load_button.isEnabled()
        assert "loaded" not in widget.model_status.text().lower()
    finally:
        widget.shutdown()
        qtbot.waitUntil(lambda: not widget.client.is_running(), timeout=15000)
    assert ssh_host.wait_no_processes(but_agent=True) == []  # the load gate asked the host's agent
