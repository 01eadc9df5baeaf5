# Sourced by the .ci/env-* scripts: make a fresh virtual environment and install into it quietly, with uv.
# Each module's .pyc is written to build/pycache the first time a process imports it (the Makefile says
# why), also where PYTHONDONTWRITEBYTECODE is set.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-$PWD/build/pycache}"
fresh_venv() {  # fresh_venv PYTHON DIR: a virtual environment with the newest pip (tests and learners use it),
  # installed by uv, not by venv's ensurepip (5 CPU-seconds fewer each, at the start of make test's tracks)
  "$1" -m venv --clear --without-pip "$2"
  VENV="$2"
  UV="$(.ci/uv)"
  pip_install --upgrade pip
}
pip_install() {  # what `pip install` would install, installed by uv (.ci/uv says why), less what
  # .ci/uv-overrides.txt leaves out; the .pyc files are written as modules are first imported (above)
  "$UV" pip install --quiet --override .ci/uv-overrides.txt --python "$VENV/bin/python" "$@"
}
real_pip() {  # pip itself, where what pip does is the thing tested (a learner's %pip install). This machine's pip
  # configuration warns "Location '...' is ignored" for mirror folders it lacks: exactly those lines are dropped.
  "$VENV/bin/python" -m pip install --quiet "$@" \
    2> >(grep -Ev "^WARNING: Location '[^']*' is ignored: it is neither a file nor a directory\.$" >&2)
}
marked_setup() {  # setup(), with $VENV marked as set up only once it has ended (set -e: not when it fails)
  rm -f "$VENV/.set-up"
  setup
  if [ -d "$VENV" ]; then touch "$VENV/.set-up"; fi
}
require_setup() {  # a run refuses an environment whose set-up failed or never ran (make test's tracks keep going)
  [ -e "$VENV/.set-up" ] || { echo "$VENV is not set up (its set-up failed or never ran): run $0 setup first" >&2; exit 1; }
}
setup_and_run() {  # setup_and_run [setup|run]: the env-* scripts' setup(), run(), or both (no argument)
  case "${1:-all}" in
    setup) marked_setup ;;
    run) run ;;
    all) marked_setup; run ;;
    *) echo "usage: $0 [setup|run]" >&2; exit 2 ;;
  esac
}
