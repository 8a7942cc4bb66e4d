#!/usr/bin/env bash
# scripts/add-spdx.sh in a scratch git repository: adds the SPDX line first
# to tracked C++ files only, leaves files that have it alone, is idempotent,
# keeps file modes, and --check reports what lacks it. Also: LICENSE is the
# Apache-2.0 text.
set -euo pipefail
src=$(cd "$1" && pwd)
grep -q 'Apache License' "$src/LICENSE" && grep -q 'Version 2.0, January 2004' "$src/LICENSE"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
git init -q .
mkdir -p a b
printf '#pragma once\nint f();\n' >a/x.h
printf '// SPDX-License-Identifier: Apache-2.0\nint f() { return 1; }\n' >a/x.cpp
printf 'int g() { return 2; }\n' >b/y.cc
chmod 755 b/y.cc
printf 'print(1)\n' >b/z.py
printf 'int untracked;\n' >b/untracked.cpp
git add a/x.h a/x.cpp b/y.cc b/z.py
mkdir -p scripts && cp "$src/scripts/add-spdx.sh" scripts/

if scripts/add-spdx.sh --check >check.out; then echo "--check passed with files missing the line" >&2; exit 1; fi
grep -qx 'a/x.h' check.out && grep -qx 'b/y.cc' check.out && ! grep -q 'x.cpp' check.out
scripts/add-spdx.sh a >/dev/null          # a path limits the run
[[ $(head -n 1 a/x.h) == '// SPDX-License-Identifier: Apache-2.0' ]]
[[ $(head -n 1 b/y.cc) == 'int g() { return 2; }' ]]
scripts/add-spdx.sh >/dev/null
[[ $(head -n 1 b/y.cc) == '// SPDX-License-Identifier: Apache-2.0' ]]
[[ $(sed -n 2p a/x.h) == '#pragma once' ]]
[[ $(stat -c %a b/y.cc) == 755 ]]
[[ $(head -n 1 b/z.py) == 'print(1)' && $(head -n 1 b/untracked.cpp) == 'int untracked;' ]]
[[ $(grep -c SPDX a/x.cpp) == 1 ]]
before=$(cat a/x.h a/x.cpp b/y.cc | md5sum)
[[ -z $(scripts/add-spdx.sh) ]]           # second run: nothing to do
[[ $(cat a/x.h a/x.cpp b/y.cc | md5sum) == "$before" ]]
scripts/add-spdx.sh --check
echo "spdx_test: ok"
