// One KV page record: a self-describing safetensors blob, readable by any safetensors reader.
//
//   u64 header length | JSON header (space-padded to 8 bytes) | data
//   tensors  layer.<l>.k, layer.<l>.v : [n_kv_heads, n_tokens, head_dim] of the KV dtype, in the
//            order layer 0 k, layer 0 v, layer 1 k, ... (for a full page, the data section is the
//            pool page byte for byte: see KVCacheView)
//   metadata anvil.format = "kv-page", anvil.format_version, fingerprint, key, parent (32 hex),
//            first_pos, tokens ("1,2,3"), page_size, data_xxh3 (16 hex: XXH3-64 of the data section)
//
// The catalog keeps a second checksum, XXH3-64 of the whole record; page_record_check verifies both.
// A partial record (a session's tail page) has n_tokens < page_size and key = 0.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/hash128.h"
#include "base/status.h"

namespace anvil {

inline constexpr int kPageRecordVersion = 1;

struct PageLayout {
  DType dtype = DType::kBF16;
  int n_layers = 0, n_kv_heads = 0, head_dim = 0, page_size = 0;
  // Bytes of one (layer, k|v, head) row block holding n tokens.
  size_t block_bytes(int n) const { return size_t(n) * head_dim * dtype_size(dtype); }
  size_t n_blocks() const { return size_t(n_layers) * 2 * n_kv_heads; }
  size_t data_bytes(int n) const { return n_blocks() * block_bytes(n); }
};

struct PageMeta {
  Hash128 fingerprint, key, parent;
  int first_pos = 0;
  std::vector<int32_t> tokens;
};

// The record header (length prefix, JSON, padding) for `data` (data_bytes(meta.tokens.size())
// bytes, laid out as above). The record is header + data.
std::string page_record_header(const PageLayout& layout, const PageMeta& meta, const void* data, size_t data_bytes);

// The same header for data whose XXH3-64 is data_sum.
std::string page_record_header_for_sum(const PageLayout& layout, const PageMeta& meta, uint64_t data_sum);

// True when `hdr` (n bytes: the length prefix and the JSON) is byte for byte the header this
// version writes for `expected`, apart from the data checksum's 16 hex digits. The restore reads a
// record's data straight into a KV page, apart from its header, and checks the header this way
// instead of parsing it: a header that passes is one page_record_parse accepts with exactly the
// expected metadata and layout. One that does not (another writer's formatting) is parsed in full.
bool page_record_header_matches(const uint8_t* hdr, size_t n, const PageLayout& layout, const PageMeta& expected);

// XXH3-64 of a byte range (the catalog's record checksum).
uint64_t record_checksum(const void* data, size_t n);

// Parses and validates a whole record: safetensors structure, format and version, layout (tensor
// names, shapes, dtype), data checksum, and the fingerprint. Fills meta and points *data at the data
// section. `label` names the record in errors.
// check_data_sum=false skips the data checksum: for a reader that has just verified the catalog's
// checksum of the whole record, which covers the data too (one pass over the bytes instead of two).
Status page_record_parse(const uint8_t* rec, size_t n, const PageLayout& layout, const Hash128& fingerprint,
                         PageMeta* meta, const uint8_t** data, const std::string& label, bool check_data_sum = true);

// The layout a record was written with, read from its own header (for tools that run without a
// model: anvil kv verify/export).
Status page_record_layout(const uint8_t* rec, size_t n, PageLayout* layout, Hash128* fingerprint,
                          const std::string& label);

std::string tokens_to_string(std::span<const int32_t> ids);
bool tokens_from_string(const std::string& s, std::vector<int32_t>* out);

}  // namespace anvil
