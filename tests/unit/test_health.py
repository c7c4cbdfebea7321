"""The doctor's data model and gate (core.health): JSON round trips, counts, exit codes, gate rules."""

from __future__ import annotations

import json

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
    assert f.card_label() == "card 3 (index 2)"


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
    assert not result.ok and "card 1" in result.errors[0]
    assert result.suggestion == "cards 2,3 are free: use them"
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
