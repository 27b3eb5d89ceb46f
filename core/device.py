"""OpenCL device layer: list devices, pick one, build programs once, move buffers.

Four small jobs, after tinygrad's runtime: *compile* (source -> program, with the build log in the
error), *program cache* (one build per context and option set), *buffers* (alloc / upload /
download), *device* (platform, context, queue and the limits kernels size themselves from).

Nothing here imports Qt; the GUI and the CLI call :func:`list_devices` and :func:`open_device`.
"""
from __future__ import annotations

import contextlib
import ctypes.util
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:  # pyopencl is imported when a device is opened (a clear error without a driver)
    import pyopencl as cl

log = logging.getLogger(__name__)

APP_NAME = "opencl-llm-studio"


class OpenCLUnavailableError(RuntimeError):
    """No OpenCL platform or device could be found (no driver, no PoCL)."""


class KernelBuildError(RuntimeError):
    """An OpenCL program failed to build; the message carries the compiler's build log."""


class KernelLimitError(ValueError):
    """A kernel configuration does not fit the compiled kernel's (or the device's) limits; the message
    says which limit and by how much. The matmul tuner skips such configurations."""


@dataclass(frozen=True)
class KernelLimits:
    """What one compiled kernel allows on one device (OpenCL's clGetKernelWorkGroupInfo).

    Attributes:
        name: the kernel's function name.
        max_items: CL_KERNEL_WORK_GROUP_SIZE (capped at the device's maximum): most work-items per group.
        local_mem_bytes: CL_KERNEL_LOCAL_MEM_SIZE, local memory the kernel uses (its __local arrays).
        device_local_mem_bytes: CL_DEVICE_LOCAL_MEM_SIZE.
        preferred_multiple: CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE (the SIMD width of a group).
    """

    name: str
    max_items: int
    local_mem_bytes: int
    device_local_mem_bytes: int
    preferred_multiple: int = 1

    def problem(self, items: int) -> str:
        """Why ``items`` work-items per group do not fit, or "" when they do."""
        if items > self.max_items:
            return f"needs {items} work-items per group; the compiled kernel {self.name} allows {self.max_items}"
        if self.local_mem_bytes > self.device_local_mem_bytes:
            return (f"the compiled kernel {self.name} needs {self.local_mem_bytes} bytes of local memory; "
                    f"the device has {self.device_local_mem_bytes}")
        return ""


# ----------------------------------------------------------------------------- paths

def _writable_dir(candidate: Path) -> Path | None:
    try:
        candidate.mkdir(parents=True, exist_ok=True)
        probe = candidate / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
        return candidate
    except OSError:
        return None


def user_cache_dir() -> Path:
    """Per-user writable cache folder for compiled kernels.

    Uses platformdirs' user cache dir; falls back to a folder in the system temp dir when HOME is
    unset or the default location is read-only.

    Returns:
        An existing, writable directory.
    """
    candidates = []
    if os.environ.get("OPENCL_LLM_CACHE_DIR"):
        candidates.append(Path(os.environ["OPENCL_LLM_CACHE_DIR"]))
    try:
        import platformdirs

        candidates.append(Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False)))
    except Exception:  # HOME unset and no passwd entry: platformdirs raises KeyError/RuntimeError
        pass
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    candidates.append(Path(tempfile.gettempdir()) / f"{APP_NAME}-cache-{uid}")
    for c in candidates:
        ok = _writable_dir(c)
        if ok is not None:
            return ok
    raise OSError(f"no writable cache directory among: {', '.join(map(str, candidates))}")


def _prepare_environment() -> None:
    """Point PoCL's and pytools' caches at writable folders before any context exists.

    PoCL caches compiled kernels in POCL_CACHE_DIR (default ~/.cache/pocl); pytools, which
    pyopencl uses, writes under XDG_CACHE_HOME (default ~/.cache). When HOME is unset or not
    writable, both are pointed below :func:`user_cache_dir`'s fallback.
    """
    try:
        cache = user_cache_dir()
    except OSError:
        return
    os.environ.setdefault("POCL_CACHE_DIR", str(cache / "pocl"))
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if xdg.startswith("~") or _writable_dir(Path(xdg)) is None:
        os.environ["XDG_CACHE_HOME"] = str(cache / "xdg")
    # pyopencl prints build logs of successful builds as warnings; we show logs only on failure.
    os.environ.setdefault("PYOPENCL_COMPILER_OUTPUT", "0")


# ----------------------------------------------------------------------------- listing

@dataclass(frozen=True)
class DeviceInfo:
    """One OpenCL device as the user sees it.

    Attributes:
        index: position in :func:`list_devices` order (preferred devices first).
        platform: platform name, e.g. "Portable Computing Language".
        name, vendor: as reported by the driver.
        kind: "GPU", "CPU", "ACCELERATOR" or "OTHER".
        integrated: True when the device shares host memory (CL_DEVICE_HOST_UNIFIED_MEMORY), i.e.
            an integrated GPU (or a CPU).
        compute_units: CL_DEVICE_MAX_COMPUTE_UNITS.
        global_mem_bytes, local_mem_bytes: memory sizes in bytes.
        max_work_group_size: CL_DEVICE_MAX_WORK_GROUP_SIZE.
        opencl_version: CL_DEVICE_VERSION string.
        max_alloc_bytes: CL_DEVICE_MAX_MEM_ALLOC_SIZE, the largest single buffer (None: not known).
    """

    index: int
    platform: str
    name: str
    vendor: str
    kind: str
    integrated: bool
    compute_units: int
    global_mem_bytes: int
    local_mem_bytes: int
    max_work_group_size: int
    opencl_version: str
    platform_index: int
    device_index: int
    problem: str = ""
    """Why this device cannot be used (its compiler failed on a trivial kernel), else empty."""
    max_alloc_bytes: int | None = None
    gflops: float | None = None
    """Measured plain-matmul speed (:func:`device_speed`), only where several CPU devices compete."""

    @property
    def label(self) -> str:
        """Short human label, e.g. ``"Intel(R) UHD Graphics (integrated GPU)"``."""
        if self.kind == "GPU":
            what = "integrated GPU" if self.integrated else "GPU"
        else:
            what = self.kind.lower()
        return f"{self.name.strip()} ({what}, {self.platform.strip()})"

    def rank(self) -> int:
        """Preference order: integrated GPU (0), other GPU (1), CPU (2), anything else (3); a device
        with a :attr:`problem` after all of them (4)."""
        if self.problem:
            return 4
        if self.kind == "GPU":
            return 0 if self.integrated else 1
        return 2 if self.kind == "CPU" else 3


def _loader_name() -> str:
    found = ctypes.util.find_library("OpenCL")
    try:
        import pyopencl

        pkg = Path(pyopencl.__file__).parent
        bundled = sorted(str(p) for p in [*pkg.glob(".libs/libOpenCL*"), *pkg.parent.glob("pyopencl.libs/libOpenCL*")])
        if bundled:
            return bundled[0]
    except Exception:
        pass
    return found or "libOpenCL (not found on the library path)"


def _no_opencl_message(cause: str) -> str:
    return (
        f"No OpenCL device found ({cause}).\n"
        f"OpenCL loader used: {_loader_name()}\n"
        "To get one: install your GPU vendor's OpenCL driver (Intel: intel-opencl-icd / "
        "'Intel Graphics Compute Runtime'; AMD: ROCm or the Adrenalin driver; NVIDIA: the "
        "proprietary driver), or the CPU driver PoCL with `pip install pyopencl[pocl]` "
        "(Linux) or your package manager (`apt install pocl-opencl-icd`)."
    )


POCL_HINT = ("the PoCL that pip installs (LLVM 14) does not know CPUs newer than it, e.g. AMD Zen 5: install "
             "the system's PoCL (`sudo apt install pocl-opencl-icd`, `sudo dnf install pocl`) and start again")
"""The fix for pip's PoCL failing on a new CPU, said when no device can build kernels."""


def no_usable_device_message(devices: list[DeviceInfo]) -> str:
    """What to say when every device listed has a :attr:`DeviceInfo.problem`: each device with its
    reason, and for PoCL how to get one that works."""
    pocl = any("portable computing language" in d.platform.lower() for d in devices)
    return ("No usable OpenCL device: every device found fails to build kernels on this machine.\n"
            + "\n".join(f"  {d.label}: {d.problem}" for d in devices) + (f"\nTo fix: {POCL_HINT}." if pocl else ""))


_KIND_NAMES = {2: "CPU", 4: "GPU", 8: "ACCELERATOR"}

# C (N,N) = A @ B, one output per work-item: the device's speed at a plain float32 matmul, measured when
# several CPU devices (PoCL, Mesa's llvmpipe) compete for the default
_SPEED_SOURCE = """
__kernel void speed(__global const float* a, __global const float* b, __global float* c, const int n) {
    const int i = get_global_id(1), j = get_global_id(0);
    float s = 0.0f;
    for (int k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j];
    c[i * n + j] = s;
}
"""
SPEED_N = 256
SPEED_FILE = "device-speed-cpu.json"
_speed_results: dict[tuple[str, str, str, str], float | None] = {}

_PROBE_SOURCE = "__kernel void probe(__global float* x) { x[get_global_id(0)] *= 2.0f; }"
_probe_results: dict[tuple[str, str, str, str], str] = {}


_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def host_memory_bytes() -> int | None:
    """The host's physical memory in bytes (a cgroup memory limit below it wins), or None where the OS
    does not say (no ``os.sysconf``, e.g. Windows)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    if total <= 0:
        return None
    for path in _CGROUP_LIMITS:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return total


def global_memory_bytes(cl_device: cl.Device) -> int:
    """The device's global memory in bytes: the one figure the Device tab, ``opencl-llm devices`` and
    ``train`` show and the memory rule (core.model.memory_problem) checks against.

    CL_DEVICE_GLOBAL_MEM_SIZE, except for a CPU device, whose global memory is the host's RAM
    (:func:`host_memory_bytes`): PoCL reports hwloc's NUMA-node figure less 2 GiB, which on some VMs
    changes from process to process with the memory in use (7.5, 12.5 and 20.7 GiB seen in three
    programs on one machine), and enforces only the per-buffer limit (CL_DEVICE_MAX_MEM_ALLOC_SIZE,
    :attr:`DeviceInfo.max_alloc_bytes`), not that total.
    """
    import pyopencl as cl

    reported = int(cl_device.global_mem_size)
    if int(cl_device.type) & cl.device_type.CPU:
        host = host_memory_bytes()
        if host is not None:
            return host
    return reported


def _probe(cl_device: cl.Device) -> str:
    """Build a one-line kernel on ``cl_device``; "" when it builds, else a one-line reason.

    Some drivers list a device whose compiler cannot build anything on this machine: pip's PoCL
    (LLVM 14) does not know CPUs newer than it (e.g. AMD Zen 5) and fails every build with
    "unknown target CPU 'generic'". Such a device is listed last with the reason, never chosen by
    default. The result is kept per process (driver and device name as the key).
    """
    import pyopencl as cl

    key = _device_key(cl_device)
    if key in _probe_results:
        return _probe_results[key]
    try:
        ctx = cl.Context([cl_device])
        cl.Program(ctx, _PROBE_SOURCE).build()
        problem = ""
    except Exception as e:  # cl.Error (BUILD_PROGRAM_FAILURE, a driver crash code), RuntimeError
        log_lines = [ln.strip() for ln in str(e).splitlines() if "error" in ln.lower() and ln.strip()]
        detail = next((ln for ln in log_lines if "clBuildProgram failed" not in ln), "")
        problem = f"its OpenCL compiler cannot build kernels on this machine ({detail or type(e).__name__})"
    _probe_results[key] = problem
    return problem


def _device_key(cl_device: cl.Device) -> tuple[str, str, str, str]:
    return (cl_device.platform.name, cl_device.platform.version, cl_device.name, cl_device.driver_version)


def _measure_speed(cl_device: cl.Device) -> float | None:
    """GFLOP per CPU second of ``_SPEED_SOURCE`` at SPEED_N (best of 5 after a warm-up), or None when it
    fails. CPU time, not wall time: CPU devices share the host's cores, and on a loaded machine a driver
    with more threads (llvmpipe runs 8 on 2 cores) takes a larger share of them, which wall time would
    count as speed."""
    import pyopencl as cl

    try:
        ctx = cl.Context([cl_device])
        queue = cl.CommandQueue(ctx)
        knl = cl.Program(ctx, _SPEED_SOURCE).build().speed
        n = SPEED_N
        host = np.random.default_rng(0).standard_normal((2, n, n)).astype(np.float32)
        mf = cl.mem_flags
        a, b = (cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x) for x in host)
        c = cl.Buffer(ctx, mf.WRITE_ONLY, host[0].nbytes)
        allowed = int(knl.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, cl_device))
        side = next(s for s in (16, 8, 4, 2, 1) if s * s <= allowed)  # the compiled kernel's limit
        best = float("inf")
        for i in range(6):  # CPU seconds of this process (every driver thread): the same on a busy machine
            t0 = time.process_time()
            knl(queue, (n, n), (side, side), a, b, c, np.int32(n))
            queue.finish()
            best = min(best, time.process_time() - t0) if i else best
        out = np.empty((n, n), np.float32)
        cl.enqueue_copy(queue, out, c)
        if not np.allclose(out, host[0].astype(np.float64) @ host[1], atol=1e-3 * np.sqrt(n)):
            return None
        return 2.0 * n ** 3 / max(best, 1e-6) / 1e9
    except Exception as e:  # a driver that fails here is ranked by kind alone
        log.info("could not time %s: %s", cl_device.name, e)
        return None


def device_speed(cl_device: cl.Device) -> float | None:
    """This device's measured plain-matmul GFLOP per CPU second (:func:`_measure_speed`), cached per platform, device
    and driver in the user cache folder (``SPEED_FILE``) and per process; None when it cannot run it."""
    key = _device_key(cl_device)
    if key in _speed_results:
        return _speed_results[key]
    import json

    from core.atomic import atomic_write

    path, text = user_cache_dir() / SPEED_FILE, " | ".join(key)
    try:
        data = json.loads(path.read_text("utf-8"))
        data = data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        data = {}
    value = data.get(text)
    if not isinstance(value, (int, float)) or value <= 0:
        value = _measure_speed(cl_device)
        if value is not None:
            data[text] = round(value, 3)
            try:
                atomic_write(path, json.dumps(data, indent=1, sort_keys=True), sync_folder=False)
            except OSError as e:
                log.warning("could not save the device speed to %s: %s", path, e)
    _speed_results[key] = value
    return value


def _rank_by_speed(devices: list[DeviceInfo], cl_devices: list) -> list[DeviceInfo]:
    """``devices`` in preference order; where two or more usable CPU devices are listed, each gets its
    measured speed (:func:`device_speed`) and the faster comes first among the CPUs."""
    cpus = [i for i, d in enumerate(devices) if d.kind == "CPU" and not d.problem]
    if len(cpus) > 1:
        for i in cpus:
            devices[i] = DeviceInfo(**{**devices[i].__dict__, "gflops": device_speed(cl_devices[i])})
    return sorted(devices, key=lambda i: (i.rank(), -(i.gflops or 0.0) if i.kind == "CPU" else 0.0))


def speed_note(info: DeviceInfo, devices: list[DeviceInfo]) -> str:
    """Why ``info`` is (not) the default among ``devices`` by speed, for the Device tab and ``devices``:
    "" when no speed was measured (a single CPU device)."""
    if info.gflops is None:
        return ""
    rivals = [d for d in devices if d.kind == "CPU" and d.gflops and d is not info and not d.problem]
    faster = [d for d in rivals if d.gflops > info.gflops]
    if not faster:
        return f"{info.gflops:.1f} GFLOP per CPU second at a plain matmul: the fastest CPU device here"
    best = max(faster, key=lambda d: d.gflops)
    if best.gflops < 1.05 * info.gflops:
        return f"{info.gflops:.1f} GFLOP per CPU second at a plain matmul: as fast as {best.label}"
    return (f"{info.gflops:.1f} GFLOP per CPU second at a plain matmul: {best.gflops / info.gflops:.1f}x slower "
            f"than {best.label} ({best.gflops:.1f})")


def list_devices() -> list[DeviceInfo]:
    """Every OpenCL device on every platform, preferred first.

    Order: integrated GPUs, then other GPUs, then CPUs (the fastest first where there are several,
    e.g. PoCL and Mesa's llvmpipe: measured once and cached, :func:`device_speed`), then others; stable
    within a group. Each
    device builds a one-line kernel first (:func:`_probe`, once per process); one that cannot gets
    :attr:`DeviceInfo.problem` and goes last.

    Returns:
        A non-empty list of :class:`DeviceInfo`.

    Raises:
        OpenCLUnavailableError: no platform or no device; the message names the OpenCL loader used
            and how to install a driver or PoCL.
    """
    _prepare_environment()
    try:
        import pyopencl as cl
    except ImportError as e:  # pragma: no cover - dependency missing
        raise OpenCLUnavailableError(_no_opencl_message(f"pyopencl not importable: {e}")) from e
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:  # PLATFORM_NOT_FOUND_KHR when the ICD loader finds no vendor file
        raise OpenCLUnavailableError(_no_opencl_message(f"no OpenCL platform: {e}")) from None
    raw, cl_devices = [], []
    for pi, p in enumerate(platforms):
        try:
            devs = p.get_devices()
        except cl.Error:
            continue
        for di, d in enumerate(devs):
            kind = next((n for bit, n in _KIND_NAMES.items() if d.type & bit), "OTHER")
            try:
                unified = bool(d.host_unified_memory)
            except cl.Error:
                unified = kind == "CPU"
            raw.append(
                DeviceInfo(
                    index=-1, platform=p.name, name=d.name, vendor=d.vendor, kind=kind,
                    integrated=unified, compute_units=int(d.max_compute_units),
                    global_mem_bytes=global_memory_bytes(d), local_mem_bytes=int(d.local_mem_size),
                    max_work_group_size=int(d.max_work_group_size), opencl_version=d.version,
                    platform_index=pi, device_index=di, problem=_probe(d),
                    max_alloc_bytes=int(d.max_mem_alloc_size),
                )
            )
            cl_devices.append(d)
    if not raw:
        raise OpenCLUnavailableError(_no_opencl_message("platforms found but no devices"))
    ordered = _rank_by_speed(raw, cl_devices)
    return [DeviceInfo(**{**i.__dict__, "index": n}) for n, i in enumerate(ordered)]


def select_device(spec: int | str | None = None) -> DeviceInfo:
    """Pick a device by index in :func:`list_devices` order, by (part of) its name, or the default.

    Args:
        spec: None for the default (first in preference order), an int index, a string of digits,
            or a case-insensitive substring of the device name, platform, vendor or version string
            (so "PoCL", "NVIDIA" or "Intel" work).

    Raises:
        OpenCLUnavailableError: no device at all, or (for the default) none that can build kernels.
        ValueError: the index is out of range or no device name matches; lists what exists.
    """
    devices = list_devices()
    if spec is None or spec == "":
        if devices[0].problem:
            raise OpenCLUnavailableError(no_usable_device_message(devices))
        return devices[0]
    if isinstance(spec, int) or (isinstance(spec, str) and spec.strip().lstrip("-").isdigit()):
        i = int(spec)
        if not 0 <= i < len(devices):
            raise ValueError(f"device index {i} out of range 0..{len(devices) - 1}; devices:\n" + _listing(devices))
        return devices[i]
    needle = str(spec).lower()
    for d in devices:
        if any(needle in s.lower() for s in (d.name, d.platform, d.label, d.vendor, d.opencl_version)):
            return d
    raise ValueError(f"no OpenCL device matches {spec!r}; devices:\n" + _listing(devices))


def _listing(devices: list[DeviceInfo]) -> str:
    return "\n".join(f"  {d.index}: {d.label}" + (" (unusable: cannot build kernels here)" if d.problem else "")
                     for d in devices)


# ----------------------------------------------------------------------------- device

# OpenCL C scalar type names -> numpy types, for Device._declare_scalar_types
_SCALAR_TYPES = {"int": np.int32, "uint": np.uint32, "float": np.float32, "long": np.int64, "ulong": np.uint64,
                 "short": np.int16, "ushort": np.uint16, "char": np.int8, "uchar": np.uint8}

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([\w.]+)"[ \t]*$', re.MULTILINE)


def kernel_source(name: str) -> str:
    """The OpenCL C source of ``core/kernels/<name>.cl`` with its ``#include "x.h"`` lines replaced
    by those headers (from the same package folder).

    Inlining here rather than passing ``-I`` keeps the build independent of where the package
    lives (wheel, zip, PyInstaller bundle) and keys pyopencl's binary cache on the full text.

    Raises:
        FileNotFoundError: the kernel file or an included header is missing.
    """
    folder = resources.files("core.kernels")
    src = folder.joinpath(f"{name}.cl").read_text("utf-8")
    return _INCLUDE.sub(lambda m: folder.joinpath(m.group(1)).read_text("utf-8"), src)


class Device:
    """An OpenCL context and in-order queue on one device, with a per-context program cache.

    Programs are built once per (file, build options) and shared by all users of this Device.
    Kernel objects are *not* shared: each launcher fetches its own with :meth:`kernel`, so that a
    training thread and a chat thread never call the same ``cl.Kernel`` object at once.
    """

    def __init__(self, info: DeviceInfo):
        import pyopencl as cl

        # pyopencl warns of every successful build's non-empty log even with PYOPENCL_COMPILER_OUTPUT=0 ("Non-empty
        # compiler output encountered", two lines on stderr: PoCL's float16 ABI note on every AVX2-only CPU), which
        # buried the CLI's one-line errors; build logs are shown on failure only (KernelBuildError)
        warnings.filterwarnings("ignore", category=cl.CompilerWarning)
        self.cl = cl
        self.info = info
        if "portable computing language" in info.platform.lower() and shutil.which("ld") is None:
            # PoCL links every kernel with the system linker and aborts the process without it
            raise OpenCLUnavailableError(
                f"{info.label} needs the system linker `ld` to build kernels, and none is on PATH: "
                "install binutils (e.g. `apt install binutils`), or choose another device")
        platform = cl.get_platforms()[info.platform_index]
        self.cl_device = platform.get_devices()[info.device_index]
        self.context = cl.Context([self.cl_device])
        self.queue = cl.CommandQueue(self.context)
        self.cache_dir = str(user_cache_dir() / "pyopencl")
        self.max_work_group_size = int(self.cl_device.max_work_group_size)
        self.local_mem_size = int(self.cl_device.local_mem_size)
        self.global_mem_size = global_memory_bytes(self.cl_device)
        self.max_alloc_bytes = int(self.cl_device.max_mem_alloc_size)  # largest single buffer
        # sub-buffer origins must be multiples of this (CL_DEVICE_MEM_BASE_ADDR_ALIGN is in bits)
        self.base_align_bytes = max(4, int(self.cl_device.mem_base_addr_align) // 8)
        # CPU devices build with -DCPU_DEVICE: inline_math.h then replaces builtins that PoCL calls
        # as functions with inline arithmetic
        self.is_cpu = bool(int(self.cl_device.type) & cl.device_type.CPU)
        self._programs: dict[tuple[str, tuple[str, ...]], object] = {}
        self._lock = threading.Lock()
        # bytes of every buffer alloc/zeros/upload created (never decremented: a running total
        # that benchmarks and memory tests difference around the code they measure)
        self.allocated_bytes = 0
        self.profiling = False
        self._recording = threading.local()  # .launches: this thread's launches while recording()
        self._events: list[tuple[str, object]] = []
        # programs built (or loaded from pyopencl's binary cache) and the seconds that took, since opening:
        # the first run's compile time, which core.plan's estimate counts
        self.builds = 0
        self.build_seconds = 0.0

    # -- profiling ------------------------------------------------------------------------
    def start_profiling(self) -> None:
        """Record the device time of every kernel launch from now on (for benchmarks/compare.py).

        Finishes the queue and replaces it with one created with CL_QUEUE_PROFILING_ENABLE.
        Only kernels fetched with :meth:`kernel` *after* this call are recorded (create the
        launchers, e.g. a ``Model``, afterwards); kernels fetched before keep working unrecorded.
        Off by default, and then :meth:`kernel` returns plain ``cl.Kernel`` objects: no overhead.
        """
        self.queue.finish()
        self.queue = self.cl.CommandQueue(
            self.context, properties=self.cl.command_queue_properties.PROFILING_ENABLE)
        self._events = []
        self.profiling = True

    def stop_profiling(self) -> list[tuple[str, float]]:
        """Stop recording; return ``[(kernel name, device seconds)]`` of every recorded launch, in
        launch order (from the events' CL_PROFILING_COMMAND_START/END). The queue becomes a plain
        one again."""
        self.queue.finish()
        out = [(name, (evt.profile.end - evt.profile.start) * 1e-9) for name, evt in self._events]
        self._events = []
        self.profiling = False
        self.queue = self.cl.CommandQueue(self.context)
        return out

    # -- programs -------------------------------------------------------------------------
    def program(self, name: str, options: tuple[str, ...] = ()) -> cl.Program:
        """The built program ``core/kernels/<name>.cl`` for this context, built on first use.

        Args:
            name: file stem, e.g. ``"rmsnorm"``.
            options: build options such as ``("-D", "TILE=16")``.

        Raises:
            KernelBuildError: the build failed; the message holds the device name and build log.
        """
        key = (name, tuple(options))
        with self._lock:
            prg = self._programs.get(key)
            if prg is None:
                prg = self.build_source(f"{name}.cl", kernel_source(name), options)
                self._programs[key] = prg
        return prg

    def build_source(self, label: str, source: str, options: tuple[str, ...] = ()) -> cl.Program:
        """Build OpenCL C ``source`` for this device (uncached by this object).

        Args:
            label: name for messages, e.g. the file name.
            source: OpenCL C source.
            options: build options.

        Raises:
            KernelBuildError: the message names ``label`` and the device and holds the build log.
        """
        # -w: no warnings in the build log (PoCL's clang printed "1 warning generated." to stderr for its float16 ABI
        # note on AVX2-only CPUs, before any output of the app or the CLI); errors are still in the log
        opts = ["-cl-std=CL1.2", "-cl-kernel-arg-info", "-w", *(("-DCPU_DEVICE",) if self.is_cpu else ()), *options]
        t0 = time.perf_counter()
        try:
            prg = self.cl.Program(self.context, source).build(options=opts, cache_dir=self.cache_dir)
        except self.cl.RuntimeError as e:
            raise KernelBuildError(f"building {label} for {self.info.name} failed:\n{e}") from None
        finally:
            self.builds += 1
            self.build_seconds += time.perf_counter() - t0
        log.debug("built %s %s for %s", label, " ".join(options), self.info.name)
        return prg

    def kernel(self, program: str, kernel_name: str, options: tuple[str, ...] = ()) -> cl.Kernel:
        """A new ``cl.Kernel`` object for ``kernel_name`` in ``core/kernels/<program>.cl``.

        Call once per launcher and keep the result; never fetch a kernel per launch. While
        profiling (:meth:`start_profiling`) the kernel comes wrapped so that each launch records
        ``(kernel_name, event)``.
        """
        try:
            knl = self.cl.Kernel(self.program(program, options), kernel_name)
        except self.cl.LogicError as e:
            # PoCL's kernel cache keeps a program whose first kernel compile crashed its compiler (seen with pip's
            # PoCL on an AMD Zen 4): every later process then loads it without kernels, INVALID_KERNEL_NAME for all
            # of them, until that cache entry is deleted. Build it once more under another cache key.
            if "INVALID_KERNEL_NAME" not in str(e) or not re.search(rf"\b{re.escape(kernel_name)}\s*\(",
                                                                    kernel_source(program)):
                raise
            log.warning("%s.cl from the driver's kernel cache has no kernel %s: building it again", program, kernel_name)
            knl = self.cl.Kernel(self.program(program, (*options, "-DOPENCL_LLM_REBUILT")), kernel_name)
        self._declare_scalar_types(knl)
        return _ProfiledKernel(self, knl, kernel_name) if self.profiling else knl

    def _declare_scalar_types(self, knl) -> None:
        """Tell pyopencl the kernel's scalar argument types (from the kernel argument info), so
        that each launch packs them directly instead of probing every argument's type: about 20 us
        less per launch on PoCL. Kernels whose argument info the driver cannot give keep the generic
        path (np.int32 / np.float32 arguments work either way)."""
        cl = self.cl
        try:
            types = []
            for i in range(int(knl.get_info(cl.kernel_info.NUM_ARGS))):
                qualifier = knl.get_arg_info(i, cl.kernel_arg_info.ADDRESS_QUALIFIER)
                if qualifier != cl.kernel_arg_address_qualifier.PRIVATE:
                    types.append(None)  # a buffer or local memory
                    continue
                name = knl.get_arg_info(i, cl.kernel_arg_info.TYPE_NAME).rstrip("\x00").strip()
                types.append(_SCALAR_TYPES[name])
            knl.set_scalar_arg_dtypes(types)
        except (cl.Error, KeyError, ValueError, TypeError) as e:
            log.debug("no scalar argument types for %s: %s", knl.function_name, e)

    def launch(self, kernel: cl.Kernel, global_size: tuple[int, ...], local_size: tuple[int, ...] | None,
               *args: object) -> cl.Event:
        """Enqueue ``kernel`` (from :meth:`kernel`) on this device's queue with ``args``.

        The same as ``kernel(queue, global_size, local_size, *args)`` but without pyopencl's
        generic call path, which cost about 20 us per launch on PoCL against about 8 us here
        (``set_args`` + ``enqueue_nd_range_kernel``) on a 2-core Xeon VM; on a 2-core Zen 1 EPYC VM
        this path costs 18-20 us, ``set_args`` about 14 of them, which is why decode replays its
        recorded launches without it (:mod:`core.replay`, 7-10 us each there). Records
        ``(kernel name, event)`` while profiling.

        Returns:
            The ``cl.Event`` of the launch.
        """
        kernel.set_args(*args)
        launches = getattr(self._recording, "launches", None)
        if launches is not None:
            launches.append((getattr(kernel, "_kernel", kernel), tuple(global_size),
                             None if local_size is None else tuple(local_size), args))
        if self.profiling and isinstance(kernel, _ProfiledKernel):
            evt = self.cl.enqueue_nd_range_kernel(self.queue, kernel._kernel, global_size, local_size)
            self._events.append((kernel._name, evt))
            return evt
        return self.cl.enqueue_nd_range_kernel(self.queue, getattr(kernel, "_kernel", kernel), global_size,
                                               local_size)

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[tuple]]:
        """While active, every :meth:`launch` of this thread is also appended to the yielded list as
        ``(cl.Kernel, global_size, local_size, args)`` (it still runs): what core/replay.py replays.
        The launches of other threads are not recorded."""
        launches: list[tuple] = []
        self._recording.launches = launches
        try:
            yield launches
        finally:
            self._recording.launches = None

    def kernel_copy(self, kernel: cl.Kernel) -> cl.Kernel:
        """A second ``cl.Kernel`` of ``kernel``'s program and function, with its own arguments
        (a kernel object holds the arguments last set on it), scalar types declared as :meth:`kernel`'s."""
        knl = getattr(kernel, "_kernel", kernel)
        out = self.cl.Kernel(knl.program, knl.function_name)
        self._declare_scalar_types(out)
        return out

    def kernel_limits(self, kernel: cl.Kernel) -> KernelLimits:
        """The compiled kernel's own limits on this device (CL_KERNEL_WORK_GROUP_SIZE,
        CL_KERNEL_LOCAL_MEM_SIZE, CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE), which can be far
        below the device's (registers, or local memory the compiler adds): see :class:`KernelLimits`."""
        info, kwgi = getattr(kernel, "_kernel", kernel), self.cl.kernel_work_group_info

        def get(what, default: int) -> int:
            try:
                return int(info.get_work_group_info(what, self.cl_device))
            except (self.cl.Error, self.cl.LogicError):
                return default

        items = min(get(kwgi.WORK_GROUP_SIZE, self.max_work_group_size), self.max_work_group_size)
        return KernelLimits(name=info.function_name, max_items=items, local_mem_bytes=get(kwgi.LOCAL_MEM_SIZE, 0),
                            device_local_mem_bytes=self.local_mem_size,
                            preferred_multiple=max(1, get(kwgi.PREFERRED_WORK_GROUP_SIZE_MULTIPLE, 1)))

    def check_fits(self, kernel: cl.Kernel, items: int, what: object = "") -> None:
        """Raise :class:`KernelLimitError` (naming ``what``, the kernel and the limit) when a launch of
        ``items`` work-items per group does not fit the compiled ``kernel`` on this device (its
        work-group limit, or its local memory against the device's)."""
        problem = self.kernel_limits(kernel).problem(items)
        if problem:
            raise KernelLimitError(f"{what or 'this launch'}: {problem} on {self.info.name}")

    def work_group_size(self, kernel: cl.Kernel, wanted: int | None = None) -> int:
        """Largest power of two <= ``wanted`` that this compiled kernel may use on this device.

        Args:
            kernel: a ``cl.Kernel``.
            wanted: requested size, default the device's max work-group size.

        Raises:
            KernelLimitError: the kernel needs more local memory than the device has.
        """
        limits = self.kernel_limits(kernel)
        if limits.local_mem_bytes > limits.device_local_mem_bytes:
            raise KernelLimitError(f"{limits.problem(1)} on {self.info.name}")
        limit = min(limits.max_items, wanted or self.max_work_group_size)
        size = 1
        while size * 2 <= limit:
            size *= 2
        return size

    # -- buffers --------------------------------------------------------------------------
    def _buffer(self, nbytes: int):
        buf = self.cl.Buffer(self.context, self.cl.mem_flags.READ_WRITE, nbytes)
        self.allocated_bytes += nbytes
        return buf

    def alloc(self, n_floats: int) -> cl.Buffer:
        """An uninitialised float32 device buffer of ``n_floats`` elements (at least one)."""
        return self._buffer(max(1, int(n_floats)) * 4)

    def zeros(self, n: int, dtype: npt.DTypeLike = np.float32) -> cl.Buffer:
        """A device buffer of ``n`` zeroed elements of ``dtype`` (float32 or int32)."""
        nbytes = max(1, int(n)) * np.dtype(dtype).itemsize
        buf = self._buffer(nbytes)
        self.cl.enqueue_fill_buffer(self.queue, buf, np.zeros(1, dtype=np.uint8), 0, nbytes)
        return buf

    def upload(self, array: np.ndarray, buf: cl.Buffer | None = None) -> cl.Buffer:
        """Copy a host array (float32 or int32, any shape) into a new or given device buffer."""
        a = np.ascontiguousarray(array)
        if a.dtype not in (np.float32, np.int32):
            raise TypeError(f"upload wants float32 or int32, got {a.dtype}")
        if buf is None:
            buf = self._buffer(max(4, a.nbytes))
        if a.nbytes:
            self.cl.enqueue_copy(self.queue, buf, a)
        return buf

    def set_int(self, buf: cl.Buffer, value: int, count: int = 1) -> None:
        """Write the int32 ``value`` into the first ``count`` elements of ``buf``, asynchronously (a fill:
        on PoCL about 100 us less per call than a blocking upload, what decode pays per token for its
        token id)."""
        self.cl.enqueue_fill_buffer(self.queue, buf, np.int32(value), 0, 4 * count)

    def download(self, buf: cl.Buffer, shape: int | tuple[int, ...], dtype: npt.DTypeLike = np.float32,
                 offset_elems: int = 0) -> np.ndarray:
        """Copy a device buffer (or its part from ``offset_elems``) into a new host array."""
        out = np.empty(shape, dtype=dtype)
        if out.nbytes:
            self.cl.enqueue_copy(self.queue, out, buf,
                                 src_offset=offset_elems * out.itemsize, is_blocking=True)
        return out

    def copy(self, dst: cl.Buffer, src: cl.Buffer, n_elems: int, dst_offset: int = 0, src_offset: int = 0,
             itemsize: int = 4) -> None:
        """Device-to-device copy of ``n_elems`` elements (offsets in elements)."""
        if n_elems:
            self.cl.enqueue_copy(self.queue, dst, src, byte_count=n_elems * itemsize,
                                 dst_offset=dst_offset * itemsize, src_offset=src_offset * itemsize)

    def copy_columns(self, dst: cl.Buffer, src: cl.Buffer, rows: int, cols: int, dst_ld: int, src_ld: int,
                     dst_col: int = 0, src_col: int = 0) -> None:
        """Device-to-device copy of a block of float32 columns: ``dst[r, dst_col + j] = src[r, src_col + j]``
        for ``r < rows``, ``j < cols``, both row-major with rows of ``dst_ld`` and ``src_ld`` elements
        (OpenCL 1.1's clEnqueueCopyBufferRect; nothing when ``rows`` or ``cols`` is 0).

        Raises:
            ValueError: ``cols`` plus a column offset exceeds its row length.
        """
        if dst_col + cols > dst_ld or src_col + cols > src_ld:
            raise ValueError(f"copy_columns: columns {src_col}+{cols} of {src_ld} into {dst_col}+{cols} of {dst_ld}")
        if rows and cols:
            self.cl.enqueue_copy(self.queue, dst, src, src_origin=(4 * src_col, 0, 0), dst_origin=(4 * dst_col, 0, 0),
                                 region=(4 * cols, rows, 1), src_pitches=(4 * src_ld, 4 * src_ld * rows),
                                 dst_pitches=(4 * dst_ld, 4 * dst_ld * rows))

    def finish(self) -> None:
        """Block until every queued command has completed."""
        self.queue.finish()


class _ProfiledKernel:
    """A ``cl.Kernel`` whose launches record ``(name, event)`` in its Device (profiling mode only)."""

    def __init__(self, dev: Device, kernel, name: str):
        self._dev, self._kernel, self._name = dev, kernel, name

    def __call__(self, queue, *args, **kwargs):
        evt = self._kernel(queue, *args, **kwargs)
        if self._dev.profiling:
            self._dev._events.append((self._name, evt))
        return evt

    def __getattr__(self, attr):
        return getattr(self._kernel, attr)


_open_devices: dict[tuple[int, int], Device] = {}
_open_lock = threading.Lock()


def open_device(spec: int | str | DeviceInfo | None = None) -> Device:
    """Open (or reuse) the :class:`Device` for ``spec`` (see :func:`select_device`).

    One Device per physical device per process, so programs are built once.

    Raises:
        OpenCLUnavailableError: as :func:`select_device`; also a device whose compiler cannot build
            kernels here (:attr:`DeviceInfo.problem`), with the reason.
        ValueError: as :func:`select_device`.
    """
    info = spec if isinstance(spec, DeviceInfo) else select_device(spec)
    if info.problem:
        raise OpenCLUnavailableError(f"{info.label}: {info.problem}")
    key = (info.platform_index, info.device_index)
    with _open_lock:  # the GUI opens devices from several worker threads
        dev = _open_devices.get(key)
        if dev is None:
            dev = Device(info)
            _open_devices[key] = dev
    return dev
