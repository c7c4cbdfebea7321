"""``gaudi-gui calibrate`` end to end on the CPU: one real INC MEASURE run of the tiny model for the module
(its run folder: INC's measurement files, the QUANT_CONFIGs, the manifest), ``doctor --fp8`` against it
and against edited copies (another card generation, another INC major, a missing file, another model),
and bad input refused with one line and exit 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gaudi_gui import cli
from gaudi_gui.core import fp8
from gaudi_gui.core.runstore import Run, RunStore

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> tuple[Run, str]:
    home = tmp_path_factory.mktemp("calibrate-home")
    data = tmp_path_factory.mktemp("calibrate-data") / "calib.jsonl"
    rows = [{"text": "the cat sat on the mat"}, {"prompt": "hello", "completion": " world"},
            {"messages": [{"role": "user", "content": "what is fp8?"},
                          {"role": "assistant", "content": "a format"}]}]
    data.write_text("\n".join(json.dumps(r) for r in rows * 3) + "\n")
    env = {**os.environ, "GAUDI_GUI_HOME": str(home)}
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "calibrate", "--model", str(tiny_model_dir),
                           "--dataset", str(data), "--prompt=-a prompt that starts with a dash",
                           "--rows", "8", "--device", "cpu", "--no-agent"],
                          capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = RunStore(home / "data" / "runs").runs()
    assert len(runs) == 1
    return runs[0], done.stderr


def test_calibrate_writes_measurements_and_manifest(calibrated: tuple[Run, str],
                                                     tiny_model_dir: Path) -> None:
    run, said = calibrated
    status = run.status()
    assert (status.kind, status.state, status.exit_code) == ("calibrate", "finished", 0)
    assert status.summary.startswith("Finished: 8 rows measured")
    assert "calibrate folder:" in said and "manifest:" in said
    folder = run.folder
    for name in fp8.required_files():
        assert (folder / name).stat().st_size > 0, name
    measured = json.loads((folder / "measure" / "inc_hooks_maxabs.json").read_text())
    assert any("layers.0.mlp" in key for key in measured["Nodes"])  # INC's own record of the modules
    assert not any("lm_head" in key for key in measured["Nodes"])  # the blocklist held
    measure = json.loads((folder / fp8.QUANT_CONFIG_NAME).read_text())
    assert measure["mode"] == "MEASURE" and measure["observer"] == "maxabs" and measure["use_qdq"] is True
    assert measure["dump_stats_path"] == str(folder / "measure" / "inc")
    quantize = json.loads((folder / fp8.QUANTIZE_CONFIG_NAME).read_text())
    assert (quantize["mode"], quantize["scale_method"]) == ("QUANTIZE", "maxabs_pow2")
    manifest = fp8.read_manifest(folder)
    assert manifest["model"]["path"] == str(tiny_model_dir.resolve())
    assert manifest["model"]["revision"] == fp8.config_digest(tiny_model_dir)
    assert (manifest["device"], manifest["generation"]) == ("cpu", "cpu")
    assert manifest["inc_version"] == fp8.inc_version() and manifest["inc_version"].startswith("3.")
    assert manifest["torch_version"].startswith("2.")
    assert manifest["rows"] == 8 and manifest["tokens"] > 8
    assert manifest["prompts_sha256"].startswith("sha256:")
    assert manifest["measurements"] == list(fp8.required_files())
    assert isinstance(manifest["energy"], dict)  # the run meter's (metered kind), energy measured or not


def doctor(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = cli.main(["doctor", *argv])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def edited(folder: Path, to: Path, **changes: object) -> Path:
    shutil.copytree(folder, to)
    manifest = json.loads((to / fp8.MANIFEST_NAME).read_text())
    manifest.update(changes)
    (to / fp8.MANIFEST_NAME).write_text(json.dumps(manifest))
    return to


def test_doctor_fp8_accepts_the_run_and_names_each_mismatch(calibrated: tuple[Run, str], tmp_path: Path,
                                                            tiny_model_dir: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    folder = calibrated[0].folder
    code, out, _err = doctor(["--fp8", str(folder), "--model", str(tiny_model_dir)], capsys)
    assert code == 0 and "the calibration fits this machine" in out and "Intel Neural Compressor: 3." in out
    gaudi3 = edited(folder, tmp_path / "g3", device="hpu", generation="gaudi3")
    code, out, _err = doctor(["--fp8", str(gaudi3)], capsys)
    assert code == 2
    assert "mismatch: device type: calibrated hpu (gaudi3), here cpu (cpu) → scales are device-dependent: " \
           "calibrate again on this machine" in out
    # Gaudi 3 files on a Gaudi 2 machine: the generation, named.
    _manifest, found = fp8.check(gaudi3, here={"device": "hpu", "generation": "gaudi2"})
    assert [m.what for m in found] == ["card generation"]
    assert "gaudi3 scales cannot be used on gaudi2" in found[0].fix
    old_inc = edited(folder, tmp_path / "inc2", inc_version="2.6")
    code, out, _err = doctor(["--fp8", str(old_inc)], capsys)
    assert code == 2 and "mismatch: INC major version: calibrated 2.6, here 3." in out
    missing = edited(folder, tmp_path / "missing")
    (missing / "measure" / "inc_hooks_maxabs.npz").unlink()
    code, out, _err = doctor(["--fp8", str(missing)], capsys)
    assert code == 2 and "missing measure/inc_hooks_maxabs.npz" in out
    other = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (other / "config.json").write_text(json.dumps(config))
    code, out, _err = doctor(["--fp8", str(folder), "--model", str(other)], capsys)
    assert code == 2 and "mismatch: model revision" in out and "calibrate " + str(other) + " again" in out
    code, _out, err = doctor(["--fp8", str(tmp_path)], capsys)
    assert code == 2 and err.count("\n") == 1 and "holds no manifest.json" in err


def calibrate(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = cli.main(["calibrate", *argv, "--no-agent"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, tiny_model_dir: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cases = [
        (["--model", str(tmp_path / "nowhere"), "--prompt", "hi"], "--model: model folder not found"),
        (["--model", str(tiny_model_dir), "--prompt", "hi", "--rows", "0"], "--rows: 0 is not between"),
        (["--model", "org/not-here", "--prompt", "hi"],
         "not in this machine's Hub cache: gaudi-gui download"),
        (["--model", str(tiny_model_dir), "--dataset", str(empty)], "--dataset: empty.jsonl is empty"),
        (["--model", str(tiny_model_dir)], "no calibration prompts"),
        (["--model", str(tiny_model_dir), "--prompt", "hi", "--device", "cpu", "--scale-method", "maxabs_hw"],
         "maxabs_hw needs an HPU"),
        (["--model", str(tiny_model_dir), "--prompt", "hi", "--observer", "nope"], "invalid choice"),
    ]
    for argv, words in cases:
        code, out, err = calibrate(argv, capsys)
        assert code == 2, argv
        assert words in err and err.count("\n") == 1 and "Traceback" not in err, err
        assert out == ""
    assert not RunStore().runs()  # nothing started


def command(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = cli.main([*argv, "--no-agent"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_eval_fp8_compares_the_quantized_model(calibrated: tuple[Run, str], tiny_model_dir: Path,
                                               tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    refs = tmp_path / "refs.jsonl"  # perplexity of its text: what FP8 costs against bf16
    refs.write_text("".join(json.dumps({"prompt": p, "reference": r}) + "\n" for p, r in
                            (("the cat", "sat on the mat"), ("hello", "hello to you"))))
    done = subprocess.run([sys.executable, "-m", "gaudi_gui", "eval", "--model", str(tiny_model_dir), "--fp8",
                           str(calibrated[0].folder), "--prompt", "the cat", "--prompt", "hello",
                           "--data", str(refs), "--metrics", "perplexity", "--fp8-max-rise", "50",
                           "--max-new-tokens", "4", "--output", str(tmp_path), "--json", "--no-agent"],
                          capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FP8 on the CPU (INC's Q/DQ) checks the flow and the answers, not speed" in done.stderr
    record = json.loads(done.stdout)
    assert record["target"]["base_model"] == record["target"]["tuned_model"] == str(tiny_model_dir)
    said = record["tuned"]["fp8"]
    # INC's QUANTIZE with the run's measurements: every Linear of the two layers, lm_head left out.
    assert said["quantized_modules"] == 14 and said["classes"] == ["PatchedLinear"]
    assert (said["scale_method"], said["qdq"]) == ("maxabs_pow2", True)
    assert "fp8" not in record["base"]
    bf16, fp8_ppl = record["base"]["metrics"]["perplexity"], record["tuned"]["metrics"]["perplexity"]
    assert bf16 > 0 and fp8_ppl > 0
    assert record["fp8_cost"].startswith(f"FP8 vs bf16: perplexity {bf16:.4g} → {fp8_ppl:.4g} (")
    assert record["fp8_cost"].endswith("within the 50 % allowed")
    answers = [json.loads(line) for line in Path(record["answers"]).read_text().splitlines()]
    assert len(answers) == 4 and all(a["tuned_new_tokens"] >= 1 for a in answers)  # 2 prompts, 2 references
    # The run folder stays as it was calibrated (INC writes its scale files in a private copy).
    assert fp8.measurement_files(calibrated[0].folder) == list(fp8.required_files())
    assert not list(scratch.glob("fp8-*"))  # and the private copy is gone


def test_serve_and_eval_refuse_a_calibration_of_another_machine(calibrated: tuple[Run, str],
                                                                tiny_model_dir: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    folder = calibrated[0].folder
    gaudi3 = edited(folder, tmp_path / "g3", device="hpu", generation="gaudi3")
    code, out, err = command(["eval", "--model", str(tiny_model_dir), "--fp8", str(gaudi3), "--prompt", "hi"],
                             capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("gaudi-gui eval: --fp8: device type: calibrated hpu (gaudi3), here cpu (cpu) → ")
    code, out, err = command(["serve", "--model", str(tiny_model_dir), "--fp8", str(gaudi3)], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"gaudi-gui serve: --fp8 {gaudi3}: device type: calibrated hpu (gaudi3)")
    # The right machine, but no vLLM here: FP8 serving is vLLM's (--quantization inc); said, not started.
    code, out, err = command(["serve", "--model", str(tiny_model_dir), "--fp8", str(folder)], capsys)
    assert code == 2 and "FP8 serving runs through vLLM" in err and err.count("\n") == 1
    code, out, err = command(["eval", "--run", str(folder), "--fp8", str(folder), "--prompt", "hi"], capsys)
    assert code == 2 and "--fp8 goes with --model" in err
    assert [r.kind for r in RunStore().runs()] == []  # nothing started


def test_vllm_serves_a_calibration_with_inc(calibrated: tuple[Run, str], tiny_model_dir: Path) -> None:
    from gaudi_gui.core import serve as sv
    folder = calibrated[0].folder
    spec = sv.ServeSpec(model=str(tiny_model_dir), engine="vllm", fp8=str(folder))
    argv = sv.vllm_argv(["vllm"], str(tiny_model_dir), spec, bind="127.0.0.1")
    assert argv[argv.index("--quantization"):] == ["--quantization", "inc", "--kv-cache-dtype", "fp8_inc"]
    assert f"--fp8={folder}" in spec.cli_args()
    config = json.loads(Path(fp8.vllm_env(folder)["QUANT_CONFIG"]).read_text())
    assert config["mode"] == "QUANTIZE" and config["dump_stats_path"] == str(folder / "measure" / "inc")
    assert sv.ServeSpec(model="m", fp8="r", quantization="4bit").problems(local=False) == [
        ("fp8", "FP8 serves the calibrated full model: no --quantization, no --adapter")]


def test_ctrl_c_stops_a_calibration_and_says_nothing_was_kept(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A calibration stopped half-way keeps no manifest, and its exit (130) and last line say so: a
    stopped run is a clean end for the supervisor, but not a calibration to use."""
    import signal
    import time

    from tests.helpers import wait_until

    data = tmp_path / "many.jsonl"
    data.write_text("".join(json.dumps({"text": f"row {i} " + "word " * 40}) + "\n" for i in range(400)))
    env = {**os.environ, "GAUDI_GUI_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "calibrate", "--model", str(tiny_model_dir),
                             "--dataset", str(data), "--rows", "400", "--device", "cpu", "--no-agent"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        def measuring() -> bool:
            runs = RunStore(tmp_path / "home" / "data" / "runs").runs()
            return bool(runs) and any(e.get("type") == "progress" for e in runs[0].events())
        assert wait_until(measuring, 120), "no progress in 120 s"
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    run = RunStore(tmp_path / "home" / "data" / "runs").runs()[0]
    assert run.status().state == "stopped"
    assert not (run.folder / fp8.MANIFEST_NAME).exists()
    assert "no measurements kept (no manifest)" in err and "\nmanifest:" not in err
    assert "Traceback" not in err
