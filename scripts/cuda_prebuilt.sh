#!/usr/bin/env bash
# The GPU machine's build, made here, so that a device call does not spend its first ~100 s compiling:
#   bash scripts/cuda_prebuilt.sh pack      (here: builds the CUDA targets and packs them into .prebuilt/)
#   bash scripts/cuda_prebuilt.sh unpack [TARGET...]   (there: puts them into build-gpu/ if they match
#                                           the tree and hold every TARGET named)
# Carry [".prebuilt"] alone: it holds the shared libraries the binaries take from .devdeps and zstd
# (source .prebuilt/env.sh there, then unpack); the tree (~38 MB), .devdeps (22 MB) and .prebuilt
# together pass the 64 MiB a call may carry.
#
# Why it is safe: the binaries are what the device would build from the same sources (the same nvcc,
# -DANVIL_CUDA_ARCHS=90a, Release, the CPU code without -march=native), and they run there against
# the same libraries (.prebuilt/env.sh, or .devdeps/env.sh). `pack` records a hash of every file under src/,
# tests/ and CMakeLists.txt; `unpack` recomputes it in the tree it runs in and refuses a pack made
# from other sources (exit 2: build instead). The test binaries find their data through the source
# directory compiled into them (ANVIL_SOURCE_DIR, ANVIL_TEST_DATA, ANVIL_SHARED_DIR = ../shared beside
# it); where the device's checkout is elsewhere, `unpack` links that path to it.
#
# PREBUILT_TARGETS  targets (default "anvil anvil_test_cuda anvil_test_model")
# PREBUILT_DIR      the build directory used here (default build-prebuilt; an existing CUDA build
#                   configured the same way, e.g. build, saves its compile time)
# PREBUILT_TRACE_DIR  also pack the anvil of this trace build (configured as cuda_ab_env.sh's
#                   build-gpu-t: -DCMAKE_CUDA_FLAGS=-DANVIL_CUDA_TRACE); unpacked into build-gpu-t/
# scripts/cuda_ab_env.sh takes the pack when it matches (then it builds nothing it was given).
set -euo pipefail
cd "$(dirname "$0")/.."
targets=${PREBUILT_TARGETS:-anvil anvil_test_cuda anvil_test_model}
out=.prebuilt

tree_hash() {
  find src tests CMakeLists.txt -type f -not -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 sha1sum |
    sha1sum | cut -d' ' -f1
}
# Where a target's binary lies in a build directory.
bin_path() { case $1 in anvil) echo anvil ;; *) echo "tests/$1" ;; esac; }

case ${1:-} in
  pack)
    dir=${PREBUILT_DIR:-build-prebuilt}
    dir=${dir#"$PWD"/}
    if [ ! -f "$dir/CMakeCache.txt" ]; then
      cmake -S . -B "$dir" -G Ninja -DANVIL_CUDA=ON -DANVIL_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release \
        -DANVIL_BUILD_BENCH=OFF > /dev/null
    fi
    grep -q '^ANVIL_CUDA_ARCHS:STRING=90a$' "$dir/CMakeCache.txt" &&
      grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$dir/CMakeCache.txt" &&
      ! grep -q '^ANVIL_NATIVE:BOOL=ON$' "$dir/CMakeCache.txt" ||
      { echo "$dir is not configured as the device builds (90a, Release, ANVIL_NATIVE off)" >&2; exit 1; }
    h=$(tree_hash)
    # The device's copy of the tree leaves git-ignored files out, so such files here would change its hash.
    if git status --ignored --short src tests CMakeLists.txt 2> /dev/null | grep -v '__pycache__' | grep -q '^!!'; then
      echo "warning: git-ignored files under src/ or tests/: the device's tree will not match this pack" >&2
    fi
    # shellcheck disable=SC2086
    cmake --build "$dir" -j"$(nproc)" --target $targets
    tdir=${PREBUILT_TRACE_DIR:-}
    if [ -n "$tdir" ]; then
      grep -q '^CMAKE_CUDA_FLAGS:STRING=-DANVIL_CUDA_TRACE$' "$tdir/CMakeCache.txt" &&
        grep -q '^ANVIL_CUDA_ARCHS:STRING=90a$' "$tdir/CMakeCache.txt" ||
        { echo "$tdir is not a trace build for 90a (-DCMAKE_CUDA_FLAGS=-DANVIL_CUDA_TRACE)" >&2; exit 1; }
      cmake --build "$tdir" -j"$(nproc)" --target anvil
    fi
    [ "$(tree_hash)" = "$h" ] || { echo "the sources changed during the build; pack again" >&2; exit 1; }
    rm -rf "$out" && mkdir -p "$out"
    # One archive with the paths they take on the device (build-gpu/, build-gpu-t/), compressed with a
    # long window: the trace build's anvil shares most of its bytes with the other (~4 MB saved).
    stage=$(mktemp -d)
    for t in $targets; do
      mkdir -p "$stage/build-gpu/$(dirname "$(bin_path "$t")")"
      strip -o "$stage/build-gpu/$(bin_path "$t")" "$dir/$(bin_path "$t")"
    done
    if [ -n "$tdir" ]; then
      mkdir -p "$stage/build-gpu-t" && strip -o "$stage/build-gpu-t/anvil" "$tdir/anvil"
    fi
    # With them, the shared libraries they take from .devdeps (into build-gpu/lib) and zstd, so that a
    # call can carry .prebuilt alone (the tree, .devdeps and .prebuilt together pass 64 MiB).
    if [ -d .devdeps/root ]; then
      mkdir -p "$stage/build-gpu/lib" "$out/bin"
      for t in $targets; do
        (source .devdeps/env.sh && ldd "$dir/$(bin_path "$t")") | awk '$3 ~ /\.devdeps\// {print $3}'
      done | sort -u | while read -r so; do cp -L "$so" "$stage/build-gpu/lib/"; done
      [ -x .devdeps/bin/zstd ] && cp .devdeps/bin/zstd "$out/bin/"
      cat > "$out/env.sh" << 'ENV'
# Source on the GPU machine when .devdeps is not carried: zstd for `unpack`, and the loader pointed at
# the libraries it puts into build-gpu/lib.
_p="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v zstd > /dev/null || export PATH="$_p/bin:$PATH"
export LD_LIBRARY_PATH="$(dirname "$_p")/build-gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ENV
    fi
    tar -C "$stage" -cf - build-gpu ${tdir:+build-gpu-t} | zstd -q -T0 -19 --long=27 -o "$out/bins.tar.zst"
    rm -rf "$stage"
    { echo "hash=$h"; echo "src=$PWD"; echo "targets=$targets"; echo "bindir=$dir"; echo "trace=${tdir:+1}"; } > "$out/stamp"
    du -sh "$out"
    ;;
  unpack)
    [ -f "$out/stamp" ] || { echo "no $out/stamp: nothing packed" >&2; exit 2; }
    h=$(sed -n 's/^hash=//p' "$out/stamp")
    src=$(sed -n 's/^src=//p' "$out/stamp")
    if [ "$(tree_hash)" != "$h" ]; then
      echo "$out was packed from other sources than this tree: build instead" >&2
      exit 2
    fi
    packed=$(sed -n 's/^targets=//p' "$out/stamp")
    for t in "${@:2}"; do
      [[ " $packed " == *" $t "* ]] || { echo "$out does not hold $t: build instead" >&2; exit 2; }
    done
    for z in .devdeps/bin/zstd "$out/bin/zstd"; do
      command -v zstd > /dev/null || { [ -x "$z" ] && export PATH="$PWD/$(dirname "$z"):$PATH"; }
    done
    zstd -q -d --long=27 -c "$out/bins.tar.zst" | tar -xf - || { echo "could not unpack $out/bins.tar.zst" >&2; exit 1; }
    if [ "$src" != "$PWD" ] && [ ! -e "$src" ]; then
      mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src" ||
        echo "warning: could not link $src to this tree: tests that read data will not find it" >&2
    fi
    [ "$(sed -n 's/^trace=//p' "$out/stamp")" = 1 ] && echo "prebuilt trace build unpacked into build-gpu-t/"
    # The tests run the anvil binary by the path compiled into them: the build directory used here.
    bindir=$(sed -n 's/^bindir=//p' "$out/stamp")
    if [ -n "$bindir" ] && [ "$bindir" != build-gpu ]; then
      if [ -L "$bindir" ] || [ ! -e "$bindir" ]; then
        rm -f "$bindir" && ln -s build-gpu "$bindir"
      else
        echo "warning: $bindir is a directory here: tests that run anvil will run the one in it" >&2
      fi
    fi
    echo "prebuilt $packed unpacked into build-gpu/"
    ;;
  *)
    echo "usage: $0 pack | unpack [TARGET...]" >&2
    exit 1
    ;;
esac
