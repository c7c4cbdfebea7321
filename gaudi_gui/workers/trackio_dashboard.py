"""``python -m gaudi_gui.workers.trackio_dashboard --dir DIR --port N [--project P] [--exports]``:
trackio's own dashboard over the store DIR (``TRACKIO_DIR``) on 127.0.0.1:N, until it is ended (SIGTERM)
or, with ``--exports``, until its stdin closes.

``--exports``: each line on stdin is a run folder to export into the store first (the export of
``gaudi_gui.workers.trackio_export``, one JSON line with "ok" each): this process has imported trackio
already (a second or more of the open's time), so an open does not pay for a second import in an
export child.

``trackio show`` has no port option and opens a browser itself; ``trackio.show(open_browser=False,
share=False, server_port=N, host="127.0.0.1")`` does neither and binds only the port asked for (a port
taken is an error, not a silent move to the next). Nothing leaves this machine: no share tunnel, the Hub
offline. Started by ``core.dashboard``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trackio_dashboard")
    parser.add_argument("--dir", required=True, help="trackio's store (TRACKIO_DIR)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--project", default="gaudi-gui")
    parser.add_argument("--exports", action="store_true", help="export the run folders read on stdin")
    args = parser.parse_args(argv)
    # trackio reads TRACKIO_DIR when it is imported.
    os.environ["TRACKIO_DIR"] = args.dir
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["GRADIO_SHARE"] = "False"
    try:
        import trackio
    except ImportError as exc:
        print(f"trackio cannot be imported: {exc} (`{sys.executable} -m pip install 'trackio>=0.40'`)",
              file=sys.stderr)
        return 2
    try:
        trackio.show(project=args.project, open_browser=False, share=False, host="127.0.0.1",
                     server_port=args.port, block_thread=not args.exports)
    except OSError as exc:
        print(f"trackio could not serve on 127.0.0.1:{args.port}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    if args.exports:
        _exports(args.project)
    return 0


def _exports(project: str) -> None:
    """Export each run folder read on stdin (its answer: one JSON line); return when stdin closes."""
    for line in sys.stdin:
        folder = line.strip()
        if not folder:
            continue
        try:
            from gaudi_gui.workers import trackio_export
            trackio_export.main(["--run", folder, "--project", project])
        except SystemExit as exc:  # argparse refusing the line: answered, never the end of the server
            print(json.dumps({"ok": False, "message": f"cannot export {folder!r} (exit {exc.code})"}),
                  flush=True)
        except Exception as exc:  # the export's own failure is its answer; the dashboard serves on
            print(json.dumps({"ok": False, "message": f"the trackio export failed: {exc}"}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
