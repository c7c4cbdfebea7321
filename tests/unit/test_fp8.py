"""core.fp8 without INC or torch: calibration prompts in Training's formats, the QUANT_CONFIGs, this
machine's device and card generation as hl-smi names them (the recorded Gaudi server of the fake
hl-smi), the manifest check naming each mismatch, and the doctor's INC and optimum-habana lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gaudi_gui.core import fp8, health


def test_prompts_in_the_formats_training_takes(tmp_path: Path) -> None:
    rows = [{"text": "plain"}, {"prompt": "q: ", "completion": "a"},
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "there"}]},
            {"prompt": [{"role": "user", "content": "p"}],
             "completion": [{"role": "assistant", "content": "c"}]},
            "a bare string"]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert fp8.read_prompts(jsonl) == ["plain", "q: a", "hi\nthere", "p\nc", "a bare string"]
    assert fp8.read_prompts(jsonl, limit=2) == ["plain", "q: a"]
    array = tmp_path / "d.json"
    array.write_text(json.dumps(rows[:2]))
    assert fp8.read_prompts(array) == ["plain", "q: a"]
    text = tmp_path / "d.txt"
    text.write_text("one\n\ntwo\n")
    assert fp8.read_prompts(text) == ["one", "two"]
    for content, name, words in (("", "e.jsonl", "e.jsonl is empty"),
                                 ('{"x": 1}\n', "x.jsonl", "row 1: no text"),
                                 ("{oops\n", "b.jsonl", "line 1: not JSON")):
        (tmp_path / name).write_text(content)
        with pytest.raises(fp8.Fp8Error, match=words):
            fp8.read_prompts(tmp_path / name)
    with pytest.raises(fp8.Fp8Error, match="no such file"):
        fp8.read_prompts(tmp_path / "nowhere.jsonl")
    assert fp8.prompts_digest(["a", "b"]) != fp8.prompts_digest(["ab"])


def test_quant_configs_per_device() -> None:
    cpu = fp8.measure_config("/r/measure/inc", device="cpu")
    assert cpu["use_qdq"] is True and cpu["measure_on_hpu"] is False
    assert cpu["blocklist"]["names"] == ["lm_head"]
    hpu = fp8.measure_config("/r/measure/inc", device="hpu", observer="maxabs", blocklist=["lm_head", "gate"])
    assert "use_qdq" not in hpu and hpu["blocklist"]["names"] == ["lm_head", "gate"]
    assert fp8.default_scale_method("hpu") == "maxabs_hw" and fp8.default_scale_method("cpu") == "maxabs_pow2"
    assert fp8.quantize_config("/r/m", device="hpu", scale_method="maxabs_hw")["mode"] == "QUANTIZE"
    assert fp8.generation_word("HL-225") == "gaudi2" and fp8.generation_word("HL-325L") == "gaudi3"


def _run(folder: Path, **manifest: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in (*fp8.required_files(), fp8.QUANT_CONFIG_NAME):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("{}")
    record = {"kind": "calibrate", "model": {"model": "m", "revision": "r"}, "device": "cpu",
              "generation": "cpu", "inc_version": fp8.inc_version() or "3.10", "observer": "maxabs",
              **manifest}
    (folder / fp8.MANIFEST_NAME).write_text(json.dumps(record))
    return folder


def test_this_gaudi_machine_against_calibrations(tmp_path: Path, fake_hl_smi: Path) -> None:
    here = fp8.machine()
    assert here == {"device": "hpu", "generation": "gaudi1"}  # the recorded HL-205 server
    _manifest, found = fp8.check(_run(tmp_path / "cpu"), here=here)
    assert [m.what for m in found] == ["device type"]
    assert found[0].line().startswith("device type: calibrated cpu (cpu), here hpu (gaudi1) → scales are "
                                      "device-dependent: calibrate again on this machine")
    _manifest, found = fp8.check(_run(tmp_path / "g3", device="hpu", generation="gaudi3"), here=here)
    assert [m.line() for m in found] == [
        "card generation: calibrated gaudi3, here gaudi1 → gaudi3 scales cannot be used on gaudi1: calibrate "
        "again on this machine (gaudi-gui calibrate --model m)"]
    _manifest, found = fp8.check(_run(tmp_path / "same", device="hpu", generation="gaudi1"), here=here)
    assert found == []
    _manifest, found = fp8.check(tmp_path / "same", here=here, inc="")
    assert [m.fix for m in found] == ["pip install neural-compressor-pt"]


def test_the_window_s_machine_calibrations_of_a_model_and_the_refusal_line(tmp_path: Path) -> None:
    """What the window's FP8 fields use: this machine from the agent's card names (no tool run), the
    calibrate runs of the store that measured a model, and the one line that refuses one."""
    assert fp8.machine_of("hpu", ["HL-325L", "HL-325L", ""]) == {"device": "hpu", "generation": "gaudi3"}
    assert fp8.machine_of("hpu", []) == {"device": "hpu", "generation": "gaudi (generation unknown)"}
    assert fp8.machine_of("cuda", ["NVIDIA H100 ", "NVIDIA H100"]) == {"device": "cuda",
                                                                       "generation": "NVIDIA H100"}
    assert fp8.machine_of("cpu", ["x"]) == {"device": "cpu", "generation": "cpu"}
    model, other = tmp_path / "model", tmp_path / "other"
    for made, hidden in ((model, 64), (other, 32)):
        made.mkdir()
        (made / "config.json").write_text(json.dumps({"hidden_size": hidden}))
    runs = tmp_path / "runs"
    mine = _run(runs / "b-mine", model=fp8.model_identity(str(model)))
    g3 = _run(runs / "c-g3", model=fp8.model_identity(str(model)), device="hpu", generation="gaudi3")
    _run(runs / "a-other", model=fp8.model_identity(str(other)))
    (runs / "d-measuring").mkdir()  # a calibration still running: no manifest yet
    found = fp8.calibrations(runs)
    assert [f.name for f, _m in found] == ["c-g3", "b-mine", "a-other"]
    assert [f.name for f, m in found if fp8.calibrated_for(m, str(model))] == ["c-g3", "b-mine"]
    assert not fp8.calibrated_for(found[0][1], "")
    cpu = {"device": "cpu", "generation": "cpu"}
    assert fp8.refusal(str(mine), model=str(model), here=cpu) == (mine, "")
    folder, line = fp8.refusal(str(g3), model=str(model), here=cpu)
    assert folder == g3
    assert line.startswith(f"--fp8 {g3}: device type: calibrated hpu (gaudi3), here cpu (cpu)")
    _folder, line = fp8.refusal(str(mine), model=str(other), here=cpu)
    assert line.startswith(f"--fp8 {mine}: model revision: calibrated {model} @ sha256:")
    assert fp8.refusal(str(runs / "d-measuring"), model=str(model), here=cpu) == (
        None, f"--fp8 {runs / 'd-measuring'}: {runs / 'd-measuring'} holds no manifest.json: not a finished "
              "calibrate run (run gaudi-gui calibrate)")


def test_the_doctor_names_inc_and_optimum_habana() -> None:
    compat: dict[str, object] = {"global_minimums": {}, "rows": []}
    versions = {"accelerate": "1.16.0", "neural-compressor-pt": "3.10", "optimum-habana": "1.21.2"}
    found = {f.check: f for f in health.stack_findings(versions, compat=compat)}
    assert found["stack.inc"].seen.startswith("Intel Neural Compressor (neural-compressor-pt) 3.10")
    gone = found["stack.optimum-habana.support"]
    assert gone.severity == "warning" and "out of support" in gone.seen and "transformers 4.55" in gone.seen
    found = {f.check: f for f in health.stack_findings({"accelerate": "1.16.0"}, compat=compat)}
    assert "pip install neural-compressor-pt" in found["stack.inc"].seen
    assert "stack.optimum-habana.support" not in found


def test_what_fp8_cost_is_said_and_warned_past_the_threshold() -> None:
    """eval --fp8's sentence: perplexity bf16 → FP8 within the allowed rise, a warning past it (the
    issue's default +3 %, or the user's), what to do when there is no perplexity, nothing without FP8."""
    from gaudi_gui.core import evaluation as ev

    def result(bf16: float | None, fp8_ppl: float | None, *, fp8_said: bool = True) -> dict[str, object]:
        def side(ppl: float | None) -> dict[str, object]:
            return {"metrics": {} if ppl is None else {"perplexity": ppl}}
        said = {"fp8": {"qdq": True}} if fp8_said else {}
        return {"base": side(bf16), "tuned": {**side(fp8_ppl), **said}}

    assert ev.fp8_cost(result(10.0, 10.2)) == ("FP8 vs bf16: perplexity 10 → 10.2 (+2.0 %), within the 3 % "
                                               "allowed")
    warned = ev.fp8_cost(result(10.0, 10.4))
    assert warned.startswith("⚠ FP8 costs more than the 3 % allowed: perplexity 10 → 10.4 (+4.0 %)")
    assert "blocklist" in warned
    assert ev.fp8_cost(result(10.0, 10.4), max_rise_pct=5).endswith("within the 5 % allowed")
    assert ev.fp8_cost(result(10.0, 9.9)).startswith("FP8 vs bf16: perplexity 10 → 9.9 (-1.0 %)")
    assert "tick perplexity" in ev.fp8_cost(result(None, None))
    assert ev.fp8_cost(result(10.0, 12.0, fp8_said=False)) == ""


def test_ranks_name_their_files_and_refuse_another_count(tmp_path: Path) -> None:
    """INC's per-rank names (``_<rank>_<world>``), a missing rank's files named by check(), serve's and
    eval's one line naming both counts, and vLLM's tensor-parallel size (one a card of --cards)."""
    from gaudi_gui.core import serve as sv

    assert fp8.rank_suffix(0, 1) == "" and fp8.rank_suffix(1, 2) == "_1_2"
    assert fp8.rank_files("maxabs", 1, 2) == ("measure/inc_hooks_maxabs_1_2.json",
                                              "measure/inc_hooks_maxabs_1_2.npz",
                                              "measure/inc_hooks_maxabs_1_2_mod_list.json")
    assert fp8.required_files(ranks=2) == (*fp8.rank_files(rank=0, ranks=2), *fp8.rank_files(rank=1, ranks=2))
    assert fp8.required_files() == fp8.rank_files()
    folder = tmp_path / "two"
    for name in (*fp8.required_files(ranks=2), fp8.QUANT_CONFIG_NAME):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("{}")
    (folder / fp8.MANIFEST_NAME).write_text(json.dumps({
        "kind": "calibrate", "model": {"model": "m"}, "device": "cpu", "generation": "cpu",
        "inc_version": fp8.inc_version() or "3.10", "observer": "maxabs", "ranks": 2}))
    here = {"device": "cpu", "generation": "cpu"}
    manifest, found = fp8.check(folder, here=here)
    assert found == [] and fp8.ranks_of(manifest) == 2
    (folder / "measure/inc_hooks_maxabs_1_2.npz").unlink()
    _manifest, found = fp8.check(folder, here=here)
    assert [m.here for m in found] == ["missing measure/inc_hooks_maxabs_1_2.npz (rank 1 of 2)"]
    assert fp8.serve_ranks_refusal("R", manifest, 2) == ""
    assert fp8.serve_ranks_refusal("R", manifest, 4) == (
        "--fp8 R: calibrated on 2 cards (2 ranks), this serve would run on 4 cards (tensor parallel 4): "
        "serve on 2 cards (--cards with 2 ids) or calibrate again with --cards of 4 cards")
    assert fp8.eval_ranks_refusal("R", manifest).startswith("--fp8 R: calibrated on 2 cards (2 ranks, a file "
                                                            "set each), eval runs on 1 (one process)")
    one: dict[str, object] = {"ranks": 1}
    assert fp8.eval_ranks_refusal("R", one) == "" and fp8.ranks_of({}) == 1
    assert "serve on 1 card (--cards with 1 id, or none)" in fp8.serve_ranks_refusal("R", one, 2)
    spec = sv.ServeSpec(model="m", engine="vllm", cards=(2, 3))
    argv = sv.vllm_argv(["vllm"], "m", spec, bind="127.0.0.1")
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2" and sv.tensor_parallel(spec) == 2
    assert "--tensor-parallel-size" not in sv.vllm_argv(["vllm"], "m", sv.ServeSpec(model="m"), bind="x")
