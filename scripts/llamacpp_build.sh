# Sourced by scripts/bench_llamacpp.sh and scripts/bench_llamacpp_moe.sh (not run on its own): gets
# llama.cpp's sources and builds llama-bench and llama-quantize for this CPU.
#
# In: WORK (a work directory). Out: SRC (llama.cpp's source tree), BIN (its build/bin).
# The sources come from the llama-cpp-python source distribution on PyPI (it carries llama.cpp);
# an sdist already in $WORK is used as it is. The build is -march=native (GGML_NATIVE), under `nice`
# because the machine may be shared; the benchmarks themselves run at normal priority.
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [ ! -d "$SRC" ]; then
  [ -f "$WORK/llama_cpp_python-$VERSION.tar.gz" ] ||
    python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK"
  tar xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
fi
BIN="$SRC/build/bin"
if [ ! -x "$BIN/llama-bench" ] || [ ! -x "$BIN/llama-quantize" ]; then
  cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF >/dev/null
  nice cmake --build "$SRC/build" -j"$(nproc)" --target llama-bench llama-quantize
fi
