"""Command-line subcommands. Each module exposes ``add_parser(subparsers)`` and ``run(args) -> int``."""
