"""``python scripts/screenshot_models.py [WIDTHxHEIGHT] [OUT.png]``: the Models tab with one model
downloaded and one download stalled mid-file (a fake Hub on 127.0.0.1, a throwaway home), for looking
at the layout. Writes docs/screens/models-WIDTHxHEIGHT.png by default."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def main() -> int:
    from scripts.shot import open_window, parse_size, wait_until
    from tests.fake_hub import FakeHub, FakeRepo

    size = sys.argv[1] if len(sys.argv) > 1 else "1280x800"
    width, height = parse_size(size, "screenshot_models")
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "docs" / "screens" / f"models-{size}.png"
    home = Path(tempfile.mkdtemp(prefix="gg-shot-"))
    hub = FakeHub().start()
    os.environ.update({"GAUDI_GUI_HOME": str(home / "gg"), "HF_HOME": str(home / "hf"),
                       "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1"})
    os.environ.pop("HF_HUB_OFFLINE", None)
    hub.repos["Qwen/Qwen3-0.6B"] = FakeRepo(files={"config.json": b"{}", "tokenizer.json": b"{}",
                                                  "model.safetensors": os.urandom(3_000_000)})
    hub.repos["meta-llama/Llama-3.2-1B"] = FakeRepo(files={"config.json": b"{}",
                                                          "model.safetensors": os.urandom(6_000_000)})
    hub.stall("meta-llama/Llama-3.2-1B", "model.safetensors", times=10)
    app, _services, window = open_window(5, width, height)
    tab = window.models_tab
    from gaudi_gui.services.downloads import DownloadRequest

    done = tab.places.download(DownloadRequest("Qwen/Qwen3-0.6B"))
    wait_until(app, lambda: done.ok is not None and tab.table.rowCount() == 1 and not tab.is_listing(), 120)
    stalled = tab.places.download(DownloadRequest("meta-llama/Llama-3.2-1B", stall_s=60))
    wait_until(app, lambda: hub.stalled.is_set() and bool(stalled.progress), 120)
    out.parent.mkdir(parents=True, exist_ok=True)
    window.grab().save(str(out))
    print(out)
    stalled.cancel()
    wait_until(app, lambda: stalled.ok is not None, 60)
    window.close()
    hub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
