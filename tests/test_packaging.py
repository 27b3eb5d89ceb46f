"""The PyInstaller bundle (packaging/): layout, frozen self-test, window start, OpenCL driver wiring.

Slow (a build takes about a minute on 2 cores), so it runs only when asked:

  OPENCL_LLM_TEST_BUNDLE=1       build the bundle with packaging/build.sh (PyInstaller must be
                                 importable by this interpreter: pip install ".[package]")
  OPENCL_LLM_BUNDLE=dist/opencl-llm-studio
                                 test an existing bundle folder instead of building one

The bundle is copied into a folder whose path has a space and a non-ASCII letter, and run with an
empty HOME, from another working directory, with the bundle folder read-only.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NAME = "opencl-llm-studio"
IS_LINUX = sys.platform.startswith("linux")

pytestmark = pytest.mark.skipif(
    not (os.environ.get("OPENCL_LLM_TEST_BUNDLE") == "1" or os.environ.get("OPENCL_LLM_BUNDLE")),
    reason="bundle tests run with OPENCL_LLM_TEST_BUNDLE=1 (builds it) or OPENCL_LLM_BUNDLE=<folder>",
)

EXE = ".exe" if sys.platform == "win32" else ""


def _clean_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a user who never ran the app: empty HOME, no XDG overrides, no app vars."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("XDG_", "OPENCL_LLM_", "POCL_", "PYOPENCL_", "OCL_ICD", "QT_", "PYTHON"))
           and k not in ("VIRTUAL_ENV", "LD_LIBRARY_PATH")}
    env.update(HOME=str(home), USERPROFILE=str(home), QT_QPA_PLATFORM="offscreen", **extra)
    return env


def _run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, encoding="utf-8",
                          errors="replace", timeout=timeout)
    print(f"$ {' '.join(args)}\n--- rc {proc.returncode}\n{proc.stdout}\n--- stderr\n{proc.stderr[-4000:]}")
    return proc


def _tree_state(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*")}


def _can_unshare() -> bool:
    if not IS_LINUX or os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def built_bundle() -> Path:
    given = os.environ.get("OPENCL_LLM_BUNDLE")
    if given:
        folder = Path(given).resolve()
        assert (folder / f"{NAME}{EXE}").is_file(), f"no {NAME}{EXE} in {folder}"
        return folder
    if not IS_LINUX:
        pytest.skip("packaging/build.sh is for Linux; build with PyInstaller directly elsewhere")
    pytest.importorskip("PyInstaller", reason='PyInstaller not installed (pip install ".[package]")')
    proc = subprocess.run(["bash", str(ROOT / "packaging" / "build.sh"), "--no-tar"], cwd=ROOT,
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True,
                          timeout=1800)
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    assert proc.returncode == 0, f"build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return ROOT / "dist" / NAME


@pytest.fixture(scope="module")
def bundle(built_bundle: Path, tmp_path_factory) -> Path:
    """A copy of the bundle under '.../Mein Ordner ü/', made read-only."""
    parent = tmp_path_factory.mktemp("bundle") / "Mein Ordner ü"
    parent.mkdir()
    dest = parent / NAME
    shutil.copytree(built_bundle, dest, symlinks=True)
    for p in [dest, *dest.rglob("*")]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    yield dest
    for p in [dest, *dest.rglob("*")]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode | stat.S_IWUSR)


def _internal(bundle: Path) -> Path:
    return bundle / "_internal"


def test_bundle_holds_qt_plugins_kernels_resources_and_opencl(bundle: Path):
    internal = _internal(bundle)
    plugins = internal / "PySide6" / "Qt" / "plugins" / "platforms"
    found = {p.name for p in plugins.iterdir()}
    for plugin in ("offscreen", "minimal", "xcb") if IS_LINUX else ("offscreen", "minimal"):
        assert any(plugin in n for n in found), f"Qt platform plugin {plugin} missing: {sorted(found)}"
    kernels = sorted(p.name for p in (ROOT / "core" / "kernels").glob("*.cl"))
    assert kernels, "no kernel sources in the source tree?"
    for k in kernels:
        assert (internal / "core" / "kernels" / k).is_file(), f"kernel source {k} missing"
    for r in ("default_dataset.json", f"{NAME}.png", f"{NAME}.svg", f"{NAME}.desktop"):
        assert (internal / "resources" / r).is_file(), f"resources/{r} missing"
    assert (internal / "pyopencl" / "cl" / "pyopencl-complex.h").is_file()
    assert (internal / "pyqtgraph").is_dir()
    assert (bundle / f"opencl-llm{EXE}").is_file()
    if IS_LINUX:
        libs = internal / "pyopencl" / ".libs"
        assert list(libs.glob("libOpenCL*")) and list(libs.glob("libpocl*")) and (libs / "pocl.icd").is_file()
        pocl_share = internal / "pocl_binary_distribution" / ".libs" / "share" / "pocl"
        assert list(pocl_share.glob("kernel-*.bc")) and (pocl_share / "include" / "_kernel.h").is_file()
        assert list((internal / "pocl_binary_distribution" / ".libs").glob("libhwloc*"))
        assert os.access(internal / "pocl-linker" / "ld", os.X_OK)
        for f in (f"{NAME}.desktop", f"{NAME}.png", "install-desktop-entry.sh"):
            assert (bundle / f).is_file(), f"{f} missing next to the executable"


def _check_self_test(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"self-test failed (rc {proc.returncode})"
    out = proc.stdout
    for step in ("devices", "device check", "training", "generation", "GGUF export"):
        assert f"[ok] {step}:" in out, f"step {step!r} did not pass"
    assert "self-test passed: 5/5 steps ok" in out


def test_frozen_self_test_in_read_only_odd_path_with_empty_home(bundle: Path, tmp_path: Path):
    home = tmp_path / "home ä"
    home.mkdir()
    before = _tree_state(bundle)
    if _can_unshare():
        # root ignores file modes: make the folder really read-only with a read-only bind mount
        script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && exec "$1/opencl-llm-studio" --self-test'
        args = ["unshare", "-m", "sh", "-c", script, "sh", str(bundle)]
    else:
        args = [str(bundle / f"{NAME}{EXE}"), "--self-test"]
    proc = _run(args, _clean_env(home), cwd=tmp_path)
    _check_self_test(proc)
    assert _tree_state(bundle) == before, "the app wrote into its bundle folder"
    # the kernel caches went to the per-user cache folder under the (empty) HOME
    if IS_LINUX:
        assert (home / ".cache" / "opencl-llm-studio" / "pocl").is_dir()


def test_frozen_cli_lists_devices(bundle: Path, tmp_path: Path):
    proc = _run([str(bundle / f"opencl-llm{EXE}"), "devices"], _clean_env(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0
    if IS_LINUX:
        assert "Portable Computing Language" in proc.stdout


@pytest.mark.skipif(not IS_LINUX, reason="ocl-icd vendor files are a Linux thing")
def test_frozen_loader_reads_vendor_files_as_well_as_the_bundled_pocl(bundle: Path, tmp_path: Path):
    """The system's ICDs (/etc/OpenCL/vendors, or OCL_ICD_VENDORS) are found next to the bundled PoCL.

    A vendor folder holding one .icd (pointing at the bundled libpocl by absolute path, standing in
    for an Intel/AMD/NVIDIA driver) must add a second platform to the bundled one.
    """
    vendors, empty = tmp_path / "vendors", tmp_path / "no-vendors"
    vendors.mkdir()
    empty.mkdir()  # the bundled PoCL alone, whatever this machine has in /etc/OpenCL/vendors
    libpocl = next((_internal(bundle) / "pyopencl" / ".libs").glob("libpocl*"))
    (vendors / "system-driver.icd").write_text(f"{libpocl}\n", encoding="utf-8")
    env = _clean_env(tmp_path)
    one = _run([str(bundle / "opencl-llm"), "devices"], {**env, "OCL_ICD_VENDORS": str(empty)}, cwd=tmp_path)
    two = _run([str(bundle / "opencl-llm"), "devices"], {**env, "OCL_ICD_VENDORS": str(vendors)}, cwd=tmp_path)
    assert one.returncode == 0 and two.returncode == 0
    assert two.stdout.count("Portable Computing Language") == 2 * one.stdout.count("Portable Computing Language")


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare to hide the system linker")
def test_frozen_self_test_without_system_linker(bundle: Path, tmp_path: Path):
    """PoCL links kernels with `ld`; on a machine without binutils the bundled one must be used."""
    hide = sorted({os.path.realpath(p) for p in (shutil.which("ld"), shutil.which("ld.bfd")) if p})
    if not hide:
        pytest.skip("no system ld to hide")
    empty = tmp_path / "not-a-linker"
    empty.write_bytes(b"")
    mounts = " && ".join(f'mount --bind "{empty}" "{p}"' for p in hide)
    script = f'{mounts} && exec "$1/opencl-llm-studio" --self-test'
    proc = _run(["unshare", "-m", "sh", "-c", script, "sh", str(bundle)], _clean_env(tmp_path), cwd=tmp_path)
    _check_self_test(proc)


def test_frozen_window_starts_offscreen_counts_tokens_and_closes(bundle: Path, tmp_path: Path):
    """The window opens a project of 2,500 facts on its Dataset tab; their tokens are counted in a child
    process (gui.workers.CHILD_MIN_ENTRIES): in the bundle that child re-runs the executable, which must
    serve it (freeze_support), not open a second window."""
    from core.dataset import Dataset
    from gui.project import Project, save_project
    from gui.workers import CHILD_MIN_ENTRIES

    facts = [f"Fact {i}: the lantern of meadow {i} is violet." for i in range(2_500)]
    assert len(facts) >= CHILD_MIN_ENTRIES
    save_project(Project(tmp_path / "big project", Dataset(facts, []), {}))
    proc = _run([str(bundle / f"{NAME}{EXE}"), "--quit-after", "15", str(tmp_path / "big project")],
                _clean_env(tmp_path), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0
    assert "main window" in proc.stdout and "was shown" in proc.stdout
    assert re.search(r"dataset counts: '2,500 facts.*[1-9][\d,]* tokens \(", proc.stdout), "no token counts in 15 s"
    assert proc.stdout.count("was shown") == 1


@pytest.mark.skipif(not IS_LINUX, reason="desktop entries are for Linux menus")
def test_install_desktop_entry_quotes_the_path(bundle: Path, tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    proc = _run(["bash", str(bundle / "install-desktop-entry.sh")], _clean_env(home), cwd=tmp_path)
    assert proc.returncode == 0
    entry = (home / ".local" / "share" / "applications" / f"{NAME}.desktop").read_text(encoding="utf-8")
    assert f'Exec="{bundle / NAME}" %f' in entry  # no characters needing escapes in this path
    assert f"TryExec={bundle / NAME}" in entry
    icon = home / ".local" / "share" / "icons" / "hicolor" / "256x256" / "apps" / f"{NAME}.png"
    assert icon.is_file() and f"Icon={icon}" in entry
    proc = _run(["bash", str(bundle / "install-desktop-entry.sh"), "--uninstall"], _clean_env(home), cwd=tmp_path)
    assert proc.returncode == 0
    assert not (home / ".local" / "share" / "applications" / f"{NAME}.desktop").exists()
