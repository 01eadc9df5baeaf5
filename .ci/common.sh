# Sourced by the .ci/env-* scripts: make a fresh virtual environment and install into it quietly.
# (This machine's pip configuration prints "WARNING: Location '...' is ignored: it is neither a file
# nor a directory." for mirror folders it lacks; exactly those lines are dropped, everything else pip
# says is kept, and pip's status counts.)
fresh_venv() {  # fresh_venv PYTHON DIR
  "$1" -m venv --clear "$2"
  VENV="$2"
  pip_install --upgrade pip
}
pip_install() {
  "$VENV/bin/python" -m pip install --quiet "$@" \
    2> >(grep -Ev "^WARNING: Location '[^']*' is ignored: it is neither a file nor a directory\.$" >&2)
}
setup_and_run() {  # setup_and_run [setup|run]: the env-* scripts' setup(), run(), or both (no argument)
  case "${1:-all}" in
    setup) setup ;;
    run) run ;;
    all) setup; run ;;
    *) echo "usage: $0 [setup|run]" >&2; exit 2 ;;
  esac
}
