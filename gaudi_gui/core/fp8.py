"""FP8 with Intel Neural Compressor (neural-compressor-pt 3.x): what a calibration measures, the
``QUANT_CONFIG`` files of its two steps, the manifest of a ``calibrate`` run folder and the check of
that manifest against this machine (the doctor's ``--fp8``, and ``serve --fp8`` / ``eval --fp8``
before they start anything).

INC's two steps (DESIGN.md, "FP8 with Intel Neural Compressor"): MEASURE runs calibration prompts
through the model and writes ``<dump_stats_path>_hooks_maxabs.json`` / ``.npz`` and
``_mod_list.json``; QUANTIZE reads them with a ``scale_method``. Scales are device-dependent: Gaudi 3's
cannot be used on Gaudi 2, and ``maxabs_hw`` needs an HPU (on the CPU it fails inside INC with a
KeyError), so a CPU calibration uses ``maxabs_pow2`` with Q/DQ (``use_qdq``: the only FP8 mode INC 3.10
runs on a CPU).

Qt-free and torch-free: the manifest check runs where the window and the commands run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata as _metadata
from pathlib import Path
from typing import Any

from gaudi_gui.core import atomic

#: The run folder's files.
MANIFEST_NAME = "manifest.json"
#: The QUANT_CONFIG of the MEASURE step as it ran, and the QUANTIZE one that uses its measurements (what
#: ``QUANT_CONFIG=… vllm serve M --quantization inc`` is given).
QUANT_CONFIG_NAME = "quant_config.json"
QUANTIZE_CONFIG_NAME = "quant_config_quantize.json"
#: Where INC writes its measurements in the run folder: ``measure/inc_hooks_maxabs.json`` …
MEASURE_DIR = "measure"
DUMP_PREFIX = "inc"
MANIFEST_VERSION = 1
#: Calibration rows by default: what Intel's FP8 examples use (``--calib_size 128``-style runs).
DEFAULT_ROWS = 128
MAX_ROWS = 100_000
#: Processes a calibration may measure with (one a card): a Gaudi server has 8 cards.
MAX_RANKS = 64
DEFAULT_OBSERVER = "maxabs"
OBSERVERS = ("maxabs", "maxabs_per_channel", "shape", "save")
DEFAULT_BLOCKLIST = ("lm_head",)
#: The scale methods INC 3.10 names (``ScaleMethodString``), lower case as QUANT_CONFIG spells them.
SCALE_METHODS = ("maxabs_hw", "maxabs_pow2", "unit_scale", "hw_aligned_single_scale", "maxabs_hw_opt_weight",
                 "maxabs_pow2_opt_weight", "maxabs_arbitrary", "act_maxabs_hw_weights_pcs_maxabs_pow2",
                 "act_maxabs_pow2_weights_pcs_maxabs_pow2", "maxabs_pcs_pow2")
#: Scale methods that need an HPU (their scales are the card generation's hardware-aligned ones).
HPU_ONLY = ("maxabs_hw", "maxabs_hw_opt_weight", "act_maxabs_hw_weights_pcs_maxabs_pow2",
            "hw_aligned_single_scale")
INC_PACKAGE = "neural-compressor-pt"
INC_INSTALL = "pip install neural-compressor-pt"
#: Exit codes of the calibrate command and of a refused ``--fp8``.
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
#: How long a tool asked about the cards may take.
TOOL_S = 15.0


class Fp8Error(ValueError):
    """A calibration input or an FP8 run folder that cannot be used: one line for a person."""


def default_scale_method(device: str) -> str:
    """``maxabs_hw`` on Gaudi (Intel's default), ``maxabs_pow2`` elsewhere (Q/DQ on a CPU)."""
    return "maxabs_hw" if device.startswith(("hpu", "gaudi")) else "maxabs_pow2"


# -- the machine ---------------------------------------------------------------------------------


def generation_word(card_name: str) -> str:
    """hl-smi's card name (``HL-225``, ``HL-325L``) as the manifest's word: gaudi2, gaudi3, gaudi1."""
    from gaudi_gui.core.devices import generation
    label = generation(card_name) or ""
    return label.lower().replace(" ", "") if label else ""


def machine_of(device: str, names: Iterable[str]) -> dict[str, str]:
    """A machine as a manifest records it, from what its device tool said: ``device`` (hpu, cuda, cpu)
    and its cards' names (hl-smi's ``HL-225``…, nvidia-smi's). The window builds it from the agent's
    card samples (it runs no tool of its own); ``machine()`` from the tool, run here."""
    said = [n.strip() for n in names if n and n.strip()]
    if device == "hpu":
        words = sorted({generation_word(n) or n for n in said})
        return {"device": "hpu", "generation": "+".join(words) or "gaudi (generation unknown)"}
    if device == "cuda":
        return {"device": "cuda", "generation": "+".join(sorted(set(said))) or "cuda"}
    return {"device": "cpu", "generation": "cpu"}


def machine() -> dict[str, str]:
    """This machine as a manifest records it: ``device`` (hpu, cuda, cpu) and ``generation`` (gaudi2,
    gaudi3, the CUDA card's name, cpu), from the vendor's tool (no torch here)."""
    from gaudi_gui.core import health, hlsmi
    tool = hlsmi.find_hl_smi()
    if tool:
        fields = ("index", "name")
        rc, out, _err = health.run_tool([tool, *hlsmi.query_args(fields)], TOOL_S)
        return machine_of("hpu", [str(s.name or "") for s in hlsmi.parse_csv(out, fields).samples]
                          if rc == 0 else [])
    if shutil.which("nvidia-smi"):
        rc, out, _err = health.run_tool(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], TOOL_S)
        return machine_of("cuda", out.splitlines() if rc == 0 else [])
    return machine_of("cpu", [])


def inc_version() -> str:
    """The installed neural-compressor-pt's version ('' where it is not installed)."""
    for name in (INC_PACKAGE, "neural_compressor_pt", "neural-compressor"):
        with contextlib.suppress(_metadata.PackageNotFoundError):
            return _metadata.version(name)
    return ""


def package_version(name: str) -> str:
    with contextlib.suppress(_metadata.PackageNotFoundError):
        return _metadata.version(name)
    return ""


def _major(version: str) -> str:
    return version.split(".", 1)[0] if version else ""


# -- the model -----------------------------------------------------------------------------------


def config_digest(folder: str | Path) -> str:
    """``sha256:`` of a model folder's config.json ('' where it has none)."""
    try:
        data = (Path(folder) / "config.json").read_bytes()
    except OSError:
        return ""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def model_identity(model: str) -> dict[str, str]:
    """``{"model", "path", "revision"}``: the folder holding ``model`` here (a Hub id's cached snapshot,
    a folder, builtin:demo's), and its revision: the Hub commit where the cache knows it (the snapshot
    folder's name), else a digest of its config.json."""
    from gaudi_gui.core.generation import model_folder
    folder = model_folder(model) or ""
    revision = ""
    if folder:
        parent = Path(folder).resolve().parent
        name = Path(folder).resolve().name
        if parent.name == "snapshots" and len(name) == 40 and all(c in "0123456789abcdef" for c in name):
            revision = name
        else:
            revision = config_digest(folder)
    return {"model": model, "path": str(Path(folder).resolve()) if folder else "", "revision": revision}


# -- calibration prompts -------------------------------------------------------------------------


def _row_text(row: Any) -> str:
    """A row in any of the formats Training takes (text, prompt/completion, messages) as one prompt."""
    if isinstance(row, str):
        return row
    if not isinstance(row, dict):
        return ""
    if isinstance(row.get("text"), str):
        return str(row["text"])
    if isinstance(row.get("messages"), list):
        return "\n".join(str(m.get("content") or "") for m in row["messages"] if isinstance(m, dict))
    if isinstance(row.get("prompt"), str):
        completion = row.get("completion")
        return str(row["prompt"]) + (str(completion) if isinstance(completion, str) else "")
    if isinstance(row.get("prompt"), list):  # conversational prompt/completion
        parts = [*row["prompt"], *(row.get("completion") or [])]
        return "\n".join(str(m.get("content") or "") for m in parts if isinstance(m, dict))
    return ""


def read_prompts(path: str | Path, limit: int = 0) -> list[str]:
    """Calibration prompts from a dataset file: JSONL or a JSON array of rows in Training's formats
    (``text``; ``prompt``/``completion``; ``messages``), or plain text (one prompt a line).
    Fp8Error (one line) for a missing, unreadable or empty file or a row of none of these."""
    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise Fp8Error(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise Fp8Error(f"{path}: {exc}") from None
    rows: list[Any]
    if file.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise Fp8Error(f"{file.name}: not JSON ({exc})") from None
        rows = data if isinstance(data, list) else [data]
    elif file.suffix.lower() == ".jsonl":
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as exc:
                raise Fp8Error(f"{file.name} line {number}: not JSON ({exc})") from None
    else:
        rows = [line for line in text.splitlines() if line.strip()]
    out: list[str] = []
    for number, row in enumerate(rows, 1):
        said = _row_text(row)
        if not said.strip():
            raise Fp8Error(f"{file.name} row {number}: no text (a row is text, prompt/completion or "
                           "messages)")
        out.append(said)
        if limit and len(out) >= limit:
            break
    if not out:
        raise Fp8Error(f"{file.name} is empty: it holds no prompts")
    return out


def prompts_digest(prompts: Iterable[str]) -> str:
    """``sha256:`` of the prompts as measured (each, then a NUL)."""
    h = hashlib.sha256()
    for prompt in prompts:
        h.update(prompt.encode("utf-8"))
        h.update(b"\0")
    return "sha256:" + h.hexdigest()


# -- QUANT_CONFIG --------------------------------------------------------------------------------


def measure_config(dump_stats_path: str, *, device: str, observer: str = DEFAULT_OBSERVER,
                   blocklist: Iterable[str] = DEFAULT_BLOCKLIST) -> dict[str, Any]:
    """The QUANT_CONFIG of the MEASURE step (INC's JSON keys)."""
    config: dict[str, Any] = {"mode": "MEASURE", "observer": observer,
                              "allowlist": {"types": [], "names": []},
                              "blocklist": {"types": [], "names": list(blocklist)},
                              "dump_stats_path": dump_stats_path}
    if device == "cpu":
        # INC 3.10 refuses FP8 on a CPU unless it is Q/DQ, and measures on the HPU unless told.
        config.update(use_qdq=True, measure_on_hpu=False)
    return config


def quantize_config(dump_stats_path: str, *, device: str, scale_method: str,
                    blocklist: Iterable[str] = DEFAULT_BLOCKLIST) -> dict[str, Any]:
    """The QUANT_CONFIG of the QUANTIZE step that uses the measurements at ``dump_stats_path``."""
    config: dict[str, Any] = {"mode": "QUANTIZE", "observer": DEFAULT_OBSERVER, "scale_method": scale_method,
                              "allowlist": {"types": [], "names": []},
                              "blocklist": {"types": [], "names": list(blocklist)},
                              "dump_stats_path": dump_stats_path}
    if device == "cpu":
        config["use_qdq"] = True
    return config


def measurement_files(folder: str | Path) -> list[str]:
    """INC's measurement files in a calibrate run folder (names relative to it), sorted."""
    root = Path(folder)
    found = sorted(p for p in (root / MEASURE_DIR).glob(f"{DUMP_PREFIX}_hooks_*") if p.is_file())
    return [str(p.relative_to(root)) for p in found]


def rank_suffix(rank: int, ranks: int) -> str:
    """What INC adds to its file names in a process of rank ``rank`` among ``ranks``: ``_0_2`` … ('' for
    one process). INC 3.10 (fp8_quant/_quant_common/quant_config.py, ``Fp8cfg.parse``) takes the rank and
    world size from torch.distributed (else LOCAL_RANK / WORLD_SIZE) and names every file
    ``<dump_stats_path>_hooks_<observer>_<rank>_<world size>``, in MEASURE and in QUANTIZE alike: a process
    reads only the files of its own rank and world size."""
    return f"_{rank}_{ranks}" if ranks > 1 else ""


def rank_files(observer: str = DEFAULT_OBSERVER, rank: int = 0, ranks: int = 1) -> tuple[str, ...]:
    """The files one rank's QUANTIZE step reads (relative to the run folder)."""
    base = f"{MEASURE_DIR}/{DUMP_PREFIX}_hooks_{observer}{rank_suffix(rank, ranks)}"
    return (f"{base}.json", f"{base}.npz", f"{base}_mod_list.json")


def required_files(observer: str = DEFAULT_OBSERVER, ranks: int = 1) -> tuple[str, ...]:
    """The files the QUANTIZE step reads (relative to the run folder): every rank's, rank by rank."""
    return tuple(name for rank in range(max(1, ranks)) for name in rank_files(observer, rank, ranks))


def ranks_of(manifest: dict[str, Any]) -> int:
    """The processes a calibration measured with (its world size); 1 for a manifest before ranks."""
    try:
        return max(1, int(manifest.get("ranks") or 1))
    except (TypeError, ValueError):
        return 1


def _cards(count: int) -> str:
    return f"{count} card{'s' if count != 1 else ''}"


def serve_ranks_refusal(name: str, manifest: dict[str, Any], tensor_parallel: int) -> str:
    """The line that refuses ``serve --fp8 RUN`` on another number of ranks than the calibration's ('' when
    they agree): under vLLM each tensor-parallel rank's INC reads the files of its own rank and world size
    (``rank_suffix``), so the counts must be equal."""
    ranks = ranks_of(manifest)
    if ranks == tensor_parallel:
        return ""
    ids = f"{ranks} ids" if ranks > 1 else "1 id, or none"
    return (f"--fp8 {name}: calibrated on {_cards(ranks)} ({ranks} rank{'s' if ranks != 1 else ''}), this "
            f"serve would run on {_cards(tensor_parallel)} (tensor parallel {tensor_parallel}): serve on "
            f"{_cards(ranks)} (--cards with {ids}) or calibrate again with --cards of "
            f"{_cards(tensor_parallel)}")


def eval_ranks_refusal(name: str, manifest: dict[str, Any]) -> str:
    """The line that refuses ``eval --fp8 RUN`` of a calibration on several ranks ('' for one rank): eval
    runs one process, whose INC (world size 1) reads the files without a rank suffix, which a calibration
    on N ranks does not write; another rank's files would be scales of 1/N of the prompts."""
    ranks = ranks_of(manifest)
    if ranks == 1:
        return ""
    return (f"--fp8 {name}: calibrated on {_cards(ranks)} ({ranks} ranks, a file set each), eval runs on 1 "
            f"(one process): evaluate a calibration on one card (gaudi-gui calibrate without --cards), or "
            f"serve this one with --cards of {_cards(ranks)}")


# -- the manifest --------------------------------------------------------------------------------


def make_manifest(*, model: dict[str, str], here: dict[str, str], rows: int, prompts_sha256: str,
                  observer: str, scale_method: str, blocklist: list[str], files: list[str],
                  started: float, duration_s: float, torch_version: str = "", ranks: int = 1,
                  cards: Iterable[int] = (), per_rank: list[list[str]] | None = None) -> dict[str, Any]:
    """The manifest: ``ranks`` the world size measured with (one INC file set a rank, ``per_rank``
    listing each rank's files), ``cards`` the card ids chosen (empty: none chosen)."""
    return {"kind": "calibrate", "version": MANIFEST_VERSION, "created": started,
            "ranks": ranks, "cards": sorted(cards),
            "rank_files": per_rank if per_rank is not None else [files],
            "duration_s": round(duration_s, 3), "model": model, "device": here.get("device", ""),
            "generation": here.get("generation", ""), "inc_version": inc_version(),
            "torch_version": torch_version or package_version("torch"),
            "transformers_version": package_version("transformers"), "rows": rows,
            "prompts_sha256": prompts_sha256, "observer": observer, "scale_method": scale_method,
            "blocklist": blocklist, "quant_config": QUANT_CONFIG_NAME,
            "quantize_config": QUANTIZE_CONFIG_NAME, "measurements": files,
            "energy": "meter-summary.json (written by the run's meter when the run ends)"}


def find_run(name: str) -> Path:
    """A calibrate run folder given as a path or as a run's name in the runs store."""
    folder = Path(name).expanduser()
    if folder.is_dir():
        return folder
    from gaudi_gui.core.runstore import RunStore
    candidate = RunStore().root / name
    if name and "/" not in name and candidate.is_dir():
        return candidate
    raise Fp8Error(f"no calibrate run {name!r} (neither a folder nor a run in {RunStore().root})")


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """A calibrate run's manifest, with the run meter's energy where the meter wrote it."""
    path = Path(folder) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise Fp8Error(f"{folder} holds no {MANIFEST_NAME}: not a finished calibrate run (run gaudi-gui "
                       "calibrate)") from None
    except (OSError, ValueError) as exc:
        raise Fp8Error(f"{path}: {exc}") from None
    if not isinstance(data, dict) or data.get("kind") != "calibrate":
        raise Fp8Error(f"{path}: not a calibrate manifest")
    with contextlib.suppress(OSError, ValueError):
        meter = json.loads((Path(folder) / "meter-summary.json").read_text(encoding="utf-8"))
        if isinstance(meter, dict):
            keys = ("energy_j", "energy_kwh", "energy_source", "energy_status", "wall_s")
            data["energy"] = {k: meter[k] for k in keys if k in meter} or data.get("energy")
    return data


@dataclass(frozen=True)
class Mismatch:
    """One way a calibration does not fit this machine: what, what it says, what is here, what to do."""

    what: str
    recorded: str
    here: str
    fix: str

    def line(self) -> str:
        return (f"{self.what}: calibrated {self.recorded or 'unknown'}, here {self.here or 'unknown'} "
                f"→ {self.fix}")


def check(folder: str | Path, *, here: dict[str, str] | None = None, inc: str | None = None,
          model: str = "") -> tuple[dict[str, Any], list[Mismatch]]:
    """The manifest of the calibrate run at ``folder`` and what in it does not fit this machine (``here``:
    ``machine()``; ``inc``: the installed INC's version) or ``model`` (its revision). Fp8Error when the
    folder is no calibrate run."""
    root = Path(folder)
    manifest = read_manifest(root)
    here = here if here is not None else machine()
    inc = inc_version() if inc is None else inc
    found: list[Mismatch] = []
    recorded_device = str(manifest.get("device") or "")
    recorded_gen = str(manifest.get("generation") or "")
    name = (manifest.get("model") or {}).get("model") or "M"
    again = f"calibrate again on this machine (gaudi-gui calibrate --model {name})"
    if recorded_device != here.get("device"):
        found.append(Mismatch("device type", f"{recorded_device} ({recorded_gen})",
                              f"{here.get('device')} ({here.get('generation')})",
                              f"scales are device-dependent: {again}"))
    elif recorded_gen != here.get("generation"):
        found.append(Mismatch("card generation", recorded_gen, str(here.get("generation") or ""),
                              f"{recorded_gen} scales cannot be used on {here.get('generation')}: {again}"))
    if not inc:
        found.append(Mismatch("Intel Neural Compressor", str(manifest.get("inc_version") or ""),
                              "not installed", INC_INSTALL))
    elif _major(inc) != _major(str(manifest.get("inc_version") or "")):
        found.append(Mismatch("INC major version", str(manifest.get("inc_version") or ""), inc,
                              f"install neural-compressor-pt {_major(str(manifest.get('inc_version')))}.x or "
                              f"{again}"))
    observer = str(manifest.get("observer") or DEFAULT_OBSERVER)
    ranks = ranks_of(manifest)
    missing = []
    for rank in range(ranks):
        gone = [f for f in rank_files(observer, rank, ranks) if not (root / f).is_file()]
        if gone:
            missing.append(", ".join(gone) + (f" (rank {rank} of {ranks})" if ranks > 1 else ""))
    if not (root / QUANT_CONFIG_NAME).is_file():
        missing.append(QUANT_CONFIG_NAME)
    if missing:
        found.append(Mismatch("measurement files", "present", f"missing {', '.join(missing)}",
                              f"the run folder is incomplete: {again}"))
    if model:
        recorded = manifest.get("model") or {}
        now = model_identity(model)
        if not now["revision"]:
            found.append(Mismatch("model", str(recorded.get("revision") or ""), f"{model} not found here",
                                  "give the model the run was calibrated with, or download it first"))
        elif now["revision"] != recorded.get("revision"):
            found.append(Mismatch("model revision", f"{recorded.get('model')} @ {recorded.get('revision')}",
                                  f"{model} @ {now['revision']}", f"measurements belong to their model: "
                                                                   f"calibrate {model} again"))
    return manifest, found


def calibrations(root: str | Path | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """The calibrate runs of the runs store (``root``: its folder), newest first, each with its
    manifest: the folders that hold a calibrate manifest (a run still measuring has none yet)."""
    from gaudi_gui.core.runstore import RunStore
    store = RunStore(root)
    try:
        folders = sorted((p for p in store.root.iterdir() if (p / MANIFEST_NAME).is_file()),
                         key=lambda p: p.name, reverse=True)
    except OSError:
        return []
    found = []
    for folder in folders:
        with contextlib.suppress(Fp8Error):
            found.append((folder, read_manifest(folder)))
    return found


def calibrated_for(manifest: dict[str, Any], model: str) -> bool:
    """Whether a calibration measured ``model`` as it is here: the same revision (the Hub commit, or
    the digest of a folder's config.json), or the same name where the model is not here."""
    recorded = manifest.get("model") or {}
    if not isinstance(recorded, dict) or not model.strip():
        return False
    now = model_identity(model.strip())
    if now["revision"]:
        return now["revision"] == recorded.get("revision")
    return model.strip() == recorded.get("model")


def refusal(name: str, *, model: str, here: dict[str, str] | None = None, inc: str | None = None,
            serve_ranks: int | None = None, evaluating: bool = False) -> tuple[Path | None, str]:
    """``--fp8 NAME`` for ``model`` on this machine (``here``: ``machine()``'s words) before anything
    starts: the calibrate run's folder and "" when it fits; else the one line that refuses it (no such
    run, no manifest, ``check_line``'s first mismatch, or the ranks: ``serve_ranks`` tensor-parallel
    ranks of a serve against the calibration's, ``evaluating``'s one process against a calibration on
    several). The window's FP8 fields say this line; the commands make the same checks."""
    try:
        folder = find_run(name)
        manifest, found = check(folder, here=here, inc=inc, model=model)
    except Fp8Error as exc:
        return None, f"--fp8 {name}: {exc}"
    if found:
        return folder, check_line(name, found)
    if serve_ranks is not None:
        return folder, serve_ranks_refusal(name, manifest, serve_ranks)
    if evaluating:
        return folder, eval_ranks_refusal(name, manifest)
    return folder, ""


def dump_prefix(folder: str | Path) -> str:
    """The ``dump_stats_path`` of the calibrate run at ``folder``, where it is now (absolute)."""
    return str(Path(folder).resolve() / MEASURE_DIR / DUMP_PREFIX)


def relocate(folder: str | Path) -> list[str]:
    """Point the run's two QUANT_CONFIG files at its measurements where the folder is now; the names
    rewritten. INC reads ``dump_stats_path`` as written (an absolute path, the calibrating machine's):
    a calibration brought from a host (``runs fetch``), sent to one (``runs push``) or moved by hand
    would otherwise make vLLM's QUANTIZE step look for files in a folder that is not there."""
    root = Path(folder)
    where = dump_prefix(root)
    rewritten = []
    for name in (QUANT_CONFIG_NAME, QUANTIZE_CONFIG_NAME):
        path = root / name
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(config, dict) and config.get("dump_stats_path") != where:
            atomic.write_json(path, {**config, "dump_stats_path": where}, fsync=False)
            rewritten.append(name)
    return rewritten


def vllm_env(folder: str | Path) -> dict[str, str]:
    """The environment of ``vllm serve … --quantization inc`` for a calibrate run: QUANT_CONFIG, its
    QUANTIZE config, whose ``dump_stats_path`` is made to name the run's measurements where they are
    now (``relocate``)."""
    relocate(folder)
    return {"QUANT_CONFIG": str(Path(folder).resolve() / QUANTIZE_CONFIG_NAME)}


def check_line(name: str, found: list[Mismatch]) -> str:
    """The one line a refused ``--fp8`` prints: the first mismatch, and how many more."""
    more = f" (and {len(found) - 1} more: gaudi-gui doctor --fp8 {name})" if len(found) > 1 else ""
    return f"--fp8 {name}: {found[0].line()}{more}"


def summary_words(record: dict[str, Any]) -> str:
    """What the runs list says of a finished calibration."""
    model = (record.get("model") or {}).get("model") or "a model"
    where = record.get("generation") or record.get("device")
    ranks = ranks_of(record)
    on = f" ({ranks} ranks)" if ranks > 1 else ""
    return (f"{record.get('rows')} rows measured, {model} on {where}{on}"
            f" ({len(record.get('measurements') or [])} files)")


def env_run_folder() -> str:
    """The run folder of the job this process is (its supervisor says it), '' outside one."""
    return os.environ.get("GAUDI_GUI_RUN_FOLDER", "")


__all__ = [
    "DEFAULT_BLOCKLIST",
    "DEFAULT_OBSERVER",
    "DEFAULT_ROWS",
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "EXIT_OK",
    "INC_INSTALL",
    "MANIFEST_NAME",
    "MEASURE_DIR",
    "QUANTIZE_CONFIG_NAME",
    "QUANT_CONFIG_NAME",
    "Fp8Error",
    "Mismatch",
    "calibrated_for",
    "calibrations",
    "check",
    "check_line",
    "config_digest",
    "default_scale_method",
    "dump_prefix",
    "eval_ranks_refusal",
    "find_run",
    "generation_word",
    "inc_version",
    "machine",
    "machine_of",
    "make_manifest",
    "measure_config",
    "measurement_files",
    "model_identity",
    "prompts_digest",
    "quantize_config",
    "rank_files",
    "rank_suffix",
    "ranks_of",
    "read_manifest",
    "read_prompts",
    "refusal",
    "relocate",
    "required_files",
    "serve_ranks_refusal",
    "summary_words",
]
