from __future__ import annotations

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
