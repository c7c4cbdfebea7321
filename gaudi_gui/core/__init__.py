"""Qt-free and torch-free logic. Nothing under core may import PySide6, torch or transformers:
tests/unit/test_core_imports.py enforces it."""
