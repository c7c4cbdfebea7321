"""QObject adapters around QProcess/QTimer. Services never import torch; views talk only to services."""
