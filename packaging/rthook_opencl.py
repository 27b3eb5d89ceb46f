"""PyInstaller runtime hook: OpenCL and PoCL setup for the frozen app (runs before the app's code).

How a pip install finds its drivers, reproduced here:

* pyopencl's Linux wheels link against their own ocl-icd loader (``pyopencl/.libs/libOpenCL-*.so``),
  patched to read the vendor files of ``OCL_ICD_VENDORS`` (default ``/etc/OpenCL/vendors``) *and*
  every ``*.icd`` in ``$PYOPENCL_HOME/.libs``. ``pyopencl/__init__.py`` sets ``PYOPENCL_HOME`` to its
  own folder on import. The pocl wheel puts ``libpocl-*.so`` and ``pocl.icd`` in ``pyopencl/.libs``.
  The spec keeps that layout inside the bundle, so the frozen loader finds the bundled PoCL *and*
  the system's Intel/AMD/NVIDIA ICDs in /etc/OpenCL/vendors, exactly like a venv does. We do not
  set ``OCL_ICD_VENDORS``: that would hide /etc/OpenCL/vendors (and pointing it at a folder holding
  a copy of pocl.icd would load PoCL twice).
* libpocl finds its kernel library and headers relative to itself
  (``../../pocl_binary_distribution/.libs/share/pocl``), and libhwloc through its RPATH
  (``$ORIGIN/../../pocl_binary_distribution/.libs``): the spec keeps both relative paths.
* PoCL writes compiled kernels to ``POCL_CACHE_DIR`` (default ``~/.cache/pocl``); ``core.device``
  points it at the app's per-user cache folder before any context exists. We set the same folder
  here too (when nothing else did), so that no code path can make PoCL write next to the bundle,
  which may be read-only.
* PoCL links each kernel by running the system linker ``ld`` and aborts the process when there is
  none; the bundle carries GNU ld in ``_internal/pocl-linker`` and we append that to PATH.
* PyInstaller's bootloader puts the bundle folder on LD_LIBRARY_PATH; we restore the user's value so
  that child processes (that ``ld``, xdg-open, ...) load their own system libraries.
"""
import os
import sys


def _setup() -> None:
    base = getattr(sys, "_MEIPASS", None)
    if not base:
        return
    if sys.platform.startswith("linux"):
        pyopencl_home = os.path.join(base, "pyopencl")
        if os.path.isdir(os.path.join(pyopencl_home, ".libs")):
            # pyopencl sets the same value itself on import; set it first in case a future pyopencl
            # stops doing so or something initialises the loader before importing pyopencl.
            os.environ["PYOPENCL_HOME"] = pyopencl_home
    if "POCL_CACHE_DIR" not in os.environ:
        try:
            from core.device import user_cache_dir

            os.environ["POCL_CACHE_DIR"] = str(user_cache_dir() / "pocl")
        except Exception:  # core.device sets it again (or falls back) when it lists devices
            pass
    os.environ.setdefault("PYOPENCL_COMPILER_OUTPUT", "0")
    _add_pocl_linker(base)
    _restore_library_path(base)


def _add_pocl_linker(base: str) -> None:
    """Append the bundled fallback linker (``_internal/pocl-linker/ld``) to PATH.

    PoCL runs ``ld`` for every kernel it compiles and aborts the process when there is none
    (machines without binutils). Appended, not prepended: a system linker is still found first.
    """
    linker_dir = os.path.join(base, "pocl-linker")
    if sys.platform.startswith("linux") and os.path.isfile(os.path.join(linker_dir, "ld")):
        path = os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin"
        if linker_dir not in path.split(os.pathsep):
            os.environ["PATH"] = path + os.pathsep + linker_dir


def _restore_library_path(base: str) -> None:
    """Give child processes the user's LD_LIBRARY_PATH, not the bundle's.

    PyInstaller's bootloader (Linux) starts the app with ``LD_LIBRARY_PATH=<bundle>/_internal[:old]``
    and keeps the old value in ``LD_LIBRARY_PATH_ORIG``. The dynamic loader read the variable when
    this process started, so changing it now only affects child processes: PoCL runs the system
    linker (/usr/bin/ld) for every kernel it compiles, and ld must load the *system* libz/libzstd,
    not the (possibly older) copies in the bundle; likewise xdg-open & co. started by Qt.
    """
    if not sys.platform.startswith("linux"):
        return
    current = os.environ.get("LD_LIBRARY_PATH")
    if current is None or not current.split(os.pathsep)[0].startswith(base):
        return
    orig = os.environ.pop("LD_LIBRARY_PATH_ORIG", None)
    if orig:
        os.environ["LD_LIBRARY_PATH"] = orig
    else:
        del os.environ["LD_LIBRARY_PATH"]


_setup()
