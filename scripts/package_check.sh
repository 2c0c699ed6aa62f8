#!/usr/bin/env bash
# Build the sdist and the wheel (python -m build, into dist/), install the wheel with the
# daemon extra into an EMPTY venv, and run `aioloader --version` and `aioloader serve --help`
# from there: what a user gets from a built wheel, without this checkout on the path.
# CI runs it (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
rm -rf dist
.venv/bin/python -m build --quiet --outdir dist . >/dev/null
version=$(.venv/bin/python -c 'import aioloader; print(aioloader.__version__)')
wheel=dist/aioloader-$version-py3-none-any.whl
sdist=dist/aioloader-$version.tar.gz
for file in "$wheel" "$sdist"; do
    [ -f "$file" ] || { echo "package_check: $file was not built" >&2; exit 1; }
done
# The licence travels with both.
# (listed first: grep -q stops reading early, which pipefail would take for a failure)
listing=$(tar -tzf "$sdist")
grep -qx "aioloader-$version/LICENSE" <<<"$listing" || { echo "no LICENSE in $sdist" >&2; exit 1; }
listing=$(.venv/bin/python -m zipfile -l "$wheel")
grep -q "licenses/LICENSE" <<<"$listing" || { echo "no LICENSE in $wheel" >&2; exit 1; }

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
PYTHON=${PYTHON:-python3}
"$PYTHON" -m venv "$scratch/venv"
"$scratch/venv/bin/python" -m pip install --quiet "$PWD/$wheel[daemon]"
cd "$scratch"  # away from the checkout: only the installed wheel can answer
got=$(venv/bin/aioloader --version)
if [ "$got" != "aioloader $version" ]; then
    echo "package_check: aioloader --version said '$got', expected 'aioloader $version'" >&2
    exit 1
fi
venv/bin/aioloader serve --help >/dev/null
if venv/bin/python -c "import torch" 2>/dev/null; then
    echo "package_check: aioloader[daemon] pulled in torch" >&2
    exit 1
fi
echo "package_check: $wheel and $sdist built; the wheel runs in an empty venv ($got, no torch)"
