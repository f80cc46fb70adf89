#!/usr/bin/env bash
# Build a virtual environment holding the Python packages of one Deep Learning Container:
#   tests/images/venv.sh NAME DIR [PACKAGE...]       NAME: training | inference (tests/images/NAME.txt)
# First the set's `# here:` line, with its dependencies: what stands in for the packages that do not install here
# (torch builds, see the set's header), its dependencies at the set's versions, or at those of the file named on
# `# here-constraints:` where the set's refuse it (torch==2.9.0 pins its CUDA packages and triton). Then, without
# PACKAGE, every package of the set at its version (no dependency resolution: the set is complete, and the image's
# versions win over what the `here` packages asked for);
# with PACKAGE, those packages and their dependencies, each at the set's version. A set made for another Python
# (the CPU images have 3.12, this machine 3.11) names on `# here-python:` the versions that replace those that do
# not install here. uv installs when it is on PATH (the training set: 63 s here against pip's 7 to 8 minutes, as it
# downloads in parallel), with pip's wheel folder (PIP_FIND_LINKS) as its own; else pip. DIR is removed first.
# No bytecode is compiled at install: run the venv's Python without PYTHONDONTWRITEBYTECODE to keep it.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 NAME DIR [PACKAGE...]" >&2; exit 2; }
name=$1 dir=$2
shift 2
set_file="$(cd "$(dirname "$0")" && pwd)/$name.txt"
[ -f "$set_file" ] || { echo "venv.sh: no package set $set_file" >&2; exit 2; }
read -r -a here <<< "$(sed -n 's/^# here: //p' "$set_file")"
read -r -a here_python <<< "$(sed -n 's/^# here-python: //p' "$set_file")"
rm -rf "$dir"
python3 -m venv "$dir"
install=("$dir/bin/python" -m pip install --quiet --no-compile --disable-pip-version-check)
if command -v uv >/dev/null; then
    install=(env UV_FIND_LINKS="${UV_FIND_LINKS:-${PIP_FIND_LINKS:-}}" uv pip install --quiet --python "$dir/bin/python")
fi
here_constraints=$(sed -n 's/^# here-constraints: \([^ ]*\).*/\1/p' "$set_file")
"${install[@]}" -c "${here_constraints:+$(dirname "$0")/../../}${here_constraints:-$set_file}" "${here[@]}"
if [ $# -gt 0 ]; then
    "${install[@]}" -c "$set_file" "$@"
else
    "${install[@]}" --no-deps -r "$set_file" "${here_python[@]}"
fi
