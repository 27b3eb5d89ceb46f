#!/usr/bin/env bash
# Build the one-folder bundle (Linux): dist/opencl-llm-studio/ and
# dist/opencl-llm-studio-<version>-linux-<arch>.tar.gz. Users unpack it and run ./opencl-llm-studio;
# no Python needed. Windows/macOS: see packaging/README.md.
#
#   bash packaging/build.sh             # uses $PYTHON, else .venv/bin/python, else python3
#   PYTHON=/path/to/python bash packaging/build.sh
#   bash packaging/build.sh --no-tar    # skip the archive (faster, for tests)
#
# PyInstaller comes from the project's `package` extra; when the interpreter lacks it, this installs
# the project with that extra (pip install ".[package]") into that interpreter's environment.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
make_tar=1
for arg in "$@"; do
  case "$arg" in
    --no-tar) make_tar=0 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "unknown option: $arg" >&2; exit 2 ;;
  esac
done

if [ -n "${PYTHON:-}" ]; then py=$PYTHON
elif [ -x .venv/bin/python ]; then py=.venv/bin/python
else py=python3
fi
echo "python: $py ($("$py" -c 'import sys; print(sys.version.split()[0])'))"

start=$(date +%s)
if ! "$py" -c "import PyInstaller" 2>/dev/null; then
  echo "PyInstaller missing: pip install \".[package]\""
  "$py" -m pip install -q ".[package]"
fi
# the bundle freezes what is importable in this environment: make sure the app itself is
if ! "$py" -c "import core, gui, resources, pyopencl, PySide6, pyqtgraph" 2>/dev/null; then
  echo "app dependencies missing: pip install \".[package]\""
  "$py" -m pip install -q ".[package]"
fi

version=$("$py" -c "import core; print(core.__version__)")
os=$("$py" -c "import sys; print({'win32': 'windows', 'darwin': 'macos'}.get(sys.platform, sys.platform.rstrip('0123456789')))")
arch=$("$py" -c "import platform; m = platform.machine().lower(); print({'amd64': 'x86_64', 'arm64': 'aarch64'}.get(m, m))")
name=opencl-llm-studio
bundle=dist/$name

# PyInstaller runs the build from our source tree: make sure stale egg-info/build dirs don't leak in
rm -rf "$bundle" build/pyinstaller
"$py" -m PyInstaller --noconfirm --clean --log-level "${PYINSTALLER_LOG_LEVEL:-WARN}" \
  --distpath dist --workpath build/pyinstaller packaging/opencl-llm-studio.spec

# desktop integration next to the executables
cp resources/$name.desktop resources/$name.png resources/$name.svg "$bundle/"
cp packaging/install-desktop-entry.sh "$bundle/install-desktop-entry.sh"
chmod +x "$bundle/install-desktop-entry.sh" "$bundle/$name"
cp packaging/BUNDLE-README.txt "$bundle/README.txt"

# quick sanity checks: the files the app reads at run time are there
internal=$bundle/_internal
missing=0
for pattern in "PySide6/Qt/plugins/platforms/libqoffscreen.so" "PySide6/Qt/plugins/platforms/libqxcb.so" \
               "core/kernels/matmul.cl" "resources/default_dataset.json" "pyopencl/cl/pyopencl-complex.h"; do
  if [ "$os" != linux ] || ls "$internal"/$pattern >/dev/null 2>&1; then :; else
    echo "MISSING in bundle: $pattern" >&2; missing=1
  fi
done
if [ "$os" = linux ]; then
  for pattern in "pyopencl/.libs/libOpenCL*" "pyopencl/.libs/libpocl*" "pyopencl/.libs/pocl.icd" \
                 "pocl_binary_distribution/.libs/share/pocl/include/_kernel.h" \
                 "pocl_binary_distribution/.libs/libhwloc*"; do
    ls "$internal"/$pattern >/dev/null 2>&1 || { echo "MISSING in bundle: $pattern" >&2; missing=1; }
  done
fi
[ $missing = 0 ] || exit 1
end=$(date +%s)

size_mb=$(du -sm "$bundle" | cut -f1)
echo "bundle: $bundle ($size_mb MB, $(find "$bundle" -type f | wc -l) files)"
if [ $make_tar = 1 ]; then
  tarball=dist/$name-$version-$os-$arch.tar.gz
  t0=$(date +%s)
  # gzip -6 via tar; set GZIP_LEVEL=1 for speed
  tar -C dist -cf - "$name" | gzip -"${GZIP_LEVEL:-6}" > "$tarball"
  echo "archive: $tarball ($(du -m "$tarball" | cut -f1) MB, $(( $(date +%s) - t0 )) s)"
fi
echo "build time: $(( end - start )) s (PyInstaller and checks; archive not included)"
echo "try it: QT_QPA_PLATFORM=offscreen $bundle/$name --self-test"
