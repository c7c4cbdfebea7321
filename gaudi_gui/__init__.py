"""gaudi-gui: a desktop control panel for Intel Gaudi (and CUDA / CPU) machines."""

__version__ = "0.1.0"
