#!/usr/bin/env bash
# Regenerate the package set NAME.txt of one Deep Learning Container from NAME.in (what its Dockerfile installs):
#   tests/images/compile.sh NAME DATE PYTHON        e.g. tests/images/compile.sh inference 2025-12-16 3.12
# Each unpinned install gets the version it resolved to on DATE (the build's day) for PYTHON on manylinux x86_64
# (`uv pip compile --exclude-newer`; uv comes from PyPI). The CUDA packages of PyPI's torch are dropped: the CPU and
# Neuron images have none. Packages named on the `# not-here:` line stay as comments (tests/images/venv.sh installs
# the `# here:` line instead); so do those whose version does not install on this machine's Python, each replaced
# on the generated `# here-python:` line by the version that resolves for it.
set -euo pipefail
name=$1 date=$2 python=$3
dir="$(cd "$(dirname "$0")" && pwd)"
uv=(uv)
command -v uv >/dev/null || uv=(python3 -m uv)
local_python=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
not_here=" $(sed -n 's/^# not-here: //p' "$dir/$name.in") "
resolve() {
    "${uv[@]}" pip compile "$dir/$name.in" --quiet --no-header --no-annotate --python-version "$1" \
        --python-platform x86_64-manylinux_2_28 --exclude-newer "$date" \
        --override <(printf 'kenlm ; sys_platform == "never"\n') | grep -vE '^(nvidia-|triton==)'
}
image=$(resolve "$python")
here=$(resolve "$local_python")
substitutes=()
body=$(while read -r line; do
    package=${line%%==*}
    local_line=$(grep -m1 "^$package==" <<< "$here" || true)
    if [[ "$not_here" == *" $package "* ]]; then
        echo "# $line  (not-here)"
    elif [ "$local_line" != "$line" ]; then
        echo "# $line  (Python $python: here ${local_line:-none})"
    else
        echo "$line"
    fi
done <<< "$image")
for line in $(grep -E '^# .* \(Python [0-9.]+: here [^ ]+==' <<< "$body" | sed -E 's/.*: here ([^)]+)\)$/\1/'); do
    substitutes+=("$line")
done
{
    sed -n '/^#/!q;p' "$dir/$name.in"
    [ ${#substitutes[@]} -eq 0 ] || echo "# here-python: ${substitutes[*]}"
    echo "# versions: tests/images/compile.sh $name $date $python (resolved, not read from the image)"
    echo "$body"
} > "$dir/$name.txt.new"
mv "$dir/$name.txt.new" "$dir/$name.txt"
