"""The Environment view: what the worker Python has (versions, devices, Gaudi variables), copyable."""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui import __version__
from gaudi_gui.core import environment
from gaudi_gui.services.context import AppServices

_DEVICE_TEXT = {"hpu": "Intel Gaudi (HPU)", "cuda": "NVIDIA CUDA", "cpu": "CPU"}
_WHY = {
    "torch": "runs every model; never replaced by gaudi-gui (Gaudi ships Intel's own build)",
    "habana_frameworks": "Intel's habana-torch-plugin: from Intel's installer or Gaudi containers",
    "transformers": "models, Trainer, TrainingArguments",
    "accelerate": ">= 1.5 needed for transformers to see Gaudi; launches training",
    "peft": "LoRA / QLoRA",
    "bitsandbytes": "8-bit / 4-bit quantization (QLoRA); on Gaudi nf4 only",
    "datasets": "training data loading",
    "tokenizers": "fast tokenizers, the demo model's tokenizer",
    "PySide6": "this window",
    "deepspeed": "ZeRO / DeepSpeed training (Intel's fork on Gaudi)",
    "optimum-habana": "Gaudi-optimized Trainer and models (GaudiTrainer)",
}


class EnvironmentTab(QWidget):
    """Shows the EnvironmentProbe's report; Refresh re-runs the probe child, Copy copies it as text."""

    def __init__(self, services: AppServices, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._probe = services.environment
        self._info: dict[str, Any] | None = None

        self.summary = QLabel("Probing the Python environment in a child process…")
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.summary.setWordWrap(True)
        self.warnings = QLabel("")
        self.warnings.setWordWrap(True)
        self.warnings.setStyleSheet("QLabel { color: #9a4a00; }")
        self.warnings.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.warnings.hide()

        self.refresh_button = QPushButton("&Refresh")
        self.refresh_button.setToolTip("Run the probe again (after installing a package, say)")
        self.refresh_button.clicked.connect(self._probe.refresh)
        self.copy_button = QPushButton("&Copy as text")
        self.copy_button.setToolTip("Copy the whole report, for a bug report")
        self.copy_button.clicked.connect(self.copy_report)  # takes no argument, so `checked` is dropped
        self.copy_button.setEnabled(False)
        #: Says what the last Copy did ("Copied N lines to the clipboard").
        self.copy_status = QLabel("")
        buttons = QHBoxLayout()
        buttons.addWidget(self.summary, 1)
        buttons.addWidget(self.copy_status)
        buttons.addWidget(self.refresh_button)
        buttons.addWidget(self.copy_button)

        self.packages = self._table(["Package", "Version", "What it is for"])
        self.devices = self._table(["Item", "Value"])
        self.variables = self._table(["Variable", "Value"])

        packages_box = QGroupBox("Packages (in the worker Python)")
        QVBoxLayout(packages_box).addWidget(self.packages)
        devices_box = QGroupBox("Devices")
        QVBoxLayout(devices_box).addWidget(self.devices)
        variables_box = QGroupBox("Gaudi / device variables")
        QVBoxLayout(variables_box).addWidget(self.variables)
        lower = QHBoxLayout()
        lower.addWidget(devices_box, 1)
        lower.addWidget(variables_box, 1)

        notes = QLabel(
            "<b>Gaudi set-up:</b> the driver, firmware and <code>habana-torch-plugin</code> "
            "(with Intel's torch build) come from Intel's installer or a Gaudi container, not from "
            "PyPI. gaudi-gui never replaces that torch. It sets <code>PT_ENABLE_INT64_SUPPORT=1</code> "
            "and <code>HABANA_VISIBLE_MODULES</code> (from the Devices tab) for every job it starts; "
            "accelerate must be 1.5 or newer.")
        notes.setWordWrap(True)
        notes.setTextFormat(Qt.TextFormat.RichText)

        layout = QVBoxLayout(self)
        layout.addLayout(buttons)
        layout.addWidget(self.warnings)
        layout.addWidget(packages_box, 3)
        layout.addLayout(lower, 2)
        layout.addWidget(notes)

        self._probe.probe_started.connect(self._on_started)
        self._probe.probe_finished.connect(self.show_report)
        self._probe.probe_failed.connect(self._on_failed)
        if self._probe.result is not None:
            self.show_report(self._probe.result)

    @staticmethod
    def _table(headers: list[str]) -> QTableWidget:
        table = QTableWidget(0, len(headers))
        table.setHorizontalHeaderLabels(headers)
        table.verticalHeader().hide()
        table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        table.horizontalHeader().setStretchLastSection(True)
        table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        return table

    @staticmethod
    def _fill(table: QTableWidget, rows: list[tuple[str, ...]], bad: set[int] | None = None) -> None:
        table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            for c, text in enumerate(row):
                item = QTableWidgetItem(text)
                if bad and r in bad:
                    item.setForeground(QColor("#b00020"))
                table.setItem(r, c, item)
        header = table.horizontalHeader()
        for column in range(table.columnCount() - 1):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(table.columnCount() - 1, QHeaderView.ResizeMode.Stretch)

    # -- slots ----------------------------------------------------------------------------------------

    def _on_started(self) -> None:
        self.refresh_button.setEnabled(False)
        self.summary.setText("Probing the Python environment in a child process…")

    def _on_failed(self, reason: str) -> None:
        self.refresh_button.setEnabled(True)
        first, _, rest = reason.partition("\n")
        self.summary.setText(f"<b>The probe failed:</b> {html.escape(first)}")
        self.warnings.setText(rest or "No output.")
        self.warnings.show()

    def show_report(self, info: dict[str, Any]) -> None:
        self._info = info
        self.refresh_button.setEnabled(True)
        self.copy_button.setEnabled(True)
        device = info.get("device", "cpu")
        self.summary.setText(
            f"Jobs will run on <b>{html.escape(str(_DEVICE_TEXT.get(device, device)))}</b> · Python "
            f"{html.escape(str(info.get('python')))} · probed in {info.get('probe_seconds', 0):.1f} s")
        packages = info.get("packages", {})
        errors = info.get("errors", {})
        rows: list[tuple[str, ...]] = []
        bad: set[int] = set()
        # Qt signals do not keep dict order: show packages in the schema's order, then any extras.
        names = [n for n in environment.PACKAGES if n in packages]
        names += [n for n in packages if n not in names]
        # Optional packages (deepspeed, optimum-habana) appear only when installed.
        optional = {n: v for n, v in info.get("optional_packages", {}).items() if v}
        packages = {**packages, **optional}
        names += [n for n in optional if n not in names]
        for r, name in enumerate(names):
            version = packages[name]
            status = version or ("not installed" if name not in errors else "import failed")
            if name == "accelerate" and version and environment.parse_version(version) < \
                    environment.MIN_ACCELERATE:
                status += "  (too old: needs >= 1.5.0)"
                bad.add(r)
            if name in ("torch", "transformers", "accelerate") and not version:
                bad.add(r)
            rows.append((name, status, errors.get(name, _WHY.get(name, ""))))
        self._fill(self.packages, rows, bad)
        gaudi = info.get("gaudi", {})
        unknown = f"unknown ({gaudi['error']})" if gaudi.get("error") else "unknown"
        self._fill(self.devices, [
            ("gaudi-gui", str(info.get("gaudi_gui_version") or __version__)),
            ("Gaudi driver", str(gaudi.get("driver_version") or unknown)),
            ("Gaudi firmware", str(gaudi.get("firmware_version") or unknown)),
            ("hl-smi", str(gaudi.get("hl_smi_version") or unknown)),
            ("device used (hpu > cuda > cpu)", _DEVICE_TEXT.get(device, device)),
            ("is_torch_hpu_available()", str(info.get("is_torch_hpu_available"))),
            ("habana_frameworks", "present" if info.get("habana_frameworks") else "absent"),
            ("HPU count", str(info.get("hpu_count", 0))),
            ("CUDA count", str(info.get("cuda_count", 0))),
            ("platform", str(info.get("platform", ""))),
            ("worker Python", str(info.get("executable", ""))),
        ])
        env = info.get("env", {})
        keys = [k for k in environment.ENV_KEYS if k in env] + [k for k in env if k not in
                                                                environment.ENV_KEYS]
        self._fill(self.variables, [(k, env[k] if env[k] is not None else "(unset)") for k in keys])
        warnings = info.get("warnings", [])
        self.warnings.setText("\n".join(f"⚠ {w}" for w in warnings))
        self.warnings.setVisible(bool(warnings))

    def report_text(self) -> str:
        return environment.as_text(self._info) if self._info else ""

    def copy_report(self) -> None:
        text = self.report_text()
        if not text:
            self.copy_status.setText("Nothing to copy yet")
            return
        QGuiApplication.clipboard().setText(text)
        self.copy_status.setText(f"Copied {len(text.splitlines())} lines to the clipboard")
