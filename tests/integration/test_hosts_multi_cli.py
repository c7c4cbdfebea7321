"""``gaudi-gui hosts --preflight`` and ``hosts --keep-job-meter``: the two pieces of a run on several
hosts the agent runs as its children for the Training tab (agent/children.py's ``hosts_preflight`` and
``keep_job_meter``; the window starts no thread). Bad input is refused where it enters: exit 2, one line,
before any connection or child process. (What they do against real hosts: tests/remote/
test_multi_host_tab.py, through the tab; a pre-flight that finds problems: tests/qt/
test_training_job_preflight.py.)"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from gaudi_gui import cli
from tests.helpers import refuse_starting


@pytest.fixture(autouse=True)
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad input is refused before anything starts: a child process or a connection fails the test."""
    refuse_starting(monkeypatch)


@pytest.fixture
def job(tmp_path: Path) -> Path:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"model": "builtin:demo"}))
    return path


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """``gaudi-gui ARGV`` in this process refuses it: exit 2, one line on stderr (returned), no output."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    assert code == 2, (argv, code, out, err)
    assert err.strip() and err.strip().count("\n") == 0, err  # one line
    assert "Traceback" not in err and out == "", (out, err)
    return err.strip()


@pytest.mark.parametrize(("extra", "needle"), [
    (["--preflight", "gg-a"], "--preflight takes two or more hosts"),
    (["--preflight", "gg-a,gg-a"], "a host is named twice in --preflight"),
    (["--preflight", "gg-a,-oProxyCommand=touch /tmp/x"], "cannot begin with '-'"),
    (["--preflight", "gg-a,gg-b", "--port", "70000"], "1-65535, not 70000"),
    (["--preflight", "gg-a,gg-b", "--port", "-3"], "1-65535, not -3"),
    (["--preflight", "gg-a,gg-b", "--port", "x"], "invalid int value"),
    (["--preflight", "gg-a,gg-b", "--host-command", "gg-a"], "expected HOST=CMD, not 'gg-a'"),
    (["--preflight", "gg-a,gg-b", "--host-command", "gg-c=py -m gaudi_gui"],
     "not one of --preflight's hosts"),
    (["--preflight", "gg-a,gg-b", "--host-command", "gg-a=py", "--host-command", "gg-a=py"], "'gg-a' twice"),
    (["--preflight", "gg-a,gg-b", "--host-command", "gg-a=py 'x"], "the remote command cannot be read"),
    (["--preflight", "gg-a,gg-b", "--remote-command", "py 'x"], "the remote command cannot be read"),
])
def test_preflight_refuses_bad_input_with_one_line(extra: list[str], needle: str, job: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert needle in _refused(["hosts", *extra, "--config", str(job), "--json"], capsys)


def test_preflight_refuses_a_missing_or_bad_job(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    said = _refused(["hosts", "--preflight", "gg-a,gg-b", "--json"], capsys)
    assert said == "gaudi-gui hosts --preflight: needs --config (the job file, or - for the job on stdin)"
    said = _refused(["hosts", "--preflight", "gg-a,gg-b", "--config", str(tmp_path / "none.json")], capsys)
    assert "cannot read job file" in said
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert str(bad) in _refused(["hosts", "--preflight", "gg-a,gg-b", "--config", str(bad)], capsys)
    monkeypatch.setattr("sys.stdin", io.StringIO("[1, 2]"))
    assert _refused(["hosts", "--preflight", "gg-a,gg-b", "--config", "-"], capsys).startswith(
        "gaudi-gui hosts --preflight: ")


def test_keep_job_meter_refuses_bad_input_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    meter = tmp_path / "meter.json"
    meter.write_text(json.dumps({"parts": []}))
    keep = ["hosts", "--host", "gg-a", "--keep-job-meter"]
    said = _refused([*keep, "run-1", "--meter", str(meter)], capsys)
    assert "absolute path on the host, not 'run-1'" in said
    assert "needs --meter" in _refused([*keep, "/r/run-1"], capsys)
    assert "cannot read" in _refused([*keep, "/r/run-1", "--meter", str(tmp_path / "none.json")], capsys)
    listed = tmp_path / "list.json"
    listed.write_text("[1]")
    assert f"{listed} is not a JSON object" in _refused([*keep, "/r/run-1", "--meter", str(listed)], capsys)
    monkeypatch.setattr("sys.stdin", io.StringIO("nope"))
    assert "--meter: stdin is not JSON" in _refused([*keep, "/r/run-1", "--meter", "-"], capsys)
    said = _refused(["hosts", "--host=-oProxyCommand=x", "--keep-job-meter", "/r", "--meter", str(meter)],
                    capsys)
    assert "cannot begin with '-'" in said
    said = _refused(["hosts", "--host", "gg-a", "--remote-command", "py 'x", "--keep-job-meter", "/r",
                     "--meter", str(meter)], capsys)
    assert "the remote command cannot be read" in said
    # The options of one action are refused beside another, or alone (commands/flags.py).
    assert "--keep-job-meter needs --host" in _refused(["hosts", "--keep-job-meter", "/r", "--meter",
                                                        str(meter)], capsys)
    assert "--meter needs --keep-job-meter" in _refused(["hosts", "--meter", str(meter)], capsys)
    assert "--preflight cannot go with --keep-job-meter" in _refused(
        ["hosts", "--preflight", "gg-a,gg-b", "--keep-job-meter", "/r"], capsys)
    assert "--timeout cannot go with --keep-job-meter" in _refused(
        ["hosts", "--timeout", "5", "--host", "gg-a", "--keep-job-meter", "/r"], capsys)
