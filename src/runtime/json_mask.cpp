#include "runtime/json_mask.h"

#include <algorithm>
#include <numeric>

namespace anvil {

Result<std::shared_ptr<const JsonVocab>> JsonVocab::create(const std::vector<std::string>& token_bytes, int vocab,
                                                           std::vector<int32_t> eos_ids) {
  if (vocab <= 0) return invalid_argument("JSON mode: the vocabulary is empty");
  auto v = std::make_shared<JsonVocab>();
  v->vocab_ = vocab;
  v->bytes_.assign(size_t(vocab), std::string());
  for (size_t id = 0; id < token_bytes.size() && id < size_t(vocab); ++id) v->bytes_[id] = token_bytes[id];
  std::sort(eos_ids.begin(), eos_ids.end());
  eos_ids.erase(std::unique(eos_ids.begin(), eos_ids.end()), eos_ids.end());
  std::erase_if(eos_ids, [vocab](int32_t id) { return id < 0 || id >= vocab; });
  if (eos_ids.empty())
    return invalid_argument("JSON mode needs an end-of-sequence token to end the reply once the object is closed, "
                            "and this model has none in its vocabulary");
  for (int32_t id : eos_ids) v->bytes_[size_t(id)].clear();  // never inside the JSON
  v->eos_ = std::move(eos_ids);

  // The trie in preorder: the byte strings sorted (std::string orders bytes as unsigned), each one
  // adding the nodes past its common prefix with the previous one.
  std::vector<int32_t> order;
  for (int32_t id = 0; id < vocab; ++id)
    if (!v->bytes_[size_t(id)].empty()) order.push_back(id);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return v->bytes_[size_t(a)] < v->bytes_[size_t(b)]; });
  std::vector<int32_t> path;  // node indices of the previous string
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = v->bytes_[size_t(id)];
    if (s.size() > 65535) return invalid_argument("JSON mode: token " + std::to_string(id) + " is too long");
    size_t common = 0;
    if (prev)
      while (common < prev->size() && common < s.size() && (*prev)[common] == s[common]) ++common;
    while (path.size() > common) {
      v->nodes_[size_t(path.back())].end = int32_t(v->nodes_.size());
      path.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      const int32_t n = int32_t(v->ids_.size());
      v->nodes_.push_back({uint8_t(s[d]), uint16_t(d + 1), 0, n, n});
      path.push_back(int32_t(v->nodes_.size() - 1));
    }
    v->ids_.push_back(id);
    v->nodes_[size_t(path.back())].ids_end = int32_t(v->ids_.size());
    v->max_len_ = std::max(v->max_len_, int(s.size()));
    prev = &s;
  }
  for (int32_t n : path) v->nodes_[size_t(n)].end = int32_t(v->nodes_.size());

  v->all_but_eos_.assign(v->words(), ~uint64_t(0));
  if (vocab % 64) v->all_but_eos_.back() = (uint64_t(1) << (vocab % 64)) - 1;
  for (int32_t id : v->eos_) v->all_but_eos_[size_t(id) / 64] &= ~(uint64_t(1) << (id % 64));
  return std::shared_ptr<const JsonVocab>(std::move(v));
}

int64_t JsonVocab::allowed(const JsonAutomaton& s, std::vector<uint64_t>* mask) const {
  mask->assign(words(), 0);
  if (s.complete()) return 0;
  std::vector<JsonAutomaton> st(size_t(max_len_) + 1);
  st[0] = s;
  int64_t n = 0;
  const size_t count = nodes_.size();
  for (size_t i = 0; i < count;) {
    const Node& nd = nodes_[i];
    JsonAutomaton& cur = st[nd.depth];
    cur = st[nd.depth - 1];
    if (!cur.push(nd.byte)) {
      i = size_t(nd.end);  // no token below this byte can be valid
      continue;
    }
    for (int32_t k = nd.ids_begin; k < nd.ids_end; ++k) {
      const int32_t id = ids_[size_t(k)];
      (*mask)[size_t(id) / 64] |= uint64_t(1) << (id % 64);
      ++n;
    }
    ++i;
  }
  return n;
}

const std::vector<uint64_t>& JsonConstraint::allowed() {
  if (state_.complete()) {
    if (eos_mask_.empty()) {
      eos_mask_.assign(vocab_->words(), 0);
      for (int32_t id : vocab_->eos_ids()) eos_mask_[size_t(id) / 64] |= uint64_t(1) << (id % 64);
    }
    return eos_mask_;
  }
  ++clock_;
  for (Cached& c : cache_)
    if (c.state == state_) {
      c.used = clock_;
      return c.mask;
    }
  Cached* slot;
  if (cache_.size() < kCacheSize) {
    cache_.emplace_back();
    slot = &cache_.back();
  } else {
    slot = &*std::min_element(cache_.begin(), cache_.end(),
                              [](const Cached& a, const Cached& b) { return a.used < b.used; });
  }
  slot->state = state_;
  slot->used = clock_;
  vocab_->allowed(state_, &slot->mask);
  return slot->mask;
}

bool JsonConstraint::accept(int32_t id) {
  if (id < 0 || id >= vocab_->vocab()) return false;
  if (state_.complete()) return false;  // only an end-of-sequence id may follow; it ends the reply
  const std::string& b = vocab_->bytes(id);
  if (b.empty()) return false;
  JsonAutomaton next = state_;
  if (!next.push(b)) return false;
  state_ = next;
  return true;
}

}  // namespace anvil
