"""``--host`` on the command line, against a real SSH server and the system OpenSSH client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import children_get_sigint
from tests.remote.conftest import SshHost


def gg(*args: str, timeout: float = 120, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ), **kw)  # type: ignore[call-overload]


def test_devices_over_ssh_parse_the_hosts_cards(ssh_host: SshHost) -> None:
    res = gg("devices", "--host", ssh_host.dest, "--json")
    assert res.returncode == 0, res.stderr
    cards = [c for c in json.loads(res.stdout) if c["kind"] == "hpu"]
    assert len(cards) == 8 and {c["module_id"] for c in cards} == set(range(8))
    assert ssh_host.wait_no_processes() == []


def test_hosts_lists_local_and_ssh_config_aliases_checked(ssh_host: SshHost) -> None:
    res = gg("hosts", "--json")
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert next(iter(rows)) == "local"
    remote = rows[ssh_host.dest]
    assert remote["reachable"] and remote["gaudi_gui"] and remote["device"] == "hpu" and remote["cards"] == 8
    assert remote["source"] == "ssh-config"
    nokey = rows["gg-nokey"]
    assert not nokey["reachable"] and "ssh-copy-id gg-nokey" in nokey["error"]
    unknown = rows["gg-unknown-key"]
    assert not unknown["reachable"] and "host key" in unknown["error"]
    assert res.returncode == 1  # a host did not answer


def test_a_host_without_gaudi_gui_says_how_to_fix_it(ssh_host: SshHost) -> None:
    res = gg("devices", "--host", ssh_host.dest, "--remote-command", "python3 -m no_such_module", "--json")
    assert res.returncode == 3
    assert "gaudi-gui hosts --setup gg-remote" in res.stderr and "Traceback" not in res.stderr


def test_a_bad_destination_is_refused_before_ssh(ssh_host: SshHost) -> None:
    res = gg("devices", "--host", "-oProxyCommand=touch /tmp/x", "--json")
    assert res.returncode == 2 and "cannot begin with '-'" in res.stderr


def test_generate_over_ssh_takes_path_and_prompt_as_data(ssh_host: SshHost, tiny_model_dir: Path,
                                                         tmp_path: Path) -> None:
    # A model folder and a prompt that would run code if anything reached the remote shell unquoted
    # (the remote commands run in the server's folder, this repository: canaries would land there).
    canary = f"gg-canary-{os.getpid()}"
    evil_dir = tmp_path / f"my model $(touch {canary}-path); '\" x"
    evil_dir.mkdir()
    for item in tiny_model_dir.iterdir():
        (evil_dir / item.name).symlink_to(item)
    prompt = f"hello'; touch {canary}-prompt; echo \"$(touch {canary}-subst)\" `touch {canary}-tick`"
    res = gg("generate", "--host", ssh_host.dest, "--model", str(evil_dir), "--prompt", prompt,
             "--max-new-tokens", "8", "--device", "cpu", "--json", timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["stats"]["tokens"] >= 1 and isinstance(out["text"], str)
    assert list(Path.cwd().glob("gg-canary-*")) == [] and list(tmp_path.glob("gg-canary-*")) == []
    assert ssh_host.wait_no_processes() == []


def test_ctrl_c_on_a_forwarded_command_ends_it_on_the_host(ssh_host: SshHost, tiny_model_dir: Path) -> None:
    """Ctrl+C (SIGINT to the local command, which runs ssh in a session of its own) closes the
    forwarded command's stdin: the host's guard ends the generation, nothing is left on the host,
    and the local command ends with the host's status."""
    import signal
    import time

    with children_get_sigint():  # Ctrl-C (SIGINT) as from a terminal
        proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "generate", "--host", ssh_host.dest,
                                 "--model", str(tiny_model_dir), "--prompt", "once upon a time",
                                 "--max-new-tokens", "100000", "--device", "cpu"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=dict(os.environ))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # the host's generation is running
        if any("gaudi_gui.workers.generate" in line for line in ssh_host.command_lines()):
            break
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "Traceback" not in err, err[-2000:]
    assert ssh_host.wait_no_processes() == []
