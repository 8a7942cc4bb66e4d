#!/usr/bin/env bash
# Puts "// SPDX-License-Identifier: Apache-2.0" as the first line of every C++
# source (.h, .cpp, .cc, .hpp) git tracks under the given paths (default: the
# whole repository) that does not have it yet. Idempotent: a second run
# changes nothing.
#   scripts/add-spdx.sh [--check] [PATH...]
# --check changes nothing; it lists the files that lack the line and exits 1
# when there are any.
set -euo pipefail
LINE='// SPDX-License-Identifier: Apache-2.0'
check=0
if [[ ${1:-} == --check ]]; then
  check=1
  shift
fi
cd "$(git rev-parse --show-toplevel)"
missing=0
while IFS= read -r -d '' f; do
  [[ -f $f ]] || continue
  first=$(head -n 1 "$f")
  [[ $first == "$LINE" ]] && continue
  if ((check)); then
    echo "$f"
    missing=1
    continue
  fi
  tmp=$(mktemp "$f.spdx.XXXXXX")
  { printf '%s\n' "$LINE"; cat "$f"; } >"$tmp"
  chmod --reference="$f" "$tmp"
  mv "$tmp" "$f"
  echo "add-spdx: $f"
done < <(git ls-files -z -- "${@:-.}" | grep -zE '\.(h|hpp|cpp|cc)$' || true)
exit "$missing"
