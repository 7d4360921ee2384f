#!/usr/bin/env bash
# `make test-pythons`: the unit tests on each Python given (default 3.10 3.12), each in its
# own .venv-pyX.Y (made once). An interpreter is python3.X on PATH, or pyenv's.
# Those venvs hold the farm without torch (a worker host's install: the pinned CPU build of
# torch is this machine's for Python 3.11 only, PyPI's for the others is the CUDA one, GBs):
# the unit tests of the submit side's model reading, which import torch, run on .venv's 3.11.
set -u
status=0
TORCH_TESTS="${TORCH_TESTS:-test_archive test_cli_errors test_foldbn test_ingest test_lean test_reader}"
for v in "$@"; do
  py=""
  for c in "python$v" "$HOME"/.pyenv/versions/"$v".*/bin/"python$v"; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'pass' >/dev/null 2>&1; then py=$c; break; fi
  done
  if [ -z "$py" ]; then echo "== Python $v: not on this machine, skipped"; continue; fi
  venv=".venv-py$v"
  if [ ! -x "$venv/bin/pytest" ]; then
    "$py" -m venv "$venv" && "$venv/bin/pip" install --quiet --upgrade pip \
      && "$venv/bin/pip" install --quiet -e ".[test]" || { echo "== Python $v: install failed"; exit 1; }
  fi
  echo "== Python $v ($("$venv/bin/python" -V))"
  skip=()
  if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
    for t in $TORCH_TESTS; do skip+=(--ignore "tests/unit/$t.py"); done
    echo "   (no torch here: not run: $TORCH_TESTS)"
  fi
  "$venv/bin/python" -m pytest -q -p no:randomly tests/unit "${skip[@]}" || status=1
done
exit $status
