"""``python -m gaudi_gui.workers.trackio_dashboard --dir DIR --port N [--project P]``: trackio's own
dashboard over the store DIR (``TRACKIO_DIR``) on 127.0.0.1:N, until it is ended (SIGTERM).

``trackio show`` has no port option and opens a browser itself; ``trackio.show(open_browser=False,
share=False, server_port=N, host="127.0.0.1")`` does neither and binds only the port asked for (a port
taken is an error, not a silent move to the next). Nothing leaves this machine: no share tunnel, the Hub
offline. Started by ``core.dashboard``.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trackio_dashboard")
    parser.add_argument("--dir", required=True, help="trackio's store (TRACKIO_DIR)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--project", default="gaudi-gui")
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
                     server_port=args.port, block_thread=True)
    except OSError as exc:
        print(f"trackio could not serve on 127.0.0.1:{args.port}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
