"""core.preflight, the start gate's orchestration, without Qt: the plan (no child at all on a machine
without hl-smi), each host's doctor argv, replies read into a Report (a crash, garbage or a timeout is
a host that did not answer, named), the per-host verdict, real doctor children against the fake
hl-smi's sick 8-card server, and the node check the Slurm batch script runs before its launch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gaudi_gui.core import preflight, slurm
from gaudi_gui.core.child import Outcome
from gaudi_gui.core.health import Finding, HostHealth, Report
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.preflight import Plan, Target
from tests.helpers import sick_server_env

CARDS = tuple({"index": i, "module_id": i, "bus_id": f"0000:{0x19 + i:02x}:00.0", "name": "HL-225"}
              for i in range(8))



@pytest.fixture
def sick_server(fake_hl_smi: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake hl-smi's sick 8-card server (module 1 ports down, 2 double-bit ECC, 3 at 0 C, 5 power
    slowdown) with module 6 held by pid 4242 through a fixture /proc, for this test and its children."""
    for key, value in {**sick_server_env(tmp_path), "FAKE_HLSMI_DRIVER": "1.23.0"}.items():
        monkeypatch.setenv(key, value)
    return fake_hl_smi


def _no_hl_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("GAUDI_GUI_HL_SMI", raising=False)


def test_no_hl_smi_no_cards_no_child(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _no_hl_smi(monkeypatch, tmp_path)
    assert preflight.local_plan([0, 1], uses_cards=True).empty
    assert preflight.check(preflight.local_plan(None, uses_cards=True)).ok


def test_plan_and_argv(sick_server: Path) -> None:
    assert preflight.local_plan([1, 0, 1], uses_cards=False).empty  # the run does not use the cards
    plan = preflight.local_plan([1, 0, 1], uses_cards=True)
    assert plan.targets == (Target("local", (0, 1)),) and not plan.multi_node
    assert preflight.local_plan([], uses_cards=True).targets == (Target("local", None),)
    argv = preflight.doctor_argv(plan.targets[0], plan, python="py")
    assert argv[:5] == ["py", "-m", "gaudi_gui", "doctor", "--json"] and "--host" not in argv
    # Every card is checked (no --cards): the refusal can then name free, healthy ones.
    assert "--cards" not in argv
    explicit = preflight.local_plan([0], uses_cards=True, hl_smi=str(sick_server))
    assert preflight.doctor_argv(explicit.targets[0], explicit)[-2:] == ["--hl-smi", str(sick_server)]
    hosts = preflight.hosts_plan([Target("gg-a", (2, 3)), Target("gg-b; rm -rf /", None, "py -m gaudi_gui")])
    assert hosts.multi_node
    argv_b = preflight.doctor_argv(hosts.targets[1], hosts)
    # One argv element each: nothing reaches a shell here.
    assert argv_b[-4:] == ["--host", "gg-b; rm -rf /", "--remote-command", "py -m gaudi_gui"]
    assert not preflight.hosts_plan([Target("gg-a")]).multi_node


def test_replies_that_are_not_reports_name_the_host() -> None:
    target = Target("gg-a")
    crashed = preflight.host_reply(target, Outcome("Traceback ...", 1, ("boom", "ImportError: x")))
    assert not crashed.reachable and "exited with code 1" in crashed.error
    assert "ImportError: x" in crashed.error
    killed = preflight.host_reply(target, Outcome("", -9))
    assert "killed by signal 9 without a report: no output" in killed.error
    missing = preflight.host_reply(target, Outcome(tail=("could not start nothere: not found",)))
    assert missing.error == "the doctor could not start: could not start nothere: not found"
    late = preflight.host_reply(target, Outcome(code=-9, timed_out=True), timeout_s=35)
    assert not late.reachable and "within 35 s" in late.error
    verdict = preflight.decide(Plan((target,)), Report(hosts=(late,)))
    assert not verdict.ok and verdict.errors[0].startswith("gg-a did not answer")
    local = Report(hosts=(HostHealth("local", True, cards=CARDS),)).to_json()
    import json
    got = preflight.host_reply(Target("gg-b"), Outcome(json.dumps(local), 0))
    assert got.host == "gg-b" and got.reachable


def _host(name: str, *findings: Finding, free: tuple[int, ...] = tuple(range(8)),
          versions: dict[str, str] | None = None) -> HostHealth:
    return HostHealth(name, True, "", tuple(findings), CARDS, free, versions or {"driver": "1.23.0"})


def test_decide_per_host_cards_missing_cards_and_versions() -> None:
    held = Finding("busy.held", "error", "held by pid 42", "stop it", 6, 6, "gg-a")
    down = Finding("net.ports", "error", "ports 2,5 DOWN", "check cables", 1, 1, "gg-b")
    a = _host("gg-a", held, free=(0, 1, 2, 3, 4, 5, 7))
    b = _host("gg-b", down, versions={"driver": "1.22.0"})
    plan = preflight.hosts_plan([Target("gg-a", (6, 7)), Target("gg-b", (0, 1))])
    verdict = preflight.decide(plan, preflight.combine([a, b]))
    text = "; ".join(verdict.errors)
    assert "gg-a: module 6: held by pid 42" in text
    assert "gg-b: module 1: ports 2,5 DOWN" in text  # several hosts: a multi-node run
    assert "driver differs" in text
    assert verdict.suggestion == ("gg-a: modules 0 and 1 are healthy and free: use them; "
                                  "gg-b: modules 2 and 3 are healthy and free: use them")
    # The same card on one host, one machine: ports down is a warning; cards not chosen do not count.
    single = preflight.decide(Plan((Target("gg-b", (0, 1)),)), Report(hosts=(b,)))
    assert single.ok and any("ports 2,5 DOWN" in w for w in single.warnings) and single.confirm
    assert not preflight.decide(Plan((Target("gg-b", (2, 3)),)), Report(hosts=(b,))).confirm
    stack = Finding("stack.compat", "warning", "1.12.1 is not in the table", "update it", host="gg-a")
    only_stack = preflight.decide(Plan((Target("gg-a", (4, 5)),)), Report(hosts=(_host("gg-a", stack),)))
    assert only_stack.ok and only_stack.warnings and not only_stack.confirm  # shown, not asked
    assert preflight.decide(Plan((Target("gg-a", (4, 5)),)), Report(hosts=(a,))).ok
    missing = preflight.decide(Plan((Target("local", (9,)),)), Report(hosts=(_host("local"),)))
    assert missing.errors == ("no card with module id 9 (cards there: 0,1,2,3,4,5,6,7)",)
    assert "refused the start" in missing.message()


def test_real_doctor_children_on_the_sick_server(sick_server: Path) -> None:
    refused = preflight.check(preflight.local_plan([6, 7], uses_cards=True))
    assert not refused.ok
    assert "module 6: held by pid 4242" in refused.message()
    assert refused.suggestion == "modules 4 and 5 are healthy and free: use them"
    dead = preflight.check(preflight.local_plan([3], uses_cards=True))
    assert not dead.ok and "0 C" in dead.errors[0]
    fine = preflight.check(preflight.local_plan([4, 7], uses_cards=True))
    # Free, healthy cards: no card warning and nothing to confirm. The stack warnings of this CPU venv
    # on a 1.23.0 server (no habana-torch-plugin, another torch) are shown, never asked about.
    assert fine.ok and not fine.confirm, fine.message()
    assert not [w for w in fine.warnings if w.startswith("card ")], fine.warnings
    assert any("habana-torch-plugin is not installed" in w for w in fine.warnings)
    warned = preflight.check(preflight.local_plan([5], uses_cards=True))
    assert warned.ok and any("power slowdown" in w for w in warned.warnings) and warned.confirm


def test_a_host_that_does_not_answer_is_named(sick_server: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # ssh to a port nobody listens on: the doctor child reports the host unreachable.
    config = tmp_path / "ssh_config"
    config.write_text("Host gg-down\n  HostName 127.0.0.1\n  Port 1\n  ConnectTimeout 5\n"
                      "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
    monkeypatch.setenv("GAUDI_GUI_SSH_CONFIG", str(config))
    verdict = preflight.check(preflight.hosts_plan([Target("gg-down", (0,))], timeout_s=15))
    assert not verdict.ok and verdict.errors[0].startswith("gg-down did not answer"), verdict.errors


def test_a_hanging_child_times_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hang = tmp_path / "hang.py"
    hang.write_text("import time\ntime.sleep(600)\n")
    monkeypatch.setattr(preflight, "_GRACE_S", 0.5)
    python = tmp_path / "python"
    # The child "python" ignores its arguments and hangs: the gate must still answer.
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {hang}\n")
    python.chmod(0o755)
    verdict = preflight.check(Plan((Target("gg-slow"),), timeout_s=1), python=str(python))
    assert verdict.errors == ("gg-slow did not answer: the check did not answer within 1.5 s",)
    assert verdict.elapsed_s < 10


def test_node_check_uses_the_visible_modules(sick_server: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "6")
    code, lines = preflight.node_check(multi_node=False, host="n1")
    assert code == 1 and any("card check failed (cards 6): module 6: held by pid 4242" in ln for ln in lines)
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "1,4")
    assert preflight.node_check(multi_node=False, host="n1")[0] == 0  # ports down: one node is fine
    code, lines = preflight.node_check(multi_node=True, host="n1")
    assert code == 1 and "gaudi-gui: n1: modules 4 and 5 are healthy and free: use them" in lines
    monkeypatch.setenv(preflight.SKIP_ENV, "1")
    assert preflight.node_check(multi_node=True, host="n1")[0] == 0


def test_node_check_without_hl_smi_passes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _no_hl_smi(monkeypatch, tmp_path)
    assert preflight.node_check(multi_node=True, host="n1") == (0, ["gaudi-gui: n1: no hl-smi: no Gaudi "
                                                                    "cards to check"])


def _script(tmp_path: Path, **options: object) -> str:
    opts = slurm.SlurmOptions(**options)  # type: ignore[arg-type]
    base = JobConfig(training_args={"output_dir": str(tmp_path / "out"), "max_steps": 2})
    job = slurm.slurm_job(base, opts)
    return slurm.sbatch_script(job, tmp_path / "run", opts)


def test_slurm_script_checks_gaudi_nodes_before_the_launch(sick_server: Path, tmp_path: Path) -> None:
    script = _script(tmp_path, device="hpu", nodes=2, python=sys.executable)
    lines = script.splitlines()
    check = next(i for i, ln in enumerate(lines) if "gaudi_gui.core.preflight node" in ln)
    assert "--multi-node" in lines[check] and check < lines.index('if [ "$STOP" = 1 ]; then exit 0; fi')
    assert "gaudi_gui.core.preflight" not in _script(tmp_path, device="cpu")
    assert "gaudi_gui.core.preflight" not in _script(tmp_path, device="hpu", preflight=False)
    # The check's lines as bash runs them, with an srun that runs its command once (one node): a held
    # card ends the script with the doctor's reason, a free one goes on.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nwhile [ \"${1#-}\" != \"$1\" ]; do shift; done\nexec \"$@\"\n")
    (fake / "srun").chmod(0o755)
    block = "\n".join(lines[check - 1:check + 4]) + "\necho launched\n"
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}", SLURM_JOB_NUM_NODES="1")
    held = subprocess.run(["bash", "-c", block], capture_output=True, text=True, timeout=120,
                          env=dict(env, HABANA_VISIBLE_MODULES="6"), check=False)
    assert held.returncode == 1 and "launched" not in held.stdout, held.stdout + held.stderr
    assert "module 6: held by pid 4242" in held.stdout and "the job ends before the launch" in held.stdout
    free = subprocess.run(["bash", "-c", block], capture_output=True, text=True, timeout=120,
                          env=dict(env, HABANA_VISIBLE_MODULES="4,7"), check=False)
    assert free.returncode == 0 and free.stdout.rstrip().endswith("launched"), free.stdout + free.stderr
