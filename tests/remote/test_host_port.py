"""A host saved as ``user@host:port`` (the Hosts tab and ``hosts --add`` take that form): ssh itself
reads "host:port" as a host name, so every ssh the app starts names it as the URI ``ssh://user@host:port``.
Here against the test sshd on 127.0.0.1 and its own port: the handshake, a command on the host, and the
address ``ssh -G`` resolves for it (what a multi-host run tells the other hosts)."""

from __future__ import annotations

import getpass
import subprocess

from gaudi_gui.core import multi_host, remote
from gaudi_gui.core.remote import Host
from tests.remote.conftest import SshHost


def test_a_host_given_with_its_port_is_reached(ssh_host: SshHost) -> None:
    base = ssh_host.config.parent
    with ssh_host.config.open("a") as fh:  # the key and known host of the bare address (no alias)
        fh.write(f"\nHost 127.0.0.1\n  IdentityFile {base / 'client_key'}\n  IdentitiesOnly yes\n"
                 f"  UserKnownHostsFile {base / 'known_hosts'}\n  GlobalKnownHostsFile /dev/null\n"
                 "  StrictHostKeyChecking yes\n  LogLevel ERROR\n")
    host = Host.parse(f"{getpass.getuser()}@127.0.0.1:{ssh_host.port}")
    assert remote.ssh_target(host.name) == f"ssh://{host.name}"
    assert remote.ssh_target("gg-remote") == "gg-remote" and remote.ssh_target("[::1]") == "[::1]"
    hello = remote.handshake(host)
    assert hello["gaudi_gui"] and hello["hl_smi"].startswith(str(ssh_host.home.parent)), hello
    done = subprocess.run(host.wrap(["sh", "-c", "echo $GAUDI_GUI_HOME"]), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == str(ssh_host.home), done.stderr
    said = subprocess.run(multi_host.ssh_g_argv(host), capture_output=True, text=True, timeout=30).stdout
    assert multi_host.address_from_ssh_g(host, said) == "127.0.0.1"
    assert f"port {ssh_host.port}" in said.splitlines()
