#!/usr/bin/env bash
# Build the dledger image with no registry of images or of Python packages inside the build:
#
#   deploy/build-image.sh [--tag dledger:local]          (as root: debootstrap needs it)
#
# 1. The base image: a Debian bookworm root file system made by debootstrap (minbase, with
#    Debian's Python 3.11, venv, pip and passwd), imported into the engine as
#    localhost/dledger-base:bookworm-<hash>, <hash> being of everything that makes it (this
#    recipe). An engine that already holds that tag skips the step.
# 2. The wheelhouse: wheels of the project's dependencies, and of what builds it (setuptools,
#    wheel), built on the host by pip (from the package index the host reaches), kept in the cache directory
#    under a hash of the dependencies and the Python version; an existing one is reused. The
#    host's Python must be the base's minor version (3.11): the wheels are for it.
# 3. The image: deploy/Dockerfile, built from the repository with BASE_IMAGE=the base and the
#    wheelhouse copied into deploy/wheelhouse/ for the build (pip install --no-index there).
#
# Environment:
#   DLEDGER_ENGINE       podman (default) or docker
#   DLEDGER_IMAGE_CACHE  the cache directory (default /var/cache/dledger-image), outside the
#                        checkout, so that fresh clones on one machine share it
#   PYTHON               the host's Python 3.11 that builds the wheelhouse (default python3)
#   DEBIAN_MIRROR        debootstrap's mirror (default https://deb.debian.org/debian)
#   CONTAINERS_CONF      podman's configuration (deploy/podman/containers.conf: see there)
# Prints the steps with their times, the image's tag and its size; exits 2 on a missing tool.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tag=dledger:local
while [ $# -gt 0 ]; do
    case $1 in
        --tag) tag=${2:?--tag needs a value}; shift 2 ;;
        --tag=*) tag=${1#--tag=}; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-image: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done

engine=${DLEDGER_ENGINE:-podman}
cache=${DLEDGER_IMAGE_CACHE:-/var/cache/dledger-image}
python=${PYTHON:-python3}
mirror=${DEBIAN_MIRROR:-https://deb.debian.org/debian}
suite=bookworm
variant=minbase
include=python3,python3-venv,python3-pip,passwd
recipe_version=1  # bump when the base is made differently

fail() {
    echo "build-image: $*" >&2
    exit 2
}
need() {
    command -v "$1" >/dev/null 2>&1 || fail "$1 is not installed ($2)"
}
started=$(date +%s)
step() {
    echo "build-image: $* ($(( $(date +%s) - started )) s)"
}

need "$engine" "install podman (apt-get install podman runc) or docker, or set DLEDGER_ENGINE"
need "$python" "set PYTHON to a Python 3.11 interpreter"
py_version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$py_version" = 3.11 ] || fail "$python is Python $py_version: the wheelhouse is built by the \
base's Python version, 3.11 (set PYTHON)"
mkdir -p "$cache"

# --- 1. the base image ---------------------------------------------------------------------------
base_hash=$(printf '%s\n' "$suite" "$variant" "$include" "$mirror" "$recipe_version" "$(uname -m)" \
    | sha256sum | cut -c1-16)
base=localhost/dledger-base:$suite-$base_hash
if "$engine" image inspect "$base" >/dev/null 2>&1; then
    step "base $base: cached"
else
    need debootstrap "apt-get install debootstrap"
    [ "$(id -u)" = 0 ] || fail "debootstrap makes the base as root only (the base is then cached)"
    rootfs=$(mktemp -d "$cache/rootfs.XXXXXX")
    trap 'rm -rf "$rootfs"' EXIT
    step "base $base: debootstrap $suite into $rootfs"
    debootstrap --variant="$variant" --include="$include" "$suite" "$rootfs" "$mirror" \
        > "$cache/debootstrap.log" 2>&1 || { tail -n 20 "$cache/debootstrap.log" >&2; fail "debootstrap failed"; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" --numeric-owner -c . | "$engine" import -q \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' - "$base" >/dev/null
    rm -rf "$rootfs"
    trap - EXIT
    step "base $base: imported"
fi

# --- 2. the wheelhouse ---------------------------------------------------------------------------
# What the image installs: the project's dependencies and what builds it (pyproject.toml), one a line
requirements=$("$python" - "$root/pyproject.toml" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    data = tomllib.load(f)
print("\n".join([*data["project"]["dependencies"], *data["build-system"]["requires"]]))
EOF
)
deps_hash=$(printf '%s\n' "$requirements" "$py_version" "$(uname -m)" | sha256sum | cut -c1-16)
wheels=$cache/wheelhouse-$deps_hash
if [ -d "$wheels" ]; then
    step "wheelhouse $wheels: cached"
else
    staging=$(mktemp -d "$cache/wheelhouse.XXXXXX")
    trap 'rm -rf "$staging"' EXIT
    step "wheelhouse: pip wheel into $staging"
    # (the project itself is built inside, from the copied source, by these setuptools and wheel)
    mapfile -t reqs <<< "$requirements"
    "$python" -m pip wheel -q -w "$staging" "${reqs[@]}"
    mv -T "$staging" "$wheels" 2>/dev/null || rm -rf "$staging"  # (another build made it first)
    trap - EXIT
    step "wheelhouse $wheels: built ($(ls "$wheels" | wc -l) wheels)"
fi

# --- 3. the image --------------------------------------------------------------------------------
house=$root/deploy/wheelhouse
# one build at a time uses deploy/wheelhouse/ (two at once linked each other's wheels away)
exec 9>"$cache/build.lock"
flock 9
cleanup_house() { rm -f "$house"/*.whl; }
trap cleanup_house EXIT
cleanup_house
cp -l "$wheels"/*.whl "$house"/ 2>/dev/null || cp "$wheels"/*.whl "$house"/
step "image $tag: building from $base"
"$engine" build -q -f "$root/deploy/Dockerfile" --build-arg "BASE_IMAGE=$base" -t "$tag" "$root" >/dev/null
cleanup_house
size_bytes=$("$engine" image inspect --format '{{.Size}}' "$tag")
step "image $tag: built, $(( size_bytes / 1024 / 1024 )) MiB ($size_bytes bytes)"
