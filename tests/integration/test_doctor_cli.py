"""``gaudi-gui doctor`` as a user runs it: a real child process against the fake hl-smi's sick 8-card
server (with fixture sysfs / proc / dev roots), a CPU machine without hl-smi, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import sick_server_env


def doctor(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", "doctor", *args], capture_output=True,
                          text=True, timeout=120, env=env)



@pytest.fixture
def sick_server(fake_hl_smi: Path, tmp_path: Path) -> dict[str, str]:
    """Env for a sick 8-card server: all modules loaded, 8 nodes, card 6 held by pid 4242."""
    return dict(os.environ, **sick_server_env(tmp_path))


def test_sick_server_names_each_sick_card_with_its_fix(sick_server: dict[str, str]) -> None:
    done = doctor(env=sick_server)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stdout.splitlines()

    def line(card: int, check: str) -> str:
        hits = [ln for ln in lines if f"module {card} " in ln and check in ln]  # a card's one name
        assert hits, f"no {check} line for card {card} in:\n{done.stdout}"
        return hits[0]

    assert line(1, "net.ports").startswith("ERROR") and "2,5 DOWN" in line(1, "net.ports")
    assert "ECC 2" in line(2, "card.ecc") and "pending: Yes" in line(2, "card.ecc")
    assert "0 C" in line(3, "card.init") and "-> reset the card" in line(3, "card.init")
    assert line(5, "card.throttle").startswith("WARNING") and "power slowdown" in line(5, "card.throttle")
    # The /proc scan and hl-smi's own process list agree on pid 4242; hl-smi gives its name.
    assert "pid 4242 (python3 train.py)" in line(6, "busy.held") and "->" in line(6, "busy.held")
    assert ("local: healthy and free: modules 0, 4, 5 and 7 (module 5: power slowdown active); "
            "for 2 cards: modules 4 and 5; for 4 cards: none of 0,1,2,3 / 4,5,6,7") in done.stdout


def test_sick_server_json_is_the_report(sick_server: dict[str, str]) -> None:
    done = doctor("--json", env=sick_server)
    assert done.returncode == 1
    data = json.loads(done.stdout)
    assert data["version"] == 1 and data["errors"] >= 4
    (host,) = data["hosts"]
    assert host["reachable"] and len(host["cards"]) == 8 and 6 not in host["free_modules"]
    assert host["versions"]["driver"].startswith("1.12.1")
    bad = {(f["module_id"], f["check"]) for f in host["findings"] if f["severity"] == "error"}
    assert {(1, "net.ports"), (2, "card.ecc"), (3, "card.init"), (6, "busy.held")} <= bad


def test_only_chosen_cards_are_checked(sick_server: dict[str, str]) -> None:
    done = doctor("--json", "--cards", "4,5", env=sick_server)
    assert done.returncode == 0, done.stdout
    mods = {f["module_id"] for f in json.loads(done.stdout)["hosts"][0]["findings"]}
    assert mods <= {None, 4, 5}


def test_cpu_machine_without_hl_smi(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GAUDI_GUI_HL_SMI"}
    env["PATH"] = str(tmp_path)
    done = doctor(env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no Gaudi cards" in done.stdout and "accelerate" in done.stdout


def test_accel_nodes_without_hl_smi_is_an_error(tmp_path: Path) -> None:
    """A machine with /dev/accel nodes (a fixture /dev) and no hl-smi: an error naming what was seen,
    exit 1 (it said "no hl-smi: … fine on a CPU" and exit 0)."""
    dev = tmp_path / "dev"
    (dev / "accel").mkdir(parents=True)
    for i in range(8):
        (dev / "accel" / f"accel{i}").touch()
    env = {k: v for k, v in os.environ.items() if k != "GAUDI_GUI_HL_SMI"}
    env.update(PATH=str(tmp_path), GAUDI_GUI_DOCTOR_DEV=str(dev))
    done = doctor(env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = [ln for ln in done.stdout.splitlines() if "stack.hl-smi" in ln]
    assert line.startswith("ERROR") and "no hl-smi, but 8 /dev/accel nodes (accel0..accel7)" in line
    assert "no Gaudi cards" not in done.stdout and "Traceback" not in done.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--cards", "x"], "--cards"),
    (["--host", "a", "--hosts", "b,c"], "not both"),
    (["--remote-command", "gg"], "needs --host"),
    (["--smoke", "--smoke-timeout", "nan"], "--smoke-timeout"),
    (["--smoke", "--smoke-timeout", "0"], "--smoke-timeout"),
    (["--timeout", "inf"], "--timeout"),
    (["--timeout", "-5"], "--timeout"),
])
def test_bad_input_one_line_exit_2(args: list[str], message: str) -> None:
    done = doctor(*args, env=dict(os.environ))
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_unknown_card_id_exit_2(sick_server: dict[str, str]) -> None:
    done = doctor("--cards", "9", env=sick_server)
    assert done.returncode == 2 and "no card with module id 9" in done.stderr


# -- the smoke test's orchestration with real children ---------------------------------------------

CHILD = """
import os, sys, time
card = os.environ.get("HABANA_VISIBLE_MODULES")
assert os.environ.get("PT_ENABLE_INT64_SUPPORT") == "1"
if card == "0":
    print("SMOKE OK hpu")
elif card == "1":
    print("synStatus=20 [Device already acquired]"); sys.exit(1)
elif card == "2":
    print("Device acquire failed"); sys.exit(1)
else:
    import subprocess
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a grandchild
    time.sleep(600)
"""


def test_smoke_children_pass_fail_and_hang(tmp_path: Path) -> None:
    import time

    import psutil

    from gaudi_gui.core import health

    script = tmp_path / "child.py"
    script.write_text(CHILD)
    started = time.monotonic()
    got = health.run_smoke("hpu", [(0, 4), (1, 5), (2, 6), (3, 7)], timeout_s=3.0,
                           argv=[sys.executable, str(script)])
    assert time.monotonic() - started < 15  # in parallel, bounded by the timeout
    by = {f.module_id: f for f in got}
    assert by[0].severity == "ok" and by[0].index == 4
    assert by[1].severity == "error" and "held by another process" in by[1].seen
    assert by[2].severity == "error" and "acquire failed" in by[2].seen
    assert by[3].severity == "error" and "timed out after 3 s" in by[3].seen
    left = [p for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])
            or "time.sleep(600)" in " ".join(p.info["cmdline"] or [])]
    assert not left, left


def test_cpu_machine_smoke_runs_one_cpu_child(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GAUDI_GUI_HL_SMI"}
    env["PATH"] = str(tmp_path)
    done = doctor("--smoke", "--json", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    smoke = [f for f in json.loads(done.stdout)["hosts"][0]["findings"] if f["check"] == "smoke"]
    assert len(smoke) == 1 and smoke[0]["severity"] == "ok"


def test_report_packs_findings_query_kernel_and_redacted_run_logs(sick_server: dict[str, str],
                                                                  tmp_path: Path) -> None:
    import tarfile

    from gaudi_gui.core.jobconfig import JobConfig
    from gaudi_gui.core.runstore import RunStore

    run = RunStore().create(JobConfig())  # this test's GAUDI_GUI_HOME (tests/conftest.py)
    run.update_status(state="running")
    token = "hf_" + "a1B2c3D4e5" * 3
    run.log_path.write_text(f"step 1\nlogin with {token}\nstep 2 loss 1.5\n")
    out = tmp_path / "report.tar.gz"
    done = doctor("--report", str(out), env=dict(sick_server, GAUDI_GUI_HOME=os.environ["GAUDI_GUI_HOME"]))
    assert done.returncode == 1 and out.exists(), done.stderr
    with tarfile.open(out) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()  # type: ignore[union-attr]
                 for m in tar.getmembers()}
    assert {"findings.json", "findings.txt", "versions.json", "hl-smi-q.txt", "kernel.txt",
            "runs.txt"} <= set(files)
    assert "Double Bit ECC          : 2" in files["hl-smi-q.txt"]
    assert files["kernel.txt"].strip()  # the lines, or why dmesg could not be read
    assert "step 2 loss 1.5" in files["runs.txt"] and token not in files["runs.txt"]
    assert json.loads(files["findings.json"])["errors"] >= 4


def _train(job: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", "train", "--config", str(job), *args],
                          capture_output=True, text=True, timeout=120, env=env)


def test_train_preflight_refuses_a_bad_card_and_accepts_free_ones(
        sick_server: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gaudi_gui.core.jobconfig import JobConfig

    job = tmp_path / "job.json"
    JobConfig(training_args={"output_dir": str(tmp_path / "out"), "max_steps": 1}).save(job)
    refused = _train(job, "--cards", "2,3", env=sick_server)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "preflight refused" in refused.stderr and "module 2" in refused.stderr
    assert "modules 4 and 5 are healthy and free: use them" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) >= 1 and "Traceback" not in refused.stderr
    # Free, healthy cards pass the gate (the same function train calls, here in-process: starting a
    # real launch on this CPU machine would only test the launcher).
    from gaudi_gui.commands.doctor import preflight
    for key in ("FAKE_HLSMI_MODE", "GAUDI_GUI_DOCTOR_SYSFS", "GAUDI_GUI_DOCTOR_PROC", "GAUDI_GUI_DOCTOR_DEV"):
        monkeypatch.setenv(key, sick_server[key])
    assert preflight([4, 5]) == ""
    assert "module 6" in preflight([6, 7])


# -- what a bug report may carry, and the processes the doctor starts ------------------------------


def test_report_redacts_credentials_and_is_private(sick_server: dict[str, str], tmp_path: Path) -> None:
    """The running runs' log lines carry the environment's own HF_TOKEN value, a Bearer token, a
    password, a password in a URL and a private key: none reaches any form of the report, which only
    its owner can read."""
    import stat
    import tarfile

    from gaudi_gui.core.jobconfig import JobConfig
    from gaudi_gui.core.runstore import RunStore

    env_token = "Qz7-plain-env-token-5521"  # no known token shape: only the environment names it
    secrets = {"env": env_token, "bearer": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
               "password": "hunter2-horse", "url": "s3cr3t-in-url", "key": "MIIEvQIBADANBgkqhkiG9w0BAQEF"}
    run = RunStore().create(JobConfig())  # this test's GAUDI_GUI_HOME (tests/conftest.py)
    run.update_status(state="running")
    run.log_path.write_text(
        f"step 1\n{env_token}\nAuthorization: Bearer {secrets['bearer']}\npassword: {secrets['password']}\n"
        f"git clone https://alice:{secrets['url']}@git.example.com/org/repo.git\n"
        f"-----BEGIN PRIVATE KEY-----\n{secrets['key']}AASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\n"
        "MzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDuictGeurT8jNbvJZHtCSuYEvu\n-----END PRIVATE KEY-----\n"
        "step 2 loss 1.5\n")
    env = dict(sick_server, HF_TOKEN=env_token)
    tar_path, txt_path = tmp_path / "report.tar.gz", tmp_path / "report.txt"
    texts: dict[str, str] = {}
    for path in (tar_path, txt_path):
        done = doctor("--report", str(path), env=env)
        assert done.returncode == 1 and path.exists(), done.stderr
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, oct(path.stat().st_mode)
    with tarfile.open(tar_path) as tar:
        texts["tar.gz"] = "\n".join(tar.extractfile(m).read().decode()  # type: ignore[union-attr]
                                    for m in tar.getmembers())
    texts["txt"] = txt_path.read_text()
    printed = doctor("--report", "-", env=env)
    assert printed.returncode == 1, printed.stderr
    texts["-"] = printed.stdout
    for form, text in texts.items():
        assert "step 2 loss 1.5" in text and "git.example.com/org/repo.git" in text, form
        leaked = [name for name, value in secrets.items() if value in text]
        assert not leaked, f"--report {form} holds {leaked}"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".report")] == []  # no temporary left


HANGING_HL_SMI = """#!/bin/sh
# hl-smi hangs in -q after forking helpers, one in its group, one in a session of its own
sleep 300 &
setsid sleep 300 </dev/null >/dev/null 2>&1 &
exec sleep 300
"""


def test_a_hanging_hl_smi_is_ended_with_its_helpers(tmp_path: Path) -> None:
    import uuid

    from tests.helpers import processes_with_env

    marker = uuid.uuid4().hex
    program = tmp_path / "hl-smi"
    program.write_text(HANGING_HL_SMI)
    program.chmod(0o755)
    env = dict(os.environ, GAUDI_GUI_DOCTOR_TOOL_TIMEOUT="2", GAUDI_GUI_TEST_MARKER=marker)
    try:
        for args in ([], ["--report", str(tmp_path / "report.txt")]):
            done = doctor("--hl-smi", str(program), *args, env=env)
            assert done.returncode == 1, done.stdout + done.stderr
            assert "timed out after 2 s" in done.stdout, done.stdout
            left = processes_with_env("GAUDI_GUI_TEST_MARKER", marker)
            assert not left, f"doctor {' '.join(args)} left {[' '.join(p.cmdline()) for p in left]}"
        assert "timed out after 2 s" in (tmp_path / "report.txt").read_text()
    finally:
        for proc in processes_with_env("GAUDI_GUI_TEST_MARKER", marker):
            proc.kill()


def test_smoke_timeout_nan_starts_no_smoke_child(sick_server: dict[str, str]) -> None:
    from tests.helpers import processes_with_env

    done = doctor("--smoke", "--smoke-timeout", "nan", env=sick_server)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "--smoke-timeout" in done.stderr
    left = processes_with_env("GAUDI_GUI_HOME", sick_server["GAUDI_GUI_HOME"])
    assert not left, [" ".join(p.cmdline()) for p in left]


def test_a_failure_after_the_smoke_children_started_ends_them(tmp_path: Path) -> None:
    """An error while waiting on the children (here: a timeout that is not a number, as
    ``--smoke-timeout nan`` once passed on) is raised, and no child or grandchild is left."""
    import psutil

    from gaudi_gui.core import health

    script = tmp_path / "child.py"
    script.write_text(CHILD)
    with pytest.raises(ValueError):
        health.run_smoke("hpu", [(3, 0), (4, 1)], timeout_s=float("nan"), argv=[sys.executable, str(script)])
    left = [p for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])
            or "time.sleep(600)" in " ".join(p.info["cmdline"] or [])]
    assert not left, left
