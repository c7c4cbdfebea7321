"""The one model loader's plan (workers/loader.py) and the one quantization vocabulary
(core/quantization.py), without torch: what from_pretrained is asked for on each device."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest

from gaudi_gui.core import quantization as quant
from gaudi_gui.core.generation import LoadOptions
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.workers import loader


class FakeTorch:
    bfloat16, float32, float16 = "torch.bfloat16", "torch.float32", "torch.float16"


@pytest.fixture
def fake_bnb(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """bitsandbytes "installed" and transformers' BitsAndBytesConfig recording its arguments."""
    made: list[dict[str, object]] = []
    transformers = types.ModuleType("transformers")

    def config(**kw: object) -> dict[str, object]:
        made.append(kw)
        return kw

    transformers.BitsAndBytesConfig = config  # type: ignore[attr-defined]
    bnb = types.ModuleType("bitsandbytes")
    bnb.__spec__ = importlib.machinery.ModuleSpec("bitsandbytes", None)
    monkeypatch.setitem(sys.modules, "transformers", transformers)
    monkeypatch.setitem(sys.modules, "bitsandbytes", bnb)
    return made


def test_one_vocabulary_reads_old_spellings() -> None:
    assert quant.QUANTIZATIONS == ("none", "8bit", "4bit")
    for old, new in (("bnb-4bit", "4bit"), ("NF4", "4bit"), ("load_in_4bit", "4bit"), ("int8", "8bit"),
                     ("bnb-8bit", "8bit"), ("", "none"), (None, "none"), ("8bit", "8bit")):
        assert quant.normalize(old) == new, old
    assert quant.normalize("2bit") == "2bit" and "2bit" in quant.problem("2bit")
    assert quant.problem("8bit", "hpu").startswith("8-bit quantization is not supported on Gaudi")
    # A runner setting saved by an older release loads; a bad one is still refused by name.
    assert LoadOptions.from_dict({"quantization": "bnb-4bit"}).quantization == "4bit"
    assert LoadOptions(quantization="2bit").validate() == [
        "quantization must be one of none, 8bit, 4bit (got '2bit')"]
    assert JobConfig(method="qlora").quantization == "4bit"
    assert JobConfig(method="lora").quantization == "none"


def test_plan_per_device() -> None:
    cpu = loader.plan("cpu")
    assert (cpu.dtype, cpu.device_map, cpu.move, cpu.inference) == ("fp32", None, False, True)
    assert cpu.kwargs(FakeTorch) == {"dtype": "torch.float32"}
    cuda = loader.plan("cuda", dtype="auto")
    assert (cuda.dtype, cuda.device_map, cuda.move) == ("bf16", None, True)
    hpu = loader.plan("hpu", dtype="fp32")
    assert hpu.kwargs(FakeTorch) == {"dtype": "torch.float32", "device_map": "hpu"} and not hpu.move
    # Training: the library's dtype, no placement, the Trainer's mode.
    train = loader.plan("", dtype=None, place=False)
    assert train.kwargs(FakeTorch) == {} and not train.move and not train.inference
    with pytest.raises(loader.LoadError, match="dtype must be auto or"):
        loader.plan("cpu", dtype="int3")


def test_quantized_plans(fake_bnb: list[dict[str, object]]) -> None:
    four = loader.plan("cuda", quantization="nf4")  # an old spelling
    assert four.quantization == "4bit" and four.device_map == "cuda" and not four.move
    kwargs = four.kwargs(FakeTorch)
    assert kwargs["device_map"] == "cuda" and kwargs["dtype"] == "torch.bfloat16"
    assert fake_bnb[-1] == {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                            "bnb_4bit_compute_dtype": "torch.bfloat16"}
    qlora = loader.plan("", dtype=None, quantization=JobConfig(method="qlora").quantization, place=False,
                        compute_dtype="fp32")
    assert "device_map" not in qlora.kwargs(FakeTorch)
    assert fake_bnb[-1]["bnb_4bit_compute_dtype"] == "torch.float32"
    loader.plan("cpu", quantization="8bit").kwargs(FakeTorch)
    assert fake_bnb[-1] == {"load_in_8bit": True}
    with pytest.raises(loader.LoadError, match="not supported on Gaudi") as info:
        loader.plan("hpu", quantization="8bit")
    assert info.value.kind == "unsupported"
    with pytest.raises(loader.LoadError, match="quantization must be one of") as info:
        loader.plan("cpu", quantization="2bit")
    assert info.value.kind == "bad_parameters"


@pytest.mark.parametrize("quantization", ["4bit", "8bit"])
def test_without_bitsandbytes_a_sentence_not_a_traceback(monkeypatch: pytest.MonkeyPatch,
                                                        quantization: str) -> None:
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import fails, find_spec finds nothing
    with pytest.raises(loader.LoadError) as info:
        loader.plan("cpu", quantization=quantization)
    assert info.value.kind == "unsupported"
    assert str(info.value) == (f"{quantization} quantization needs bitsandbytes, which is not installed in "
                               "this environment (pip install bitsandbytes), or choose quantization none")
    # A plan made where it was installed, loaded where it is not: the same sentence.
    how = loader.Plan(device="cpu", dtype="fp32", quantization=quantization, compute_dtype="fp32",
                      device_map=None, move=False, inference=True)
    with pytest.raises(loader.LoadError, match="needs bitsandbytes"):
        how.kwargs(FakeTorch)
    assert loader.plan("cpu", quantization="none").quantization == "none"  # no quantization: no need


_HIDDEN_CHECK = """
import importlib.util, json, sys
from gaudi_gui.workers import loader
hidden = loader.hide_bitsandbytes(sys.argv[1], sys.argv[2] or None)
from transformers.utils import is_bitsandbytes_available
import peft  # imports bitsandbytes whenever it is installed and not hidden (peft.helpers)
seen = {"hidden": hidden, "spec": importlib.util.find_spec("bitsandbytes") is not None,
        "transformers_sees": is_bitsandbytes_available(),
        "imported_by_peft": sys.modules.get("bitsandbytes") is not None}
try:
    import bitsandbytes  # what a quantized load or a bitsandbytes optimizer does
    seen["importable"] = True
except ImportError as error:
    seen["importable"], seen["why"] = False, str(error)
print(json.dumps(seen))
"""


@pytest.mark.parametrize(("quantization", "optim", "hidden"), [
    ("none", "", True), ("4bit", "", False), ("none", "paged_adamw_8bit", False)])
def test_bitsandbytes_is_hidden_only_from_a_process_that_cannot_need_it(quantization: str, optim: str,
                                                                        hidden: bool) -> None:
    """A real child: hidden, bitsandbytes is neither imported (peft imports it whenever it is installed:
    seconds of torch.compile at its import, and a Hub call for a kernel on AVX512-BF16 CPUs) nor seen
    by transformers nor importable; a quantized load or a bitsandbytes optimizer keeps it: found, seen by
    transformers, importable. (Whether peft itself imported it is asserted only where it is hidden: in
    the whole suite, late in a worker, a child once found peft had not imported it with no ImportError
    raised, while the same child with the same environment alone had; the product needs only that the
    load can import it.)"""
    import json
    import subprocess
    out = subprocess.run([sys.executable, "-c", _HIDDEN_CHECK, quantization, optim], capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["hidden"] is hidden
    assert seen["spec"] is seen["transformers_sees"] is seen["importable"] is (not hidden), json.dumps(seen)
    if hidden:
        assert not seen["imported_by_peft"], json.dumps(seen)
