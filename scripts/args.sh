# shellcheck shell=bash
# Sourced by the scripts in this directory: the argument handling they share, so that each one's
# --help and refusals read alike. Not meant to be run.

# Prints the calling script's header comment (from after the shebang to the first line that is
# not a comment) without the comment marks: each script's --help.
print_script_help() {
  awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$1"
}

# For a script that takes no arguments: --help (or -h) prints its header and exits 0; any other
# argument is refused in one line with exit 2, before the script does anything.
# Usage: takes_no_arguments "$0" "$@"
takes_no_arguments() {
  local script=$1 name a
  shift
  name=$(basename "$script")
  for a in "$@"; do
    case $a in
      -h|--help) print_script_help "$script"; exit 0 ;;
    esac
  done
  if (($#)); then
    echo "$name: unexpected argument '$1': it takes none; see scripts/$name --help" >&2
    exit 2
  fi
}
