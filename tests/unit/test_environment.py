from __future__ import annotations

from pathlib import Path

import pytest

from gaudi_gui.core import environment


def test_parse_version() -> None:
    assert environment.parse_version("1.16.0") == (1, 16, 0)
    assert environment.parse_version("2.6.0+hpu.1.21.0") == (2, 6, 0)
    assert environment.parse_version("1.5.0rc1") == (1, 5, 0)
    assert environment.parse_version(None) == ()


def test_pick_device_prefers_hpu_then_cuda() -> None:
    assert environment.pick_device(8, 2) == "hpu"
    assert environment.pick_device(0, 2) == "cuda"
    assert environment.pick_device(0, 0) == "cpu"


def _info(**packages: str | None) -> dict:
    base: dict[str, str | None] = {"torch": "2.13.0", "transformers": "5.24.0", "accelerate": "1.16.0"}
    base.update(packages)
    return {"packages": base, "env": {}, "errors": {}}


def test_old_accelerate_is_flagged_with_the_reason() -> None:
    warnings = environment.warnings(_info(accelerate="1.4.0"))
    assert any("1.4.0" in w and "is_torch_hpu_available" in w for w in warnings)
    assert environment.warnings(_info()) == []


def test_missing_torch_is_flagged() -> None:
    assert any(w.startswith("torch is not importable") for w in environment.warnings(_info(torch=None)))


def test_gaudi_without_int64_flag_or_hpu_is_flagged() -> None:
    info = _info(habana_frameworks="1.21.0")
    info["is_torch_hpu_available"] = False
    text = " ".join(environment.warnings(info))
    assert "PT_ENABLE_INT64_SUPPORT" in text and "no HPU is usable" in text


def test_as_text_lists_everything() -> None:
    info = _info(peft=None)
    info.update(python="3.11.7", device="cpu", hpu_count=0, cuda_count=0,
                env={"HABANA_VISIBLE_MODULES": None}, warnings=["w1"])
    text = environment.as_text(info)
    assert "peft" in text and "not installed" in text
    assert "HABANA_VISIBLE_MODULES" in text and "(unset)" in text
    assert "WARNING: w1" in text


SAMPLES = Path(__file__).resolve().parents[1] / "data" / "hlsmi"


def test_hlsmi_versions_from_the_table_header() -> None:
    v = environment.parse_hlsmi_versions((SAMPLES / "table-hl205-1.18.0.txt").read_text())
    assert v == {"hl_smi_version": "hl-1.18.0-fw-53.1.1.1", "driver_version": "1.18.0-ee698fb",
                 "nic_driver_version": None, "firmware_version": "53.1.1.1"}
    v = environment.parse_hlsmi_versions((SAMPLES / "table-hl225-1.12.1.txt").read_text())
    assert v["driver_version"] == "1.12.1-cb7a7bc" and v["firmware_version"] == "46.0.5.0"


def test_hlsmi_versions_newer_layout_and_garbage() -> None:
    newer = ("| HL-SMI Version:                              hl-1.22.1-fw-59.2.1.0          |\n"
             "| Driver Version:                                     1.22.1-97ec1a4          |\n"
             "| Nic Driver Version:                                 1.22.1-1bd6f23          |\n")
    v = environment.parse_hlsmi_versions(newer)
    assert v["driver_version"] == "1.22.1-97ec1a4" and v["nic_driver_version"] == "1.22.1-1bd6f23"
    assert v["firmware_version"] == "59.2.1.0"
    assert set(environment.parse_hlsmi_versions("no devices\n").values()) == {None}
    # `hl-smi -q` style firmware line when the header lacks -fw-
    assert environment.parse_hlsmi_versions("    Firmware [FIT] Version : 1.2.3\n")[
        "firmware_version"] == "1.2.3"


def test_as_text_has_gaudi_gui_driver_firmware_and_optional_packages() -> None:
    info = _info()
    info.update(gaudi_gui_version="0.1.0", optional_packages={"deepspeed": "0.16.0",
                                                              "optimum-habana": None},
                gaudi={"driver_version": "1.18.0-ee698fb", "firmware_version": "53.1.1.1",
                       "hl_smi_version": "hl-1.18.0-fw-53.1.1.1"})
    text = environment.as_text(info)
    assert text.startswith("gaudi-gui 0.1.0 environment")
    assert "deepspeed" in text and "0.16.0" in text and "optimum-habana" not in text
    assert "1.18.0-ee698fb" in text and "53.1.1.1" in text


def test_probe_reads_versions_from_a_fake_hl_smi(fake_hl_smi: Path) -> None:
    from gaudi_gui.workers import probe

    got = probe.gaudi_versions()
    assert got["driver_version"] == "1.18.0-ee698fb" and got["firmware_version"] == "53.1.1.1"
    assert got["error"] is None


def test_probe_without_hl_smi_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from gaudi_gui.workers import probe

    monkeypatch.setenv("GAUDI_GUI_HL_SMI", "no-such-hl-smi-xyz")
    got = probe.gaudi_versions()
    assert got["driver_version"] is None and "not found" in got["error"]
    assert set(probe.optional_packages()) == {"deepspeed", "optimum-habana"}
