"""``python -m gaudi_gui.workers.trackio_export --run FOLDER --project NAME``: a run's metrics and meter
into trackio's local storage (``core.export.export_trackio`` starts it with TRACKIO_DIR set).

Prints one JSON line: ``{"ok": true, "db": PATH, "scalars": N, "tags": [...], "missing": [...],
"replaced": BOOL}`` or ``{"ok": false, "message": "..."}`` (exit 1).

trackio is imported here and only here: it reads TRACKIO_DIR once, when imported, and its import
is heavy (gradio-client, httpx, huggingface-hub). The rows come from ``core.export.trackio_rows``; they
are written with trackio's storage class, which is what ``trackio.log``/``log_system`` end in
(``SQLiteStorage.bulk_log`` / ``bulk_log_system``) but takes each row's own time: ``trackio.init``
would also ask the Hub who the user is (``whoami`` where a token is stored) and start a sender
thread, neither of which an export of finished data needs.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from typing import Any

from gaudi_gui.core import export
from gaudi_gui.core.runstore import Run


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat()


def write(run: Run, project: str) -> dict[str, Any]:
    rows = export.trackio_rows(run)
    from trackio.sqlite_storage import SQLiteStorage

    SQLiteStorage.validate_project_name(project)
    run_id = export.trackio_run_id(run.name)
    # The run's earlier export (same id) goes first: exporting again replaces it, never doubles it.
    replaced = SQLiteStorage.delete_run(project, run.name, run_id=run_id)
    SQLiteStorage.bulk_log(project=project, run=run.name, run_id=run_id,
                           metrics_list=[values for _s, _t, values in rows.metrics],
                           steps=[step for step, _t, _v in rows.metrics],
                           timestamps=[_iso(t) for _s, t, _v in rows.metrics], config=rows.config)
    SQLiteStorage.bulk_log_system(project=project, run=run.name, run_id=run_id,
                                  metrics_list=[values for _t, values in rows.system],
                                  timestamps=[_iso(t) for t, _v in rows.system])
    return {"ok": True, "db": str(SQLiteStorage.get_project_db_path(project)), "scalars": rows.scalars,
            "tags": rows.tags, "missing": rows.missing, "replaced": replaced, "run_id": run_id}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gaudi_gui.workers.trackio_export")
    parser.add_argument("--run", required=True, help="the run folder")
    parser.add_argument("--project", default=export.TRACKIO_PROJECT)
    args = parser.parse_args(argv)
    run = Run(args.run)
    try:
        answer = write(run, args.project)
    except export.ExportError as exc:
        answer = {"ok": False, "message": str(exc)}
    except ImportError as exc:
        answer = {"ok": False, "message": f"trackio cannot be imported here ({exc}): pip install trackio"}
    except (OSError, ValueError) as exc:  # a folder it cannot write, a name trackio refuses, a bad file
        answer = {"ok": False, "message": str(exc)}
    print(json.dumps(answer), flush=True)
    return 0 if answer["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
