"""The OpenCL devices the app found and the one it trains and chats on (part of gui.app_state.AppState)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.device import DeviceInfo


class DeviceChoice:
    """The listed devices (preferred first) and the chosen one.

    Args:
        listed: called with the new list when the devices are listed again.
        chosen: called with the new choice (a DeviceInfo, or None: there is no device).
        message: shows a line in the status bar.
    """

    def __init__(self, listed: Callable[[list], None], chosen: Callable[[object], None],
                 message: Callable[[str], None]) -> None:
        self._listed, self._chosen, self._message = listed, chosen, message
        self._devices: list[DeviceInfo] = []
        self._device: DeviceInfo | None = None

    def devices(self) -> list[DeviceInfo]:
        """Every OpenCL device the Device tab found (preferred first)."""
        return list(self._devices)

    def set_devices(self, devices: list[DeviceInfo]) -> None:
        """The devices were listed (again)."""
        self._devices = list(devices)
        self._listed(self.devices())

    def device_info(self) -> DeviceInfo | None:
        """The chosen device, or None when there is no OpenCL device."""
        return self._device

    def set_device(self, info: DeviceInfo | None) -> None:
        """Train and chat on ``info`` from now on (None: there is no device)."""
        if info == self._device and info is not None:
            return
        self._device = info
        self._chosen(info)

    def has_cpu_device(self) -> bool:
        """True when a CPU device is listed (the fallback when a GPU runs out of memory)."""
        return any(d.kind == "CPU" and not d.problem for d in self._devices)

    def switch_to_cpu(self) -> bool:
        """Choose the first CPU device; False when there is none."""
        cpu = next((d for d in self._devices if d.kind == "CPU" and not d.problem), None)
        if cpu is None:
            return False
        self.set_device(cpu)
        self._message(f"switched to {cpu.label}")
        return True
