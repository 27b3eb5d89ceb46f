"""Device tab: choose the OpenCL device, see its details, test it (build, check, benchmark)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtWidgets import (QComboBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel, QProgressBar,
                               QPushButton, QStackedWidget, QTableWidget, QTableWidgetItem, QVBoxLayout,
                               QWidget, QHeaderView)

from core.wording import memory_size
from gui.app_state import AppState
from gui.workers import DeviceTestWorker

if TYPE_CHECKING:
    from core.device import DeviceInfo
    from core.selftest import DeviceCheck

SETTINGS_KEY = "device/label"


class DeviceTab(QWidget):
    """Lists every OpenCL device (preferred first) or explains how to get one.

    Args:
        state: the app state; the tab publishes the device list and the chosen device there (through
            :attr:`device_changed`, which the main window connects) and follows a device chosen
            elsewhere (the Training tab's "switch to the CPU").
    """

    device_changed = Signal(object)  # (the chosen core.device.DeviceInfo, or None)

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.app_state = state
        self.devices = []
        self._worker: DeviceTestWorker | None = None
        self._active = False

        self.stack = QStackedWidget()
        self.stack.addWidget(self._build_missing())
        self.stack.addWidget(self._build_devices())
        lay = QVBoxLayout(self)
        lay.addWidget(self.stack)
        state.device_changed.connect(self._show_device)

    def _build_missing(self) -> QWidget:
        """Page 0: no OpenCL device, why, and a retry button."""
        self.missing = QWidget()
        m = QVBoxLayout(self.missing)
        title = QLabel("<h2>No OpenCL device found</h2>")
        self.missing_text = QLabel()
        self.missing_text.setWordWrap(True)
        self.missing_text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.retry_button = QPushButton("Look for devices again")
        self.retry_button.clicked.connect(self.refresh)
        m.addWidget(title)
        m.addWidget(self.missing_text)
        m.addWidget(self.retry_button)
        m.addStretch(1)
        return self.missing

    def _build_devices(self) -> QWidget:
        """Page 1: the device list, its details and the test."""
        page = QWidget()
        v = QVBoxLayout(page)
        row = QHBoxLayout()
        row.addWidget(QLabel("Device:"))
        self.combo = QComboBox()
        self.combo.setMinimumContentsLength(40)
        self.combo.currentIndexChanged.connect(self._on_selected)
        row.addWidget(self.combo, 1)
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.clicked.connect(self.refresh)
        row.addWidget(self.refresh_button)
        v.addLayout(row)

        box = QGroupBox("Details")
        self.details = QFormLayout(box)
        self.detail_labels = {}
        for key in ("Name", "Kind", "Platform", "Vendor", "OpenCL", "Compute units", "Global memory",
                    "Local memory", "Max work-group size", "Speed"):
            lab = QLabel("-")
            lab.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.detail_labels[key] = lab
            self.details.addRow(key + ":", lab)
        v.addWidget(box)
        v.addWidget(self._build_test(), 1)
        return page

    def _build_test(self) -> QGroupBox:
        """The "Test device" button, its progress and the results table."""
        test_box = QGroupBox("Test")
        t = QVBoxLayout(test_box)
        trow = QHBoxLayout()
        self.test_button = QPushButton("Test device")
        self.test_button.setToolTip("Build every kernel, compare a few results with numpy, measure matmul speed")
        self.test_button.clicked.connect(self.start_test)
        trow.addWidget(self.test_button)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setValue(0)
        trow.addWidget(self.progress, 1)
        t.addLayout(trow)
        self.test_status = QLabel("Not tested yet.")
        self.test_status.setWordWrap(True)
        t.addWidget(self.test_status)
        self.results = QTableWidget(0, 3)
        self.results.setHorizontalHeaderLabels(["Check", "Result", "Details"])
        self.results.horizontalHeader().setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.results.verticalHeader().setVisible(False)
        self.results.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        t.addWidget(self.results, 1)
        return test_box

    # ----------------------------------------------------------------------------- devices
    def refresh(self) -> None:
        """List devices again; select the remembered one, else the preferred one."""
        from core.device import OpenCLUnavailableError, list_devices

        try:
            self.devices = list_devices()
        except OpenCLUnavailableError as e:
            self.devices = []
            self.app_state.set_devices([])
            self.missing_text.setText(str(e))
            self.stack.setCurrentIndex(0)
            self.device_changed.emit(None)
            return
        if all(d.problem for d in self.devices):  # listed, but none can build a kernel: say why, as with none
            from core.device import no_usable_device_message

            self.missing_text.setText(no_usable_device_message(self.devices))
            self.devices = []
            self.app_state.set_devices([])
            self.stack.setCurrentIndex(0)
            self.device_changed.emit(None)
            return
        self.app_state.set_devices(self.devices)
        remembered = QSettings().value(SETTINGS_KEY, "", type=str)
        self.combo.blockSignals(True)
        self.combo.clear()
        for i, d in enumerate(self.devices):
            self.combo.addItem(d.label + (" — cannot build kernels here" if d.problem else ""))
            if d.problem:  # listed with the reason, never chosen (list_devices puts these last)
                self.combo.setItemData(i, d.problem, Qt.ItemDataRole.ToolTipRole)
                self.combo.model().item(i).setEnabled(False)
        idx = next((i for i, d in enumerate(self.devices) if d.label == remembered and not d.problem), 0)
        self.combo.setCurrentIndex(idx)
        self.combo.blockSignals(False)
        self.stack.setCurrentIndex(1)
        self._on_selected(idx)

    def current(self) -> DeviceInfo | None:
        """The selected DeviceInfo, or None when there is no OpenCL device."""
        i = self.combo.currentIndex()
        return self.devices[i] if self.devices and 0 <= i < len(self.devices) else None

    def _show_device(self, info) -> None:
        """The state's device changed (maybe here, maybe elsewhere): show it in the list."""
        i = next((i for i, d in enumerate(self.devices) if d == info), -1)
        if i >= 0 and i != self.combo.currentIndex():
            self.combo.setCurrentIndex(i)

    def _on_selected(self, index: int) -> None:
        from core.device import speed_note

        d = self.current()
        if d is None:
            return
        QSettings().setValue(SETTINGS_KEY, d.label)
        kind = d.kind if d.kind != "GPU" else ("integrated GPU" if d.integrated else "discrete GPU")
        values = {"Name": d.name.strip(), "Kind": kind, "Platform": d.platform.strip(), "Vendor": d.vendor.strip(),
                  "OpenCL": d.opencl_version.strip(), "Compute units": str(d.compute_units),
                  "Global memory": memory_size(d.global_mem_bytes), "Local memory": f"{d.local_mem_bytes // 1024} KiB",
                  "Max work-group size": str(d.max_work_group_size),
                  "Speed": speed_note(d, self.devices) or "-"}
        for k, val in values.items():
            self.detail_labels[k].setText(val)
        self.test_status.setText(f"This device cannot be used (refused): {d.problem}" if d.problem
                                 else "Not tested yet.")
        self.test_button.setEnabled(not d.problem)
        self.results.setRowCount(0)
        self.progress.setValue(0)
        self.device_changed.emit(d)

    # ----------------------------------------------------------------------------- test
    def is_testing(self) -> bool:
        """True from the start until the worker's last signal has been handled."""
        return self._active

    def start_test(self) -> None:
        d = self.current()
        if d is None or self.is_testing():
            return
        self.results.setRowCount(0)
        self.test_button.setEnabled(False)
        self.combo.setEnabled(False)
        self.test_status.setText("Building kernels (the first time on a device this can take a minute)…")
        w = DeviceTestWorker(d).connect_slots(progress=self._on_progress, result=self._on_result,
                                              failed=self._on_failed, finished=self._on_finished)
        self._worker = w
        self._active = True
        w.start()

    def stop(self) -> None:
        if self._worker is not None:
            self._worker.request_stop()
            self._worker.wait()

    def _on_progress(self, fraction: float, message: str) -> None:
        self.progress.setValue(int(round(fraction * 100)))
        self.test_status.setText(message[:1].upper() + message[1:] + "…")

    def _add_row(self, check: str, ok: bool | None, details: str) -> None:
        r = self.results.rowCount()
        self.results.insertRow(r)
        self.results.setItem(r, 0, QTableWidgetItem(check))
        self.results.setItem(r, 1, QTableWidgetItem("—" if ok is None else ("pass" if ok else "FAIL")))
        self.results.setItem(r, 2, QTableWidgetItem(details))

    def _on_result(self, res: DeviceCheck) -> None:
        self.results.setRowCount(0)
        self._add_row("kernel build", not res.build_errors,
                      f"{res.build_s:.1f} s" + "".join(f"; {k}: {v.splitlines()[0]}"
                                                      for k, v in res.build_errors.items()))
        for c in res.checks:
            detail = c.error or f"max |error| {c.max_abs_err:.2e} (tolerance {c.tolerance:.0e})"
            self._add_row(c.name, c.ok, detail)
        g = res.matmul_gflops
        self._add_row("matmul speed", None, "unavailable" if g is None else f"{g:.1f} GFLOP/s (float32)")
        self.results.resizeColumnsToContents()
        self.results.horizontalHeader().setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        speed = "" if g is None else f", {g:.1f} GFLOP/s"
        self.test_status.setText(("The device works" if res.ok else "The device has problems (see below)") + speed)
        self.progress.setValue(100)

    def _on_failed(self, kind: str, message: str) -> None:
        self.test_status.setText(f"Test failed: {message}")

    def _on_finished(self) -> None:
        self._active = False
        self.test_button.setEnabled(True)
        self.combo.setEnabled(True)
