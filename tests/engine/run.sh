#!/usr/bin/env bash
# The engine tier (make test-engine): the released vllm package, pinned, in its own
# environment outside the repository and the main .venv, cached between runs
# ($PLACER_ENGINE_VENV, default ~/.cache/placer/vllm-$VLLM_VERSION: ~9.5 GB, ~3 minutes to
# install the first time); the checkout under test is installed into it (editable, so the
# environment always runs this checkout's placer), then tests/engine runs there, on CPU.
# When vllm cannot be installed the tier says so and passes, unless PLACER_REQUIRE_VLLM=1
# (CI, .ci/run): then it fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
VLLM_VERSION=0.33.0
VENV="${PLACER_ENGINE_VENV:-$HOME/.cache/placer/vllm-$VLLM_VERSION}"
PY="${PY:-python3}"

unavailable() {
    if [ "${PLACER_REQUIRE_VLLM:-}" = "1" ]; then
        echo "error: PLACER_REQUIRE_VLLM=1 but $1" >&2
        exit 1
    fi
    echo "engine tier not run: $1 (set PLACER_REQUIRE_VLLM=1 to fail instead)" >&2
    exit 0
}

has_vllm() {
    # the installed distribution's version (importing vllm takes seconds; the tests do)
    "$VENV/bin/python" -c "import sys, importlib.metadata as m;
sys.exit(m.version('vllm') != '$VLLM_VERSION')" >/dev/null 2>&1
}

if ! has_vllm; then
    echo "installing vllm==$VLLM_VERSION into $VENV (once; ~3 minutes)" >&2
    "$PY" -m venv "$VENV" || unavailable "cannot create a virtual environment at $VENV"
    "$VENV/bin/pip" install --quiet "vllm==$VLLM_VERSION" \
        || unavailable "pip cannot install vllm==$VLLM_VERSION"
    has_vllm || unavailable "vllm==$VLLM_VERSION does not import after installing"
fi
# this checkout (its entry point for vLLM's loader), and placer's own dependencies the
# first time (vllm's torch and numpy stay as they are)
if "$VENV/bin/python" -c "import ortools, networkx, typer, rich, yaml, pytest, xdist" \
        >/dev/null 2>&1; then
    # vllm brings setuptools: no isolated build (seconds instead of half a minute)
    "$VENV/bin/pip" install --quiet --no-deps --no-build-isolation -e . \
        || unavailable "pip cannot install this checkout into $VENV"
else
    "$VENV/bin/pip" install --quiet -e . pytest pytest-xdist \
        || unavailable "pip cannot install this checkout and its dependencies into $VENV"
fi
# PYTHONPATH: this checkout's placer, whichever checkout installed itself last;
# -o addopts=: the main tier's defaults (xdist's scheduling) are not this tier's
PYTHONPATH="$PWD" PLACER_REQUIRE_VLLM=1 "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
    -o addopts= -m engine tests/engine "$@"
