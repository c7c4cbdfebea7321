"""Widgets, one view per file. Views subscribe to services' signals and never start processes."""
