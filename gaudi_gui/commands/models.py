"""``gaudi-gui models``: the Hub cache of this machine (``scan_cache_dir``): models, revisions, size on
disk, last used; ``--delete REPO_ID[@REV]`` says what it frees and, with ``--yes``, deletes it through
the library's ``delete_revisions(...).execute()``. Without ``--yes`` nothing is deleted (exit 0)."""

from __future__ import annotations

import argparse
import json
import sys

from gaudi_gui.core import hub
from gaudi_gui.core.metrics import format_ago


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="the Hub cache: models, revisions, size, last used; free space")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--sort", choices=("size", "used"), default="size",
                   help="biggest first (size, the default) or most recently used first (used)")
    p.add_argument("--delete", default="", metavar="REPO_ID[@REV]",
                   help="delete a model (every cached revision) or one revision (commit, its prefix, "
                        "or a ref such as main) from the cache")
    p.add_argument("--yes", action="store_true", help="with --delete: really delete (otherwise it only "
                                                      "says what would be freed)")
    p.add_argument("--cache-dir", default=None, metavar="DIR", help="the Hub cache (default HF_HUB_CACHE)")


def run(args: argparse.Namespace) -> int:
    if args.yes and not args.delete:
        print("gaudi-gui models: --yes goes with --delete REPO_ID[@REV]", file=sys.stderr)
        return 2
    if args.delete:
        return _delete(args)
    listing = hub.list_cache(args.cache_dir, sort=args.sort)
    if args.json:
        print(json.dumps(listing.to_dict(), sort_keys=True))
        return 0
    if not listing.models:
        print(f"the Hub cache {listing.cache_dir} holds no model")
        return 0
    print(f"Hub cache {listing.cache_dir}: {len(listing.models)} repos, {hub.human(listing.size_on_disk)}; "
          f"{hub.human(hub.free_bytes(listing.cache_dir))} free")
    print(f"{'SIZE':>10}  {'LAST USED':>12}  {'REVS':>4}  REPO")
    for m in listing.models:
        kind = "" if m.repo_type == "model" else f" ({m.repo_type})"
        print(f"{hub.human(m.size_on_disk):>10}  {format_ago(m.last_accessed):>12}  {len(m.revisions):>4}  "
              f"{m.repo_id}{kind}")
        for rev in m.revisions:
            refs = f" ({', '.join(rev.refs)})" if rev.refs else ""
            mark = f"  ⚠ incomplete: {rev.incomplete}" if rev.incomplete else ""
            print(f"{'':>10}  {'':>12}  {'':>4}    @{rev.commit[:12]}{refs} "
                  f"{hub.human(rev.size_on_disk)}{mark}")
    if listing.incomplete_bytes:
        print(f"unfinished downloads: {hub.human(listing.incomplete_bytes)} in .incomplete files")
    for warning in listing.warnings:
        print(f"warning: {warning}")
    return 0


def _delete(args: argparse.Namespace) -> int:
    try:
        plan = hub.deletion(args.delete, args.cache_dir)
    except hub.HubProblem as problem:
        print(f"gaudi-gui models: {problem}", file=sys.stderr)
        return 2
    what = (f"{plan.repo_id} ({len(plan.revisions)} revision{'s' if len(plan.revisions) != 1 else ''}: "
            f"{', '.join(r[:12] for r in plan.revisions)})")
    if not args.yes:
        if args.json:
            print(json.dumps({"deleted": False, "repo_id": plan.repo_id, "revisions": plan.revisions,
                              "frees_bytes": plan.freed_bytes}))
        else:
            print(f"would delete {what}, freeing {hub.human(plan.freed_bytes)}; add --yes to delete")
        return 0
    plan.execute()
    if args.json:
        print(json.dumps({"deleted": True, "repo_id": plan.repo_id, "revisions": plan.revisions,
                          "freed_bytes": plan.freed_bytes}))
    else:
        print(f"deleted {what}: freed {hub.human(plan.freed_bytes)}")
    return 0
