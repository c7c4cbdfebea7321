"""Where a run goes, as controls: this machine, a saved host, several hosts, or a Slurm cluster.

The widget's one product is a ``core.placement.Placement`` (``placement()``): the Training tab (and
any later kind of work) reads where to run from it and never from the controls. It owns the Host
combo, the check boxes of "several hosts…", the Slurm fields and the note under them, remembers the
last choice in the settings, and says ``changed`` whenever the placement may have changed (a host
picked, a check, a Slurm field, a host's card selection in the Hosts tab).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core import remote as remote_mod
from gaudi_gui.core import slurm as slurm_mod
from gaudi_gui.core import visibility
from gaudi_gui.core.placement import Placement
from gaudi_gui.core.slurm import SlurmTarget
from gaudi_gui.services.context import AppServices
from gaudi_gui.services.device_selection import DeviceSelection

#: The Host combo's entry for one run across several hosts (its item data).
SEVERAL = "*several*"
#: The Host combo's entry for a job submitted to Slurm with sbatch (its item data).
SLURM = "*slurm*"


class PlacementWidget(QWidget):
    """The placement controls. ``grace_s``: the stop grace period (a Slurm time limit's checkpoint
    stop comes that long before it); ``runs_root``: where run folders go (named in the Slurm note);
    ``device``: the default device of the Slurm nodes."""

    #: The placement may have changed.
    changed = Signal()

    def __init__(self, services: AppServices, *, grace_s: Callable[[], float], runs_root: Path,
                 device: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.services = services
        self._grace_s = grace_s
        self._runs_root = runs_root
        self._device = device
        #: Hosts whose card selection this widget follows (``host_cards``).
        self._watched_selections: dict[str, DeviceSelection] = {}
        self._saved: list[remote_mod.Host] = []

        self.host_combo = QComboBox(self)
        self.host_combo.setToolTip("where Start runs the job: this machine, or a host over SSH (the run "
                                   "lives on the host and goes on if the app or the connection ends)")
        self.host_tip = self.host_combo.toolTip()
        self.host_note = QLabel("", self)
        self.host_note.setWordWrap(True)
        # "several hosts…": one run across the checked hosts (machine rank in this order).
        self.hosts_box = QWidget(self)
        self.hosts_row = QHBoxLayout(self.hosts_box)
        self.hosts_row.setContentsMargins(0, 0, 0, 0)
        self.hosts_row.addWidget(QLabel("Hosts", self.hosts_box))
        self.hosts_row.addStretch(1)
        self.host_checks: dict[str, QCheckBox] = {}
        self.hosts_box.setVisible(False)
        self._make_slurm_box()

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        row.addWidget(QLabel("Host", self))
        row.addWidget(self.host_combo, 1)
        layout.addLayout(row)
        #: Where a view puts what it says about the placement right under the Host field (the gate).
        self.below_host = QVBoxLayout()
        self.below_host.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(self.below_host)
        layout.addWidget(self.hosts_box)
        layout.addWidget(self.slurm_box)
        layout.addWidget(self.host_note)

        self.refresh_hosts(str(services.settings.get("training/host") or remote_mod.LOCAL))
        self.host_combo.currentIndexChanged.connect(lambda _i: self._on_host_changed())

    # -- the value ---------------------------------------------------------------------------------

    def placement(self) -> Placement:
        """Where Start runs now, with each host's chosen cards (empty: all of that host's)."""
        if self.slurm_selected():
            return Placement.on_slurm(self.slurm_target().to_record())
        if self.multi_selected():
            hosts = self.selected_hosts()
            cards = {h.name: self.host_cards(h) for h in hosts}
            if len(hosts) >= 2:
                return Placement.on_hosts(hosts, cards)
            # Fewer than two checked: a "hosts" placement the form refuses (problems() says why).
            return Placement("hosts", tuple(hosts))
        host = self.selected_host()
        return Placement.on_host(host, self.host_cards(host)) if not host.is_local else Placement.local()

    def multi_selected(self) -> bool:
        return self.host_combo.currentData() == SEVERAL

    def slurm_selected(self) -> bool:
        return self.host_combo.currentData() == SLURM

    def selected_hosts(self) -> list[remote_mod.Host]:
        """The hosts of a run on several hosts, in machine-rank order (the checked ones)."""
        by_name = {h.name: h for h in self._saved}
        return [by_name[name] for name, box in self.host_checks.items()
                if box.isChecked() and name in by_name]

    def selected_host(self) -> remote_mod.Host:
        """Where Start runs (several hosts: the main host, the first checked; Slurm: this machine,
        where the job is prepared)."""
        name = str(self.host_combo.currentData() or remote_mod.LOCAL)
        if name == SEVERAL:
            several = self.selected_hosts()
            return several[0] if several else remote_mod.Host.local()
        by_name = {h.name: h for h in self._saved}
        return by_name.get(name, remote_mod.Host.local())

    def slurm_target(self) -> SlurmTarget:
        """The Slurm fields as sbatch options (the stop before a time limit is the stop grace period,
        as ``train --grace`` makes it)."""
        options = slurm_mod.SlurmOptions(
            nodes=self.slurm_nodes.value(), partition=self.slurm_partition.text().strip(),
            time=self.slurm_time.text().strip(), account=self.slurm_account.text().strip(),
            cards_per_node=self.slurm_cards.value(), gres=self.slurm_gres.text().strip(),
            device=str(self.slurm_device.currentData() or "cpu"),
            stop_before_limit_s=int(self._grace_s()))
        return SlurmTarget(options, str(self.slurm_login.currentData() or remote_mod.LOCAL))

    def host_cards(self, host: remote_mod.Host) -> list[int]:
        """The cards checked for ``host`` in its Devices panel (Hosts tab); empty: all of them."""
        selection = self.services.host_selections.get(host.name)
        if selection is None:
            return []
        if self._watched_selections.get(host.name) is not selection:
            self._watched_selections[host.name] = selection
            selection.selection_changed.connect(self._on_host_selection_changed)
        return list(selection.selected)

    def cards_phrase(self, host: remote_mod.Host) -> str:
        cards = self.host_cards(host)
        if not cards:
            return f"all of {host.name}'s cards"
        return f"cards {visibility.format_ids(cards)} of {host.name}"

    # -- hosts -------------------------------------------------------------------------------------

    def _saved_hosts(self) -> list[remote_mod.Host]:
        """The saved hosts, from the app's host list in memory (``AppServices.hosts``)."""
        return self.services.ensure_hosts(self.services.settings.parent()).saved()

    def refresh_hosts(self, wanted: str | None = None) -> None:
        """"local" first, then the saved hosts, "Slurm cluster…" and (two or more saved) "several
        hosts…"; ``wanted`` (default: the current choice) selected if listed."""
        if wanted is None:
            wanted = str(self.host_combo.currentData() or remote_mod.LOCAL)
        self._saved = self._saved_hosts()
        items = [(h.label, h.name) for h in [remote_mod.Host.local(), *self._saved]]
        items.append(("Slurm cluster…", SLURM))
        if len(self._saved) >= 2:
            items.append(("several hosts…", SEVERAL))  # the last entry (End picks it)
        names = [self.host_combo.itemData(i) for i in range(self.host_combo.count())]
        if names != [n for _l, n in items]:
            self.host_combo.blockSignals(True)
            self.host_combo.clear()
            for label, name in items:
                self.host_combo.addItem(label, name)
            self.host_combo.blockSignals(False)
        self._fill_host_checks([h.name for h in self._saved])
        self._fill_login_hosts([h.name for h in self._saved])
        index = self.host_combo.findData(wanted)
        self.host_combo.setCurrentIndex(index if index >= 0 else 0)
        self.update_note()

    def _fill_host_checks(self, names: list[str]) -> None:
        """One check box per saved host, for "several hosts…" (checked: those checked last time)."""
        if list(self.host_checks) == names:
            return
        checked: list[str] = []
        with contextlib.suppress(Exception):
            checked = [str(n) for n in self.services.settings.get("training/multi_hosts") or []]
        for box in self.host_checks.values():
            self.hosts_row.removeWidget(box)
            box.deleteLater()
        self.host_checks = {}
        for name in names:
            box = QCheckBox(name, self.hosts_box)
            box.setChecked(name in checked)
            box.setToolTip("machine rank = position among the checked hosts; the first checked is the "
                           "main process")
            box.toggled.connect(lambda _on: self._on_host_checks_changed())
            self.hosts_row.insertWidget(self.hosts_row.count() - 1, box)  # before the stretch
            self.host_checks[name] = box

    def _on_host_checks_changed(self) -> None:
        with contextlib.suppress(ValueError, TypeError):
            self.services.settings.set("training/multi_hosts", [h.name for h in self.selected_hosts()])
        self.update_note()
        self.changed.emit()

    def _on_host_changed(self) -> None:
        name = str(self.host_combo.currentData() or remote_mod.LOCAL)
        with contextlib.suppress(ValueError, TypeError):
            self.services.settings.set("training/host", name)
        self.update_note()
        self.changed.emit()

    def _on_host_selection_changed(self, _ids: object) -> None:
        if not self.selected_host().is_local:
            self.update_note()
            self.changed.emit()

    # -- Slurm -------------------------------------------------------------------------------------

    def _make_slurm_box(self) -> None:
        """The fields of "Slurm cluster…" (two short rows), filled from the last ones used."""
        box = self.slurm_box = QWidget(self)
        grid = QGridLayout(box)
        grid.setContentsMargins(0, 0, 0, 0)
        self.slurm_nodes = QSpinBox(box)
        self.slurm_nodes.setRange(1, 4096)
        self.slurm_nodes.setToolTip("nodes (machines) for the job: one task per node runs accelerate's "
                                    "multi-node launch")
        self.slurm_cards = QSpinBox(box)
        self.slurm_cards.setRange(0, 64)
        self.slurm_cards.setSpecialValueText("the job's")
        self.slurm_cards.setToolTip("cards (processes) per node; \"the job's\": the form's processes")
        self.slurm_device = QComboBox(box)
        for kind in ("hpu", "cuda", "cpu"):
            self.slurm_device.addItem(kind, kind)
        self.slurm_device.setToolTip("the nodes' device (this machine's cards say nothing of theirs)")
        self.slurm_time = QLineEdit(box)
        self.slurm_time.setPlaceholderText("none")
        self.slurm_time.setToolTip("time limit: minutes, HH:MM:SS or D-HH:MM:SS; a checkpoint stop is "
                                   "asked for the stop grace period before it")
        self.slurm_partition = QLineEdit(box)
        self.slurm_partition.setPlaceholderText("default")
        self.slurm_partition.setToolTip("Slurm partition (empty: the cluster's default)")
        self.slurm_account = QLineEdit(box)
        self.slurm_account.setPlaceholderText("default")
        self.slurm_account.setToolTip("Slurm account to charge (empty: yours by default)")
        self.slurm_gres = QLineEdit(box)
        self.slurm_gres.setPlaceholderText("cuda: gpu:N")
        self.slurm_gres.setToolTip("generic resources per node as the cluster names them (gres.conf), "
                                   "e.g. gpu:8; Gaudi clusters choose their own name")
        self.slurm_login = QComboBox(box)
        self.slurm_login.setToolTip("where sbatch, squeue and scancel run: this machine, or a login host "
                                    "over SSH. The run folder must be on the file system it and the "
                                    "nodes share, at the same path")
        fields: list[tuple[str, QWidget]] = [
            ("Nodes", self.slurm_nodes), ("Cards/node", self.slurm_cards), ("Device", self.slurm_device),
            ("Time", self.slurm_time), ("Partition", self.slurm_partition), ("Account", self.slurm_account),
            ("Gres", self.slurm_gres), ("Login", self.slurm_login)]
        for i, (label, widget) in enumerate(fields):
            row, col = divmod(i, 4)
            grid.addWidget(QLabel(label, box), row, col * 2)
            grid.addWidget(widget, row, col * 2 + 1)
        saved: dict[str, Any] = {}
        with contextlib.suppress(Exception):
            saved = dict(self.services.settings.get("training/slurm") or {})
        self.slurm_nodes.setValue(int(saved.get("nodes") or 1))
        self.slurm_cards.setValue(int(saved.get("cards_per_node") or 0))
        device = str(saved.get("device") or self._device)
        self.slurm_device.setCurrentIndex(max(0, self.slurm_device.findData(device)))
        for edit, key in ((self.slurm_time, "time"), (self.slurm_partition, "partition"),
                          (self.slurm_account, "account"), (self.slurm_gres, "gres")):
            edit.setText(str(saved.get(key) or ""))
            edit.textChanged.connect(lambda _t: self._on_slurm_changed())
        self._slurm_login_wanted = str(saved.get("login") or remote_mod.LOCAL)
        for spin in (self.slurm_nodes, self.slurm_cards):
            spin.valueChanged.connect(lambda _v: self._on_slurm_changed())
        for combo in (self.slurm_device, self.slurm_login):
            combo.currentIndexChanged.connect(lambda _i: self._on_slurm_changed())
        box.setVisible(False)

    def _fill_login_hosts(self, names: list[str]) -> None:
        """The login host combo: this machine, then the saved hosts."""
        wanted = [remote_mod.LOCAL, *names]
        current = str(self.slurm_login.currentData() or self._slurm_login_wanted)
        if [self.slurm_login.itemData(i) for i in range(self.slurm_login.count())] != wanted:
            self.slurm_login.blockSignals(True)
            self.slurm_login.clear()
            for name in wanted:
                self.slurm_login.addItem("local (this machine)" if name == remote_mod.LOCAL else name, name)
            self.slurm_login.blockSignals(False)
        self.slurm_login.setCurrentIndex(max(0, self.slurm_login.findData(current)))

    def _on_slurm_changed(self) -> None:
        target = self.slurm_target()
        o = target.options
        with contextlib.suppress(ValueError, TypeError):
            self.services.settings.set("training/slurm", {
                "nodes": o.nodes, "partition": o.partition, "time": o.time, "account": o.account,
                "cards_per_node": o.cards_per_node, "gres": o.gres, "device": o.device,
                "login": target.login})
        if self.slurm_selected():
            self.update_note()
            self.changed.emit()

    # -- the note ----------------------------------------------------------------------------------

    def update_note(self) -> None:
        """Which boxes show, and the note under them: what this placement means for the job's paths,
        cards and processes."""
        host = self.selected_host()
        multi, slurm = self.multi_selected(), self.slurm_selected()
        self.hosts_box.setVisible(multi)
        self.slurm_box.setVisible(slurm)
        self.host_note.setVisible(multi or slurm or not host.is_local)
        if slurm:
            login = self.slurm_target().login
            where = "this machine" if login == remote_mod.LOCAL else f"{login} over SSH"
            self.host_note.setText(
                f"Submitted with sbatch on {where} and followed with squeue / sacct. The runs folder "
                f"({self._runs_root}) must be on the file system the nodes share, at the same path; the "
                f"model, dataset and output paths are the nodes'. \"processes\" is per node.")
        elif multi:
            hosts = self.selected_hosts()
            self.host_note.setText(
                f"One run on {len(hosts)} hosts (check two or more): accelerate's multi-node launch on "
                f"each, machine rank in the order above, the first the main process; \"processes\" is "
                f"per host. Paths and cards are each host's own." if len(hosts) >= 2 else
                "Check two or more hosts: machine rank in this order, the first is the main process.")
        elif not host.is_local:
            self.host_note.setText(f"Runs on {host.name}: the model, dataset and output paths are the "
                                   f"host's, and so are the cards (its gaudi-gui picks hpu > cuda > cpu): "
                                   f"{self.cards_phrase(host)} (its Devices panel in the Hosts tab).")

    def mark(self, error: str) -> None:
        """The Host field marked with ``error`` (the gate's refusal), or unmarked for ""."""
        self.host_combo.setStyleSheet("QComboBox { border: 1px solid #d62728; }" if error else "")
        self.host_combo.setToolTip(error or self.host_tip)
