// The BPE model of a tokenizer.json ("model": {"type": "BPE", ...}), in one of two alphabets:
//  - kBytes (byte-level BPE: GPT-2, Llama 3, Qwen): vocab keys are also stored as raw bytes (the
//    GPT-2 byte->unicode mapping is undone at load), so a pre-token is encoded straight from its
//    bytes, each byte one initial symbol.
//  - kChars (SentencePiece-style BPE: Llama 2, Mistral, Mixtral): each Unicode scalar of the
//    pre-token is one initial symbol, looked up as written in the vocab; a scalar that is not in
//    the vocab becomes its UTF-8 bytes as "<0xNN>" tokens (byte_fallback) or the unk token (fused
//    with an adjacent unk when fuse_unk), exactly as tokenizers' BPE::merge_word does.
// Every merge (a, b) is stored by the ids of a and b with its rank (position in "merges") and the
// id of a+b; merging is the same for both alphabets.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace anvil::tok {

// The largest token id a tokenizer.json may use: the id tables are dense arrays indexed by id, so an
// id far beyond any real vocabulary (the largest are ~260k) would ask for gigabytes; it is refused.
inline constexpr int64_t kMaxTokenId = (int64_t(1) << 24) - 1;

class BpeModel {
 public:
  enum class Alphabet { kBytes, kChars };
  static Result<std::unique_ptr<BpeModel>> from_json(const nlohmann::json& model, Alphabet alphabet,
                                                     const std::string& path = "model");

  // Appends the ids of one pre-token (valid UTF-8 for kChars). Thread-safe.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  // Vocab entries as written in tokenizer.json ("Ġhello"), by id; empty for unused ids.
  const std::vector<std::string>& id_to_token() const { return id_to_token_; }
  std::optional<int32_t> token_to_id(std::string_view token) const;

 private:
  struct MergeEntry {
    uint64_t key;  // (left id << 32) | right id; 0 = empty slot (ids are never both 0 in a used key: see merge_key)
    int32_t rank, new_id;
  };
  static uint64_t merge_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a) + 1) << 32) | uint32_t(b); }
  const MergeEntry* find_merge(int32_t a, int32_t b) const;
  void insert_merge(int32_t a, int32_t b, int32_t rank, int32_t new_id);
  void merge_symbols(std::vector<int32_t>& syms) const;
  void initial_char_symbols(std::string_view word, std::vector<int32_t>& syms) const;

  std::unordered_map<std::string, int32_t> bytes_to_id_;  // raw bytes -> id
  std::unordered_map<std::string, int32_t> token_to_id_;  // as written in tokenizer.json -> id
  std::vector<std::string> id_to_token_;
  Alphabet alphabet_ = Alphabet::kBytes;
  int32_t byte_id_[256];           // kBytes: id of each single byte, -1 if absent
  int32_t ascii_id_[128];          // kChars: id of each ASCII character, -1 if absent
  int32_t fallback_id_[256];       // kChars with byte_fallback: id of "<0xNN>", -1 if absent
  bool byte_fallback_ = false;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::vector<MergeEntry> merges_;  // open addressing, power-of-two size, linear probing
  uint64_t merge_mask_ = 0;

  // Pre-token -> ids cache: a direct-mapped table of one-cache-line slots (a lookup costs one
  // memory access; a big node-based map costs three misses, more than a short word's merges).
  // Words longer than kSlotKey bytes or with more than kSlotIds ids are not cached.
  static constexpr size_t kSlotKey = 23, kSlotIds = 7, kCacheSlots = size_t(1) << 16;
  struct alignas(64) CacheSlot {
    uint64_t hash;
    uint8_t key_len;  // 0 = empty
    char key[kSlotKey];
    uint8_t n_ids;
    int32_t ids[kSlotIds];
  };
  bool cache_get(uint64_t h, std::string_view word, std::vector<int32_t>& out) const;
  void cache_put(uint64_t h, std::string_view word, const std::vector<int32_t>& ids) const;
  mutable std::mutex cache_mu_;
  mutable std::unique_ptr<CacheSlot[]> cache_;
};

}  // namespace anvil::tok
