#!/usr/bin/env bash
# Fails when a C++ source of the repository is not as clang-format (the committed
# .clang-format) would write it, or has a line over the 100-column limit (raw strings and
# comments clang-format leaves alone included). Prints each offending file and line.
# Usage: tests/format/check_format.sh SOURCE_DIR [CLANG_FORMAT]
set -euo pipefail
root="$1"
clang_format="${2:-clang-format}"
cd "$root"
command -v "$clang_format" >/dev/null ||
  { echo "check_format: $clang_format not found (scripts/setup installs clang-format)" >&2; exit 1; }
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.cpp' '*.h' '*.cu' | \
    grep -v '^tests/fixtures/' | while read -r f; do [ -f "$f" ] && echo "$f"; done)
else
  mapfile -t files < <(find . -path ./build -prune -o -path './build-*' -prune -o \
    -path ./tests/fixtures -prune -o \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' \) -print | sed 's|^\./||')
fi
((${#files[@]})) || { echo "check_format: no C++ sources found under $root" >&2; exit 1; }

bad=0
for f in "${files[@]}"; do
  if ! "$clang_format" --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "$f: not clang-formatted (run: clang-format -i $f)"
    bad=$((bad + 1))
  fi
done
# Characters, not bytes (a UTF-8 comment may be under the limit in columns).
long=$(LC_ALL=C.UTF-8 grep -Hn '.\{101,\}' "${files[@]}" | cut -d: -f1,2 | sed 's/$/: over 100 columns/' || true)
if [ -n "$long" ]; then
  echo "$long"
  bad=$((bad + $(wc -l <<<"$long")))
fi
echo "check_format: ${#files[@]} files, $bad problems"
[ "$bad" -eq 0 ]
