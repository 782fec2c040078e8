// The Qwen3 tokenizer built into the binary (for --synthetic models and `anvil synth`), so a moved
// or installed anvil needs no source tree. The build compresses tests/data/tokenizer/qwen3/*.json
// with zstd (CMakeLists.txt) and `.incbin`s the result here (~1.9 MB for 11 MB of JSON). On first
// use the files are unpacked once into a cache directory named after their content hash, because
// the tokenizer and chat-template code, and synth's copy, take a directory:
//   $XDG_CACHE_HOME/anvil/tokenizer-qwen3-<hash>/   (else ~/.cache/anvil/..., else $TMPDIR/anvil-<uid>/...)
// Files are written under a temporary name and renamed, so concurrent first runs never see half a file.
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "model/loader.h"

#ifndef ANVIL_EMBED_DIR
#error "ANVIL_EMBED_DIR (the build directory holding the compressed tokenizer) must be defined"
#endif

#define ANVIL_EMBED(sym, file)                                                   \
  asm(".section .rodata\n.balign 16\n.global " #sym "_begin\n" #sym "_begin:\n" \
      ".incbin \"" ANVIL_EMBED_DIR "/" file "\"\n.global " #sym "_end\n" #sym "_end:\n.previous\n");
ANVIL_EMBED(anvil_qwen3_tokenizer_json, "tokenizer.json.zst")
ANVIL_EMBED(anvil_qwen3_tokenizer_config_json, "tokenizer_config.json.zst")

extern "C" const char anvil_qwen3_tokenizer_json_begin[], anvil_qwen3_tokenizer_json_end[];
extern "C" const char anvil_qwen3_tokenizer_config_json_begin[], anvil_qwen3_tokenizer_config_json_end[];

namespace anvil {
namespace {

namespace fs = std::filesystem;

struct Embedded {
  const char* name;
  const char* begin;
  const char* end;
};
const Embedded kFiles[] = {
    {"tokenizer.json", anvil_qwen3_tokenizer_json_begin, anvil_qwen3_tokenizer_json_end},
    {"tokenizer_config.json", anvil_qwen3_tokenizer_config_json_begin, anvil_qwen3_tokenizer_config_json_end},
};

fs::path cache_root() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return fs::path(x) / "anvil";
  if (const char* h = std::getenv("HOME"); h && *h) return fs::path(h) / ".cache" / "anvil";
  std::error_code ec;
  return fs::temp_directory_path(ec) / ("anvil-" + std::to_string(getuid()));
}

// Decompresses one embedded file to `path` (unless it is already there, whole).
bool unpack(const Embedded& f, const fs::path& path) {
  const size_t csize = size_t(f.end - f.begin);
  const unsigned long long size = ZSTD_getFrameContentSize(f.begin, csize);
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN) return false;
  std::error_code ec;
  if (fs::file_size(path, ec) == size && !ec) return true;
  std::string data(size, '\0');
  if (ZSTD_decompress(data.data(), data.size(), f.begin, csize) != size) return false;
  const fs::path tmp = path.string() + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out.write(data.data(), std::streamsize(data.size())) || !out.flush()) return false;
  }
  fs::rename(tmp, path, ec);
  if (ec) fs::remove(tmp, ec);
  return !ec;
}

std::string unpack_all() {
  XXH64_hash_t h = 0;
  for (const Embedded& f : kFiles) h = XXH64(f.begin, size_t(f.end - f.begin), h);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  for (const fs::path& root : {cache_root(), fs::temp_directory_path() / ("anvil-" + std::to_string(getuid()))}) {
    const fs::path dir = root / (std::string("tokenizer-qwen3-") + hex);
    std::error_code ec;
    fs::create_directories(dir, ec);
    bool ok = !ec;
    for (const Embedded& f : kFiles) ok = ok && unpack(f, dir / f.name);
    if (ok) return dir.string();
  }
  return "";
}

}  // namespace

std::string default_tokenizer_dir() {
  static const std::string dir = unpack_all();
  return dir;
}

}  // namespace anvil
