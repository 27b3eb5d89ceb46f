#!/usr/bin/env bash
# Add OpenCL LLM Studio to your Linux application menu (for this user; no root needed).
# Run it from the unpacked bundle folder:  ./install-desktop-entry.sh
# Remove the entry again:                   ./install-desktop-entry.sh --uninstall
# Moved the folder? Run it again from the new place.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=opencl-llm-studio
data=${XDG_DATA_HOME:-$HOME/.local/share}
apps=$data/applications
icons=$data/icons/hicolor

if [ "${1:-}" = --uninstall ]; then
  rm -f "$apps/$name.desktop" "$icons/256x256/apps/$name.png" "$icons/scalable/apps/$name.svg"
  command -v update-desktop-database >/dev/null && update-desktop-database -q "$apps" || true
  echo "removed $apps/$name.desktop"
  exit 0
fi

exe=$here/$name
[ -x "$exe" ] || { echo "no executable $exe: run this script from the bundle folder" >&2; exit 1; }
mkdir -p "$apps" "$icons/256x256/apps" "$icons/scalable/apps"
cp "$here/$name.png" "$icons/256x256/apps/$name.png"
[ -f "$here/$name.svg" ] && cp "$here/$name.svg" "$icons/scalable/apps/$name.svg"

# Exec: the path in double quotes, with \ " ` $ backslash-escaped, then every \ doubled again (the
# desktop entry spec's quoting and string escaping), % doubled; TryExec and Icon take the path as it is.
esc=${exe//\\/\\\\}; esc=${esc//\"/\\\"}; esc=${esc//\`/\\\`}; esc=${esc//\$/\\\$}
esc=${esc//\\/\\\\}; esc=${esc//%/%%}
while IFS= read -r line || [ -n "$line" ]; do
  case "$line" in
    Exec=*) printf 'Exec="%s" %%f\n' "$esc" ;;
    TryExec=*) printf 'TryExec=%s\n' "$exe" ;;
    Icon=*) printf 'Icon=%s\n' "$icons/256x256/apps/$name.png" ;;
    *) printf '%s\n' "$line" ;;
  esac
done < "$here/$name.desktop" > "$apps/$name.desktop.tmp"
chmod 644 "$apps/$name.desktop.tmp"
mv "$apps/$name.desktop.tmp" "$apps/$name.desktop"
command -v update-desktop-database >/dev/null && update-desktop-database -q "$apps" || true
command -v gtk-update-icon-cache >/dev/null && gtk-update-icon-cache -q -t "$icons" 2>/dev/null || true
echo "installed $apps/$name.desktop -> $exe"
