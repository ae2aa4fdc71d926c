#!/usr/bin/env bash
# Builds real llama.cpp (llama-server and the ggml RPC server) from the copy vendored in the
# llama-cpp-python sdist on PyPI, pinned by version and sha256, and caches the static binaries
# in a directory keyed by that hash plus the build flags. A warm machine skips the build.
#
# Prints the bin directory on stdout (last line); progress goes to stderr.
# Environment: LLMFLEET_CACHE (default /var/cache/llmfleet), LLAMA_CPP_JOBS (default 2).
set -euo pipefail

SDIST_NAME=llama-cpp-python
SDIST_VERSION=0.3.36
SDIST_FILE=llama_cpp_python-${SDIST_VERSION}.tar.gz
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# Static, CPU-portable, no network at build time (the prebuilt web UI would be downloaded
# otherwise), RPC backend on so ranks above 0 can run the RPC server.
CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF
    -DGGML_RPC=ON
    -DGGML_NATIVE=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
)
# Target names read from the vendored source: tools/server (llama-server) and
# tools/rpc/CMakeLists.txt (set(TARGET ggml-rpc-server)); older llama.cpp called it rpc-server.
TARGETS=(llama-server ggml-rpc-server)

cache_root=${LLMFLEET_CACHE:-/var/cache/llmfleet}
jobs=${LLAMA_CPP_JOBS:-2}
key=$(printf '%s\n' "$SDIST_SHA256" "${CMAKE_FLAGS[@]}" "${TARGETS[@]}" | sha256sum | cut -c1-16)
prefix=$cache_root/llama.cpp-$key
bin=$prefix/bin

log() { printf 'build-llama-cpp: %s\n' "$*" >&2; }

if [ -x "$bin/llama-server" ] && [ -x "$bin/ggml-rpc-server" ]; then
    log "cached: $bin"
    echo "$bin"
    exit 0
fi

mkdir -p "$cache_root/downloads"
exec 9>"$prefix.lock"
flock 9   # another run building the same key: wait for it, then reuse its result
if [ -x "$bin/llama-server" ] && [ -x "$bin/ggml-rpc-server" ]; then
    log "cached (built meanwhile): $bin"
    echo "$bin"
    exit 0
fi

for tool in cmake g++ make; do
    command -v "$tool" >/dev/null 2>&1 || need_apt=1
done
if [ "${need_apt:-0}" = 1 ]; then
    log "installing build tools (cmake, g++, make)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq cmake g++ make >/dev/null
fi

sdist=$cache_root/downloads/$SDIST_FILE
verify() { echo "$SDIST_SHA256  $1" | sha256sum --check --status; }
if ! { [ -f "$sdist" ] && verify "$sdist"; }; then
    log "downloading $SDIST_NAME==$SDIST_VERSION sdist"
    dl=$(mktemp -d "$cache_root/downloads/tmp.XXXXXX")
    # The file named by PyPI's simple index (its JSON form); pip download as the fallback
    # (it also prepares the sdist's metadata, minutes of work we do not need).
    python3 - "$SDIST_NAME" "$SDIST_FILE" "$dl" <<'PY' >&2 ||
import json, sys, urllib.request
name, filename, dest = sys.argv[1:]
req = urllib.request.Request(f"https://pypi.org/simple/{name}/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
with urllib.request.urlopen(req, timeout=60) as r:
    files = json.load(r)["files"]
url = next(f["url"] for f in files if f["filename"] == filename)
urllib.request.urlretrieve(url, f"{dest}/{filename}")
PY
        python3 -m pip download -q --no-binary :all: --no-deps "$SDIST_NAME==$SDIST_VERSION" -d "$dl" >&2
    if ! verify "$dl/$SDIST_FILE"; then
        log "sha256 mismatch for $SDIST_FILE: refusing to build"
        rm -rf "$dl"
        exit 1
    fi
    mv "$dl/$SDIST_FILE" "$sdist"
    rm -rf "$dl"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/llama-cpp-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
log "extracting vendored llama.cpp"
tar -xzf "$sdist" -C "$work" "llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp"
src=$work/llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp

start=$(date +%s)
log "configuring (${CMAKE_FLAGS[*]})"
nice -n 10 cmake -S "$src" -B "$work/build" "${CMAKE_FLAGS[@]}" >"$work/cmake.log" 2>&1 ||
    { tail -n 40 "$work/cmake.log" >&2; exit 1; }
log "building ${TARGETS[*]} with -j$jobs"
nice -n 10 cmake --build "$work/build" --target "${TARGETS[@]}" -j"$jobs" >"$work/build.log" 2>&1 ||
    { tail -n 40 "$work/build.log" >&2; exit 1; }

staging=$(mktemp -d "$cache_root/llama.cpp-$key.tmp.XXXXXX")
mkdir -p "$staging/bin"
for target in "${TARGETS[@]}"; do
    install -m 0755 "$work/build/bin/$target" "$staging/bin/$target"
done
rm -rf "$prefix"
mv "$staging" "$prefix"
chmod 0755 "$prefix"
log "built in $(( $(date +%s) - start ))s: $bin"
echo "$bin"
