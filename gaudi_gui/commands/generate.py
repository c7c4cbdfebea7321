"""PLACEHOLDER: replaced by the issue that builds gaudi-gui generate."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("generate", help="(not built yet)")


def run(args: argparse.Namespace) -> int:
    return 2
