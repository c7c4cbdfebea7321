"""Screenshot of the Hosts overview with real hosts over SSH.

``python scripts/screenshot_hosts.py OUT.png``

Two "Gaudi servers" are this machine behind the tests' SSH server on 127.0.0.1 (tests/sshd.py), each
replaying the recorded 8-card hl-smi output through the fake hl-smi, reached with the system OpenSSH
client exactly as the app reaches any host; a third host points at a closed port, so the screenshot
also shows how an unreachable host looks. The Hosts tab is opened by clicking its tab.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOSTS = ("gaudi-node-1", "gaudi-node-2")
DOWN = "gaudi-node-3"


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def start_server(base: Path) -> tuple[subprocess.Popen, Path]:
    """The SSH server and an ssh config naming the hosts (returns the server and the config)."""
    _keygen(base / "client_key")
    _keygen(base / "host_key")
    fake_bin = base / "bin"
    fake_bin.mkdir()
    program = fake_bin / "hl-smi"
    program.write_text(f"#!/bin/sh\nexec {sys.executable} {ROOT / 'tests' / 'fake_hl_smi.py'} \"$@\"\n")
    program.chmod(0o755)
    env = dict(os.environ)
    env.update({"GAUDI_GUI_HOME": str(base / "remote-home"), "FAKE_HLSMI_PERIOD": "0.5",
                "PATH": os.pathsep.join([str(fake_bin), str(Path(sys.executable).parent), env["PATH"]])})
    port_file = base / "port"
    server = subprocess.Popen([sys.executable, str(ROOT / "tests" / "sshd.py"), "--host-key",
                               str(base / "host_key"), "--authorized-keys", str(base / "client_key.pub"),
                               "--port-file", str(port_file), "--cwd", str(base)], env=env,
                              start_new_session=True)
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("screenshot_hosts: the SSH server did not start")
        time.sleep(0.05)
    port = int(port_file.read_text())
    key = (base / "host_key.pub").read_text().split()
    (base / "known_hosts").write_text(f"[127.0.0.1]:{port} {key[0]} {key[1]}\n")
    common = (f"  HostName 127.0.0.1\n  User {getpass.getuser()}\n  IdentityFile {base / 'client_key'}\n"
              f"  IdentitiesOnly yes\n  UserKnownHostsFile {base / 'known_hosts'}\n  LogLevel ERROR\n")
    config = base / "config"
    config.write_text(f"Host {' '.join(HOSTS)}\n  Port {port}\n{common}\nHost {DOWN}\n  Port 1\n{common}")
    return server, config


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "docs/hosts.png"
    base = Path(tempfile.mkdtemp(prefix="gg-hosts-"))
    home = base / "home"
    os.environ["GAUDI_GUI_HOME"] = str(home)
    os.environ.pop("GAUDI_GUI_HL_SMI", None)  # this "workstation" has no cards (no hl-smi on PATH)
    server, config = start_server(base)
    os.environ["GAUDI_GUI_SSH_CONFIG"] = str(config)
    os.environ["GAUDI_GUI_SSH_CONTROL_DIR"] = tempfile.mkdtemp(prefix="ggc-")
    from gaudi_gui.core import remote
    remote.save_hosts([remote.Host.parse(name) for name in (*HOSTS, DOWN)])

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from PySide6.QtCore import QPoint, Qt, QTimer
    from PySide6.QtTest import QTest
    from shot import open_window, run

    app, services, window = open_window(0, 1280, 800)
    services.poller.start()  # this workstation's own state (no hl-smi here: host only)
    bar = window.tabs.tabBar()
    index = next(i for i in range(window.tabs.count()) if window.tabs.tabText(i).replace("&", "") == "Hosts")
    center = bar.tabRect(index).center()
    QTest.mouseClick(bar, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier,
                     QPoint(center.x(), center.y()))
    from gaudi_gui.ui.hosts_tab import STATE
    tab = window.hosts_tab
    started = time.monotonic()

    def ready() -> bool:
        items = tab._items
        return (all(items[h].childCount() == 8 and items[h].text(STATE) == "ok" for h in HOSTS if h in items)
                and DOWN in items and "unreachable" in items[DOWN].text(STATE))

    def poll() -> None:
        if ready() or time.monotonic() - started > 60:
            if not ready():
                print("screenshot_hosts: not every host answered in 60 s; shooting anyway", file=sys.stderr)
            tab.tree.setCurrentItem(tab._items[HOSTS[0]])
            QTimer.singleShot(300, lambda: (window.grab().save(out), window.close()))
            return
        QTimer.singleShot(200, poll)

    QTimer.singleShot(200, poll)
    run(app)
    server.send_signal(signal.SIGTERM)
    server.wait(10)
    shutil.rmtree(base, ignore_errors=True)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
