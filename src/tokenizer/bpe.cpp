#include "tokenizer/bpe.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <queue>

#include "tokenizer/byte_level.h"

namespace anvil::tok {

namespace {

std::string join_path(const std::string& a, const std::string& b) { return a + "." + b; }

// Splits a merges entry: "a b" (the first space separates; tokens never contain a raw space) or ["a", "b"].
bool parse_merge(const nlohmann::json& m, std::string* a, std::string* b) {
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const size_t sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) return false;
    *a = s.substr(0, sp);
    *b = s.substr(sp + 1);
    return true;
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    *a = m[0].get<std::string>();
    *b = m[1].get<std::string>();
    return true;
  }
  return false;
}

}  // namespace

Result<std::unique_ptr<BpeModel>> BpeModel::from_json(const nlohmann::json& j, Alphabet alphabet, const std::string& path) {
  if (!j.is_object()) return invalid_argument(path + ": expected an object");
  if (!j.contains("type") || !j["type"].is_string())
    return invalid_argument(join_path(path, "type") + ": missing (expected \"BPE\")");
  if (j["type"] != "BPE")
    return unsupported(join_path(path, "type") + ": model \"" + j["type"].get<std::string>() + "\" is not supported (expected BPE)");
  const bool byte_fallback = j.contains("byte_fallback") && j["byte_fallback"].is_boolean() && j["byte_fallback"].get<bool>();
  if (byte_fallback && alphabet == Alphabet::kBytes)
    return unsupported(join_path(path, "byte_fallback") +
                       ": byte fallback together with a ByteLevel pre-tokenizer is not supported (expected false)");
  if (j.contains("dropout") && j["dropout"].is_number() && j["dropout"].get<double>() > 0)
    return unsupported(join_path(path, "dropout") + ": BPE dropout is not supported (expected null)");
  for (const char* f : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (j.contains(f) && j[f].is_string() && !j[f].get<std::string>().empty())
      return unsupported(join_path(path, f) + ": \"" + j[f].get<std::string>() + "\" is not supported (expected null or \"\")");
  if (!j.contains("vocab") || !j["vocab"].is_object())
    return invalid_argument(join_path(path, "vocab") + ": missing or not an object of token -> id");
  if (!j.contains("merges") || !j["merges"].is_array())
    return invalid_argument(join_path(path, "merges") + ": missing or not an array");

  auto m = std::make_unique<BpeModel>();
  m->cache_.reset(new CacheSlot[kCacheSlots]());  // zeroed: key_len 0 marks an empty slot
  m->alphabet_ = alphabet;
  m->byte_fallback_ = byte_fallback;
  m->ignore_merges_ = j.contains("ignore_merges") && j["ignore_merges"].is_boolean() && j["ignore_merges"].get<bool>();
  m->fuse_unk_ = j.contains("fuse_unk") && j["fuse_unk"].is_boolean() && j["fuse_unk"].get<bool>();
  const auto& vocab = j["vocab"];
  m->token_to_id_.reserve(vocab.size());
  m->bytes_to_id_.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0)
      return invalid_argument(join_path(path, "vocab") + "[\"" + it.key() + "\"]: expected a non-negative integer id");
    if (it.value().get<int64_t>() > kMaxTokenId)
      return invalid_argument(join_path(path, "vocab") + "[\"" + it.key() + "\"]: id " + it.value().dump() +
                              " is too large (at most " + std::to_string(kMaxTokenId) + ")");
    const int32_t id = it.value().get<int32_t>();
    if (size_t(id) >= m->id_to_token_.size()) m->id_to_token_.resize(size_t(id) + 1);
    m->id_to_token_[id] = it.key();
    m->token_to_id_[it.key()] = id;
    if (alphabet == Alphabet::kBytes)
      if (auto bytes = byte_level_to_bytes(it.key())) m->bytes_to_id_[*bytes] = id;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = m->bytes_to_id_.find(std::string(1, char(b)));
    m->byte_id_[b] = it == m->bytes_to_id_.end() ? -1 : it->second;
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);  // tokenizers' format!("<{b:#04X}>")
    auto f = m->token_to_id_.find(name);
    m->fallback_id_[b] = f == m->token_to_id_.end() ? -1 : f->second;
  }
  for (int c = 0; c < 128; ++c) {
    auto it = m->token_to_id_.find(std::string(1, char(c)));
    m->ascii_id_[c] = it == m->token_to_id_.end() ? -1 : it->second;
  }
  if (j.contains("unk_token") && j["unk_token"].is_string()) {
    auto it = m->token_to_id_.find(j["unk_token"].get<std::string>());
    if (it == m->token_to_id_.end())
      return invalid_argument(join_path(path, "unk_token") + ": \"" + j["unk_token"].get<std::string>() + "\" is not in the vocab");
    m->unk_id_ = it->second;
  }

  const auto& merges = j["merges"];
  size_t cap = 16;
  while (cap < merges.size() * 2) cap <<= 1;
  m->merges_.assign(cap, MergeEntry{0, 0, 0});
  m->merge_mask_ = cap - 1;
  std::string a, b;
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string where = join_path(path, "merges") + "[" + std::to_string(r) + "]";
    if (!parse_merge(merges[r], &a, &b))
      return invalid_argument(where + ": expected \"left right\" or [\"left\", \"right\"]");
    auto ia = m->token_to_id_.find(a), ib = m->token_to_id_.find(b), iab = m->token_to_id_.find(a + b);
    if (ia == m->token_to_id_.end()) return invalid_argument(where + ": token \"" + a + "\" is not in the vocab");
    if (ib == m->token_to_id_.end()) return invalid_argument(where + ": token \"" + b + "\" is not in the vocab");
    if (iab == m->token_to_id_.end()) return invalid_argument(where + ": merged token \"" + a + b + "\" is not in the vocab");
    // A repeated pair keeps its last rank, as tokenizers' merge map does.
    m->insert_merge(ia->second, ib->second, int32_t(r), iab->second);
  }
  return m;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = token_to_id_.find(std::string(token));
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

const BpeModel::MergeEntry* BpeModel::find_merge(int32_t a, int32_t b) const {
  const uint64_t key = merge_key(a, b);
  uint64_t h = (key * 0x9E3779B97F4A7C15ull) >> 17;
  for (;; ++h) {
    const MergeEntry& e = merges_[h & merge_mask_];
    if (e.key == key) return &e;
    if (e.key == 0) return nullptr;
  }
}

void BpeModel::insert_merge(int32_t a, int32_t b, int32_t rank, int32_t new_id) {
  const uint64_t key = merge_key(a, b);
  uint64_t h = (key * 0x9E3779B97F4A7C15ull) >> 17;
  for (;; ++h) {
    MergeEntry& e = merges_[h & merge_mask_];
    if (e.key == 0 || e.key == key) {
      e = MergeEntry{key, rank, new_id};
      return;
    }
  }
}

// Applies merges to `syms` in the order Hugging Face does: always the lowest-rank adjacent pair,
// the leftmost one on ties, until no adjacent pair has a merge.
void BpeModel::merge_symbols(std::vector<int32_t>& syms) const {
  if (syms.size() < 2) return;
  if (syms.size() <= 32) {
    // Short words: keep each adjacent pair's merge (or null) in a small array and rescan it for the
    // minimum rank; a merge only changes the two pairs around it.
    const MergeEntry* pair[32];
    size_t n = syms.size();
    for (size_t i = 0; i + 1 < n; ++i) pair[i] = find_merge(syms[i], syms[i + 1]);
    for (;;) {
      int32_t best_rank = INT32_MAX;
      size_t best_i = SIZE_MAX;
      for (size_t i = 0; i + 1 < n; ++i)
        if (pair[i] && pair[i]->rank < best_rank) {
          best_rank = pair[i]->rank;
          best_i = i;
        }
      if (best_i == SIZE_MAX) break;
      syms[best_i] = pair[best_i]->new_id;
      for (size_t k = best_i + 1; k + 1 < n; ++k) {
        syms[k] = syms[k + 1];
        pair[k] = k + 2 < n ? pair[k + 1] : nullptr;
      }
      --n;
      if (best_i > 0) pair[best_i - 1] = find_merge(syms[best_i - 1], syms[best_i]);
      if (best_i + 1 < n) pair[best_i] = find_merge(syms[best_i], syms[best_i + 1]);
    }
    syms.resize(n);
    return;
  }
  // Long words: a doubly linked list over symbols and a min-heap of candidate pairs keyed by
  // (rank, position); stale candidates are skipped when popped.
  const int n = int(syms.size());
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push_pair = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    if (const MergeEntry* e = find_merge(syms[i], syms[next[i]])) heap.push({e->rank, i, e->new_id});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (!alive[c.pos] || next[c.pos] < 0) continue;
    const int r = next[c.pos];
    const MergeEntry* e = find_merge(syms[c.pos], syms[r]);
    if (!e || e->new_id != c.new_id || e->rank != c.rank) continue;
    syms[c.pos] = c.new_id;
    alive[r] = false;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    push_pair(prev[c.pos]);
    push_pair(c.pos);
  }
  std::vector<int32_t> outv;
  for (int i = 0; i >= 0; i = next[i]) outv.push_back(syms[i]);
  syms.swap(outv);
}

bool BpeModel::cache_get(uint64_t h, std::string_view word, std::vector<int32_t>& out) const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  const CacheSlot& s = cache_[h & (kCacheSlots - 1)];
  if (s.hash != h || s.key_len != word.size() || std::memcmp(s.key, word.data(), word.size()) != 0) return false;
  out.insert(out.end(), s.ids, s.ids + s.n_ids);
  return true;
}

void BpeModel::cache_put(uint64_t h, std::string_view word, const std::vector<int32_t>& ids) const {
  if (ids.size() > kSlotIds) return;
  std::lock_guard<std::mutex> lock(cache_mu_);
  CacheSlot& s = cache_[h & (kCacheSlots - 1)];
  s.hash = h;
  s.key_len = uint8_t(word.size());
  std::memcpy(s.key, word.data(), word.size());
  s.n_ids = uint8_t(ids.size());
  std::copy(ids.begin(), ids.end(), s.ids);
}

// Builds the initial symbols of a kChars word as tokenizers' BPE::merge_word does. A pending unk
// is flushed before the next in-vocab scalar but not before byte-fallback tokens (tokenizers'
// order, kept for exactness; it only matters when some "<0xNN>" tokens are missing).
void BpeModel::initial_char_symbols(std::string_view word, std::vector<int32_t>& syms) const {
  int32_t pending_unk = -1;
  for (size_t i = 0; i < word.size();) {
    int32_t id = -1;
    size_t n = 1;
    const unsigned char c = uint8_t(word[i]);
    if (c < 0x80) {
      id = ascii_id_[c];
    } else {
      uint32_t cp;
      n = utf8_decode_one(word, i, &cp);
      if (n == 0) n = 1;  // invalid UTF-8 cannot reach here (the tokenizer repairs input); one byte at a time
      auto it = token_to_id_.find(std::string(word.substr(i, n)));
      if (it != token_to_id_.end()) id = it->second;
    }
    if (id >= 0) {
      if (pending_unk >= 0) syms.push_back(pending_unk);
      pending_unk = -1;
      syms.push_back(id);
    } else {
      bool fell_back = false;
      if (byte_fallback_) {
        fell_back = true;
        for (size_t k = 0; k < n; ++k) fell_back = fell_back && fallback_id_[uint8_t(word[i + k])] >= 0;
        if (fell_back)
          for (size_t k = 0; k < n; ++k) syms.push_back(fallback_id_[uint8_t(word[i + k])]);
      }
      if (!fell_back && unk_id_) {
        if (pending_unk >= 0 && !fuse_unk_) syms.push_back(pending_unk);
        pending_unk = *unk_id_;
      }
      // else: no token, no fallback, no unk: tokenizers drops the scalar too
    }
    i += n;
  }
  if (pending_unk >= 0) syms.push_back(pending_unk);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const auto& table = alphabet_ == Alphabet::kBytes ? bytes_to_id_ : token_to_id_;
    auto it = table.find(std::string(word));
    if (it != table.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (alphabet_ == Alphabet::kBytes && word.size() == 1 && byte_id_[uint8_t(word[0])] >= 0) {
    out.push_back(byte_id_[uint8_t(word[0])]);
    return;
  }
  const bool cacheable = word.size() <= kSlotKey;
  const uint64_t h = cacheable ? XXH3_64bits(word.data(), word.size()) : 0;
  if (cacheable && cache_get(h, word, out)) return;
  std::vector<int32_t> syms;
  syms.reserve(word.size());
  if (alphabet_ == Alphabet::kChars) {
    initial_char_symbols(word, syms);
  } else {
    int32_t pending_unk = -1;  // as in initial_char_symbols, with bytes for scalars
    for (unsigned char c : word) {
      if (byte_id_[c] >= 0) {
        if (pending_unk >= 0) syms.push_back(pending_unk);
        pending_unk = -1;
        syms.push_back(byte_id_[c]);
      } else if (unk_id_) {
        if (pending_unk >= 0 && !fuse_unk_) syms.push_back(pending_unk);
        pending_unk = *unk_id_;
      }
      // else: no token for this byte and no unk token; tokenizers drops it too
    }
    if (pending_unk >= 0) syms.push_back(pending_unk);
  }
  merge_symbols(syms);
  out.insert(out.end(), syms.begin(), syms.end());
  if (cacheable) cache_put(h, word, syms);
}

}  // namespace anvil::tok
