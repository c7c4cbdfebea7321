"""The doctor's data model and gate (core.health): JSON round trips, counts, exit codes, gate rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gaudi_gui.core.health import Finding, GateResult, HostHealth, Report, gate


def _host(findings: tuple[Finding, ...] = (), free: tuple[int, ...] = (), **kw: object) -> HostHealth:
    cards = tuple({"index": i, "module_id": i, "bus_id": f"0000:{i:02x}:00.0", "name": "HL-225"}
                  for i in range(8))
    return HostHealth(host=str(kw.get("host", "local")), reachable=bool(kw.get("reachable", True)),
                      error=str(kw.get("error", "")), findings=findings, cards=cards,
                      free_modules=free, versions={"driver": "1.17.0-abc", "hl-smi": "1.17.0"})


def test_finding_round_trip_and_keys() -> None:
    f = Finding("card.ecc", "error", "2 double-bit ECC errors", "replace the card", module_id=3, index=2)
    d = f.to_json()
    assert list(d) == ["check", "severity", "seen", "fix", "module_id", "index", "host"]
    assert Finding.from_json(json.loads(json.dumps(d))) == f
    # One name for a card everywhere: its module id; the index only as the detail.
    assert f.card_label() == "module 3" and f.card_detail() == "index 2"


def test_unknown_is_not_a_severity() -> None:
    with pytest.raises(ValueError, match="severity"):
        Finding("card.status", "unknown", "could not read")


def test_report_json_counts_and_exit_code() -> None:
    sick = Finding("busy.held", "error", "held by pid 42", "stop pid 42", module_id=1, index=1)
    warn = Finding("card.throttle", "warning", "power slowdown active", "check cooling", module_id=2)
    report = Report(hosts=(_host((sick, warn), free=(0, 2, 3, 4, 5, 6, 7)),))
    d = report.to_json()
    assert d["version"] == 1 and d["errors"] == 1 and d["warnings"] == 1
    assert set(d["hosts"][0]) == {"host", "reachable", "error", "cards", "free_modules", "versions",
                                  "findings"}
    again = Report.from_json(json.loads(json.dumps(d)))
    assert again == report
    assert report.exit_code == 1 and again.hosts[0].worst == "error"
    assert Report(hosts=(_host((warn,)),)).exit_code == 0


def test_unreachable_host_is_an_error() -> None:
    report = Report(hosts=(_host(), _host(host="b", reachable=False, error="timed out after 20 s")))
    assert report.errors == 1 and report.exit_code == 1
    assert report.hosts[1].worst == "error"
    result = gate(report, None, multi_node=True)
    assert result.errors == ("b did not answer: timed out after 20 s",)


def test_gate_refuses_a_chosen_bad_card_and_suggests_free_group() -> None:
    held = Finding("busy.held", "error", "held by a process outside this view", "free it", module_id=1,
                   index=1)
    report = Report(hosts=(_host((held,), free=(0, 2, 3, 4, 5, 6, 7)),))
    result = gate(report, [0, 1], multi_node=False)
    assert not result.ok and "module 1" in result.errors[0]
    assert result.suggestion == "modules 2 and 3 are healthy and free: use them"
    assert isinstance(gate(report, [4, 5], multi_node=False), GateResult)
    assert gate(report, [4, 5], multi_node=False).ok


def test_gate_ports_down_only_blocks_multi_node() -> None:
    ports = Finding("net.ports", "error", "ports 2,5 DOWN", "check the cable", module_id=0, index=0)
    report = Report(hosts=(_host((ports,)),))
    assert gate(report, [0], multi_node=False).ok
    assert gate(report, [0], multi_node=False).warnings
    assert not gate(report, [0], multi_node=True).ok


def test_gate_versions_differing_between_hosts() -> None:
    cross = Finding("hosts.versions", "error", "driver: a 1.17.0, b 1.18.0", "use one Gaudi software",
                    host="a,b")
    report = Report(hosts=(_host(host="a"), _host(host="b")), cross_host=(cross,))
    result = gate(report, None, multi_node=True)
    assert not result.ok and "driver" in result.errors[0]


# -- parsers and checks on the recorded samples --------------------------------------------------


from gaudi_gui.core import health  # noqa: E402

HEALTH = Path(__file__).resolve().parents[1] / "data" / "hlsmi" / "health"


def test_parse_query_recorded_hl225_keyed_on_names() -> None:
    header, cards = health.parse_query((HEALTH / "q-style-L-i-hl225-1.12.1.txt").read_text())
    assert header["driver version"] == "1.12.1-cb7a7bc"
    assert header["hl-smi version"].startswith("hl-1.12.1")
    (card,) = cards
    assert card["_bus_id"] == "0000:43:00.0" and card["_accel"] == "accel0"
    assert card["replaced rows/double bit ecc"] == "0"
    assert card["clocks throttle reasons/thermal slowdown"] == "Not Active"  # value on the next line
    assert card["pci/aip link info/link width/max"] == "x16"
    found = {f.check: f for f in health.card_findings(card)}
    assert {f.severity for f in found.values()} == {"ok"}
    assert set(found) >= {"card.status", "card.temperature", "card.power", "card.ecc", "card.throttle",
                          "card.pcie"}


def test_card_checks_on_sick_values() -> None:
    _, (card,) = health.parse_query((HEALTH / "q-style-L-i-hl225-1.12.1.txt").read_text())
    sick = dict(card)
    sick["replaced rows/pending"] = "Yes"
    sick["clocks throttle reasons/power slowdown"] = "Active"
    sick["pci/aip link info/link width/current"] = "x8"
    for key in [k for k in sick if k.startswith("temperature/")]:
        sick[key] = "0 C"
    got = {f.check: f for f in health.card_findings(sick, sysfs_status="needs reset\n")}
    assert got["card.status"].severity == "error" and "needs reset" in got["card.status"].seen
    assert got["card.init"].severity == "error"
    assert got["card.ecc"].severity == "error" and got["card.ecc"].fix
    assert got["card.throttle"].severity == "warning" and "power slowdown" in got["card.throttle"].seen
    assert got["card.pcie"].severity == "warning"


def test_unknown_is_a_warning_never_ok() -> None:
    got = health.card_findings({"_index": "0", "_accel": "accel0", "_bus_id": "x"})
    assert got and all(f.severity == "warning" for f in got)
    assert all("could not be read" in f.seen for f in got)


def test_parse_links_recorded_and_down() -> None:
    ports = health.parse_links((HEALTH / "n-link-hl288e-gaudi2e-1.23.0.txt").read_text())
    assert len(ports) == 18 and all(ports.values())
    assert health.parse_links("port  2:\tDOWN\nport 3: UP\n") == {2: False, 3: True}
    assert health.parse_links("garbage") == {}


def test_modules_and_device_nodes(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "modules").write_text("habanalabs 1 0 - Live 0x0\nhabanalabs_cn 1 0 - Live 0x0\n")
    (tmp_path / "dev" / "accel").mkdir(parents=True)
    for i in range(7):
        (tmp_path / "dev" / "accel" / f"accel{i}").touch()
    got = {f.check: f for f in health.module_findings(tmp_path / "proc", tmp_path / "dev", 8)}
    assert got["stack.modules"].severity == "warning" and "habanalabs_en" in got["stack.modules"].seen
    assert got["stack.devices"].severity == "error"
    missing = health.module_findings(tmp_path / "nowhere", tmp_path / "dev", None)
    assert missing[0].severity == "warning" and "could not read" in missing[0].seen


def test_stack_accelerate_and_compat() -> None:
    compat = {"rows": [{"gaudi_software": "1.18.0", "minimums": {"transformers": "4.40.2"}}]}
    got = health.stack_findings({"accelerate": "1.4.0", "driver": "1.18.0-ee698fb",
                                 "transformers": "4.38.0", "habana-torch-plugin": "1.17.0.495"},
                                compat=compat)
    by = {f.check: f for f in got}
    assert by["stack.accelerate"].severity == "error"
    assert by["stack.transformers"].severity == "warning"
    assert by["stack.plugin"].severity == "error"
    unknown = health.stack_findings({"accelerate": "1.16.0", "driver": "1.99.0"}, compat=compat)
    assert any(f.check == "stack.compat" and f.severity == "warning" for f in unknown)


def test_stack_checks_each_package_with_packaging_and_never_calls_unknown_ok() -> None:
    compat = {"global_minimums": {"accelerate": "1.5.0"},
              "rows": [{"gaudi_software": "1.18.0", "torch": "2.4.0", "source": "https://example.org/m",
                        "date": "2026-12-03",
                        "minimums": {"transformers": "4.40.2", "optimum-habana": "1.12.1"}}]}
    versions = {"driver": "1.18.0-ee698fb", "habana-torch-plugin": "1.18.0.524", "accelerate": "1.10.0",
                "torch": "2.4.0a0+git74cd574", "transformers": "4.45.0", "optimum-habana": "1.9.0",
                "peft": "0.13.0", "trl": "0.11.0", "vllm": "0.6.3.dev588+g1ee3ff4"}
    by = {f.check: f for f in health.stack_findings(versions, compat=compat)}
    assert by["stack.compat"].severity == "ok" and "https://example.org/m" in by["stack.compat"].seen
    assert by["stack.plugin"].severity == "ok"
    assert by["stack.torch"].severity == "ok"  # Intel's fork '2.4.0a0+git..' is the 2.4 release
    assert by["stack.transformers"].severity == "ok"  # 4.45.0 >= 4.40.2 by version, not by text
    oh = by["stack.optimum-habana"]
    assert oh.severity == "warning" and "older than 1.12.1" in oh.seen
    # Packages the row does not list stay unknown: one warning naming them, never ok.
    assert by["stack.unverified"].severity == "warning"
    assert "peft 0.13.0, trl 0.11.0, vllm 0.6.3.dev588+g1ee3ff4" in by["stack.unverified"].seen
    # A version packaging cannot read is "could not be compared", a warning.
    odd = {f.check: f for f in health.stack_findings({**versions, "transformers": "main-branch",
                                                      "accelerate": "weird"}, compat=compat)}
    assert odd["stack.transformers"].severity == "warning"
    assert "could not be compared" in odd["stack.transformers"].seen
    assert odd["stack.accelerate"].severity == "warning"
    # Another torch than the release ships; a patch release falls back to its release's row.
    newer = {**versions, "driver": "1.18.2-abc", "torch": "2.5.1", "habana-torch-plugin": "1.18.2.1"}
    patch = {f.check: f for f in health.stack_findings(newer, compat=compat)}
    assert patch["stack.torch"].severity == "warning" and "ships torch 2.4.0" in patch["stack.torch"].seen
    assert "table row 1.18.0" in patch["stack.compat"].seen and patch["stack.plugin"].severity == "ok"
    # No Gaudi software: the packages are listed, there is nothing to check them against.
    bare = {f.check: f for f in health.stack_findings({"torch": "2.5.1", "accelerate": "1.10.0"},
                                                       compat=compat)}
    assert "no Gaudi software here" in bare["stack.torch"].seen and "stack.compat" not in bare


def test_shipped_compat_table_rows_have_sources() -> None:
    table = health.load_compat()
    assert table["rows"]
    assert all(r["source"].startswith("https://") and r["date"] for r in table["rows"])
    from packaging.version import Version
    for r in table["rows"]:
        Version(r["gaudi_software"])
        for minimum in r.get("minimums", {}).values():
            Version(minimum)  # every minimum parses, so a comparison is never silently skipped


def test_holders_from_proc_fd(tmp_path: Path) -> None:
    fd = tmp_path / "proc" / "4242" / "fd"
    fd.mkdir(parents=True)
    (fd / "5").symlink_to(tmp_path / "dev" / "accel" / "accel6")
    (tmp_path / "proc" / "self").mkdir()
    assert health.accel_holders(tmp_path / "proc", tmp_path / "dev") == {6: [4242]}


def test_cross_host_versions() -> None:
    a = HostHealth("a", True, versions={"driver": "1.18.0-x", "torch": "2.4.0"})
    b = HostHealth("b", True, versions={"driver": "1.17.0-y", "torch": "2.4.0"})
    got = health.cross_host_findings([a, b, HostHealth("c", False, "down")])
    assert [f.check for f in got] == ["hosts.versions"] and "driver" in got[0].seen


def test_gate_stack_errors_are_warnings() -> None:
    nodes = Finding("stack.devices", "error", "0 /dev/accel nodes, hl-smi sees 8 cards", "reload")
    dead = Finding("card.init", "error", "0 C", "reset", module_id=3, index=3)
    report = Report(hosts=(_host((nodes, dead), free=tuple(range(8))),))
    result = gate(report, [0, 1], multi_node=False)
    assert result.ok and any("/dev/accel" in w for w in result.warnings)
    assert not gate(report, [3], multi_node=False).ok


def test_hl_smis_process_list_is_read_by_column_names(tmp_path: Path) -> None:
    from gaudi_gui.core.health import _held_text, parse_processes
    table = (Path(__file__).resolve().parents[1] / "data" / "hlsmi" / "table-hl205-1.18.0.txt").read_text()
    assert parse_processes(table) == {0: [(10, "python name")], 6: [(20, "custom process")]}
    # Padding changed and an extra column: still keyed on the names.
    other = ("| Compute Processes:                          |\n"
             "|  AIP   Type  PID    Process name   Usage  |\n"
             "|===========================================|\n"
             "|   3    C     77     torchrun x     10MiB  |\n"
             "|   4    N/A   N/A    N/A            N/A    |\n"
             "+===========================================+\n")
    assert parse_processes(other) == {3: [(77, "torchrun x")]}
    assert parse_processes("no table here") == {}
    # pid 10 is in this view (a /proc/10 folder), pid 20 is not: another container's process.
    (tmp_path / "10").mkdir()
    assert _held_text([], [(10, "python name")], tmp_path) == "held by pid 10 (python name)"
    assert _held_text([], [(20, "custom process")], tmp_path) == (
        "held by pid 20 (custom process): a process outside this view (another container?)")
    assert _held_text([42], [(42, "x")], tmp_path) == "held by pid 42 (x)"
    assert _held_text([], [], tmp_path) == ""


def test_free_groups_are_intels_supported_ones_without_sick_cards() -> None:
    ecc = Finding("card.ecc", "error", "double-bit ECC 2", module_id=2, index=2)
    h = _host((ecc,), free=(0, 1, 2, 3, 4, 5, 7))
    assert [sorted(g) for g in h.free_groups] == [[0, 1], [4, 5]]
    assert h.free_text() == ("healthy and free: modules 0, 1, 3, 4, 5 and 7; for 2 cards: modules 0 and 1; "
                             "for 4 cards: none of 0,1,2,3 / 4,5,6,7")
    assert _host(free=()).free_text() == "healthy and free: none"


def test_healthy_and_free_says_which_cards_and_for_n_cards_which_n() -> None:
    """Issue 25 item 7: the sick server (module 1 ports down, 2 ECC, 3 at 0 C, 5 slowdown, 6 held)."""
    findings = (Finding("net.ports", "error", "ports 2,5 DOWN", module_id=1, index=7),
                Finding("card.ecc", "error", "double-bit ECC 2", module_id=2, index=0),
                Finding("card.init", "error", "temperature reads 0 C", module_id=3, index=2),
                Finding("card.throttle", "warning", "power slowdown active", module_id=5, index=6),
                Finding("busy.held", "error", "held by pid 4242", module_id=6, index=1),
                Finding("card.ecc", "ok", "no ECC errors", module_id=0, index=4))
    h = _host(findings, free=(0, 1, 2, 3, 4, 5, 7))
    assert h.healthy_free() == [0, 4, 5, 7] and h.warned() == [5]
    assert h.pick(1).ids == (0,)
    two = h.pick(2)
    assert two.ids == (4, 5) and two.warned == (5,)  # the only healthy free pair has a warning
    assert h.pick(4).ids == () and h.pick(8).ids == ()
    assert h.usable_text() == ("healthy and free: modules 0, 4, 5 and 7 (module 5: power slowdown active); "
                               "for 2 cards: modules 4 and 5; for 4 cards: none of 0,1,2,3 / 4,5,6,7")
    # Cards this app's own jobs hold are not offered.
    assert h.usable_text(exclude=[4]).startswith("healthy and free: modules 0, 5 and 7")
    # Each card's worst finding, in words: errors first, what makes it unusable first.
    worst = {m: (w.severity, w.seen) if (w := h.card_worst(m)) else None for m in range(8)}
    assert worst[2] == ("error", "double-bit ECC 2") and worst[5] == ("warning", "power slowdown active")
    assert worst[6] == ("error", "held by pid 4242") and worst[0] is None


def test_firmware_that_differs_from_the_driver_names_its_cards() -> None:
    """Issue 25 item 8: "cards run different firmware: 1.16.0, 1.18.0" named no card."""
    from gaudi_gui.core.health import firmware_findings

    fw = {(m, i): "1.18.0" for i, m in enumerate((2, 6, 3, 7, 0, 4, 5, 1))}
    fw[(3, 2)] = fw[(5, 6)] = "1.16.0"
    got = firmware_findings(fw, "1.18.0")
    assert [(f.check, f.severity, f.card_label()) for f in got] == [
        ("card.firmware", "error", "module 3"), ("card.firmware", "error", "module 5")]
    assert got[0].seen == "firmware 1.16.0, the driver is 1.18.0" and "firmware" in got[0].fix
    # Every card on the driver's version: one passed check, no card named.
    same = firmware_findings({(0, 0): "1.18.0", (1, 1): "1.18.0"}, "1.18.0")
    assert [(f.check, f.severity) for f in same] == [("stack.firmware", "ok")]
    # No driver version read: the odd one out against what most cards run.
    odd = firmware_findings({(0, 0): "1.18.0", (1, 1): "1.18.0", (2, 2): "1.16.0"}, "")
    assert [f.card_label() for f in odd] == ["module 2"] and "2 other card(s) run 1.18.0" in odd[0].seen
    # The gate warns about it on a chosen card; it does not stop the run (as before it named cards).
    report = Report(hosts=(_host(tuple(got), free=tuple(range(8))),))
    result = gate(report, [3], multi_node=False)
    assert result.ok and any("module 3: firmware 1.16.0" in w for w in result.warnings)


def test_check_host_names_the_cards_whose_firmware_differs(fake_hl_smi: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake hl-smi's -q with modules 3 and 5 on firmware 1.16.0 and the driver 1.18.0: those two
    cards are named (the old finding said "cards run different firmware: 1.16.0, 1.18.0")."""
    from gaudi_gui.core import health
    from tests.helpers import sick_server_env

    env = sick_server_env(tmp_path / "sick")
    monkeypatch.setenv("FAKE_HLSMI_MODE", "normal")
    monkeypatch.setenv("FAKE_HLSMI_DRIVER", "1.18.0")
    monkeypatch.setenv("FAKE_HLSMI_FIRMWARE", "3,5=1.16.0")
    roots = health.Roots(sysfs=Path(env["GAUDI_GUI_DOCTOR_SYSFS"]), proc=Path(env["GAUDI_GUI_DOCTOR_PROC"]),
                         dev=Path(env["GAUDI_GUI_DOCTOR_DEV"]), hl_smi=str(fake_hl_smi))
    got = health.check_host(roots)
    fw = [f for f in got.findings if "firmware" in f.check]
    assert [(f.check, f.severity, f.card_label(), f.card_detail()) for f in fw] == [
        ("card.firmware", "error", "module 3", "index 2"), ("card.firmware", "error", "module 5", "index 6")]
    assert all(f.seen == "firmware 1.16.0, the driver is 1.18.0" for f in fw)
    assert got.card_worst(3) == fw[0] and got.card_worst(7) is None


@pytest.mark.parametrize("witness", ["accel nodes", "/proc/modules", "/sys/module"])
def test_no_hl_smi_where_gaudi_cards_are_is_an_error(witness: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """No hl-smi (none named, none on PATH) on a machine whose /dev/accel nodes or loaded habanalabs
    driver say it has Gaudi cards: an error naming what was seen (it said "fine on a CPU"); with
    neither, a CPU machine, still ok."""
    from gaudi_gui.core import health
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.delenv("GAUDI_GUI_HL_SMI", raising=False)
    roots = health.Roots(sysfs=tmp_path / "sys", proc=tmp_path / "proc", dev=tmp_path / "dev")
    for folder in (roots.sysfs, roots.proc, roots.dev):
        folder.mkdir()
    (roots.proc / "modules").write_text("ext4 1 0 - Live 0x0\n")
    cpu = health.check_host(roots)
    assert [f.severity for f in cpu.findings if f.check == "stack.hl-smi"] == ["ok"]
    if witness == "accel nodes":
        (roots.dev / "accel").mkdir()
        for i in range(8):
            (roots.dev / "accel" / f"accel{i}").touch()
        said = "8 /dev/accel nodes (accel0..accel7)"
    elif witness == "/proc/modules":
        (roots.proc / "modules").write_text("habanalabs 1 0 - Live 0x0\n")
        said = "the habanalabs driver is loaded"
    else:
        (roots.sysfs / "module" / "habanalabs").mkdir(parents=True)
        said = "the habanalabs driver is loaded"
    got = health.check_host(roots)
    (finding,) = [f for f in got.findings if f.check == "stack.hl-smi"]
    assert finding.severity == "error" and said in finding.seen and "no hl-smi" in finding.seen
    assert "--hl-smi PATH" in finding.fix
    assert Report(hosts=(got,)).exit_code == 1


def test_an_hl_smi_q_without_a_card_section_is_said_with_the_device_querys_cards(
        fake_hl_smi: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hl-smi answers -q (exit 0) with no per-card section while its device query lists 8 cards (what
    Devices shows): the finding says what happened and the report lists those 8 cards, none called
    free (the old words: "hl-smi -q failed (exit 0): no cards in its output", and no cards)."""
    from gaudi_gui.core import health
    from tests.helpers import sick_server_env

    env = sick_server_env(tmp_path / "host")
    monkeypatch.setenv("FAKE_HLSMI_MODE", "q_no_cards")
    roots = health.Roots(sysfs=Path(env["GAUDI_GUI_DOCTOR_SYSFS"]), proc=Path(env["GAUDI_GUI_DOCTOR_PROC"]),
                         dev=Path(env["GAUDI_GUI_DOCTOR_DEV"]), hl_smi=str(fake_hl_smi))
    got = health.check_host(roots)
    (finding,) = [f for f in got.findings if f.check == "stack.hl-smi"]
    assert finding.severity == "error"
    assert "failed" not in finding.seen and "answered (exit 0) with no per-card section" in finding.seen
    assert "its device query lists 8 cards (modules 0, 1, 2, 3, 4, 5, 6 and 7)" in finding.seen
    assert sorted(c["module_id"] for c in got.cards) == list(range(8)) and got.free_modules == ()
    assert got.usable_text() == "healthy and free: none"  # never "no Gaudi cards" beside Devices' 8
    assert not [f for f in got.findings if f.check == "stack.devices" and f.severity == "error"]


def test_the_queues_look_at_the_cards_sees_gaudi_without_hl_smi(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue's card check (agent.queue.check_cards) skipped the doctor when hl-smi was not
    found, as on a CPU machine; with /dev/accel nodes it runs it, and the missing hl-smi is its error."""
    from gaudi_gui.agent import queue as queue_service
    dev = tmp_path / "dev"
    (dev / "accel").mkdir(parents=True)
    (dev / "accel" / "accel0").touch()
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.delenv("GAUDI_GUI_HL_SMI", raising=False)
    monkeypatch.setenv("GAUDI_GUI_DOCTOR_DEV", str(dev))
    monkeypatch.setenv("GAUDI_GUI_DOCTOR_PROC", str(tmp_path / "proc"))
    monkeypatch.setenv("GAUDI_GUI_DOCTOR_SYSFS", str(tmp_path / "sys"))
    seen = queue_service.check_cards()
    assert seen.health is not None
    assert [(f.severity, "1 /dev/accel node (accel0)" in f.seen) for f in seen.health.findings
            if f.check == "stack.hl-smi"] == [("error", True)]
