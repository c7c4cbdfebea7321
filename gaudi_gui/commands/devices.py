"""PLACEHOLDER: replaced by the issue that builds gaudi-gui devices."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("devices", help="(not built yet)")


def run(args: argparse.Namespace) -> int:
    return 2
