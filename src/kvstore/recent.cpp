// KVStore::recent_prefixes: which stored prefixes a restarted server loads first (Engine::
// warm_from_store). Read from the catalog alone; no record is opened here (the restore that
// follows checks every byte, invariant 3).
//
// A prefix is a chain of full pages from this model's root: the pages whose `fingerprint` is this
// store's, the first with a zero parent at position 0, each next one's parent the previous key at
// the next page's position. Leaves (pages no other page names as parent) end chains; the most
// recently used leaves come first (last_used: written, or restored). Only the most recently used
// rows are scanned (a few times the page budget); an ancestor older than those is looked up by
// its key. A chain with a missing link is skipped: what is above the gap ends in a leaf of its own.
#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "kvstore/kvstore.h"

namespace anvil {

namespace {

struct Row {
  Hash128 parent;
  int first_pos = 0;
  std::vector<int32_t> tokens;
};

}  // namespace

std::vector<std::vector<int32_t>> KVStore::recent_prefixes(size_t max_pages) {
  std::vector<std::vector<int32_t>> out;
  if (!writer_ || max_pages == 0) return out;
  const int P = layout_.page_size;
  const size_t tok_bytes = size_t(P) * sizeof(int32_t);
  std::unordered_map<Hash128, Row, Hash128Hasher> rows;
  std::vector<Hash128> order;  // scanned rows, most recently used first
  {
    SqliteStmt q;
    if (!q.prepare(db_, "SELECT key, parent, first_pos, tokens FROM pages WHERE fingerprint = ? "
                        "ORDER BY last_used DESC LIMIT ?")
             .is_ok())
      return out;
    q.bind(1, fingerprint_);
    q.bind(2, int64_t(std::min<size_t>(max_pages * 4 + 64, size_t(1) << 20)));
    while (true) {
      auto r = q.step();
      if (!r.is_ok() || !*r) break;
      if (q.col_bytes(0) != sizeof(Hash128) || q.col_bytes(3) != tok_bytes) continue;  // not a full page of ours
      Row row;
      row.parent = q.col_hash(1);
      row.first_pos = int(q.col_int(2));
      row.tokens.resize(size_t(P));
      std::memcpy(row.tokens.data(), q.col_blob(3), tok_bytes);
      const Hash128 key = q.col_hash(0);
      if (rows.emplace(key, std::move(row)).second) order.push_back(key);
    }
  }
  std::unordered_set<Hash128, Hash128Hasher> parents;
  for (auto& [k, r] : rows) parents.insert(r.parent);
  // An ancestor outside the scanned rows: by its key (q_page_: parent, tokens, ..., first_pos).
  auto fetch = [&](const Hash128& key) -> const Row* {
    auto it = rows.find(key);
    if (it != rows.end()) return &it->second;
    q_page_.bind(1, key);
    auto r = q_page_.step();
    const Row* found = nullptr;
    if (r.is_ok() && *r && q_page_.col_bytes(1) == tok_bytes) {
      Row row;
      row.parent = q_page_.col_hash(0);
      row.tokens.resize(size_t(P));
      std::memcpy(row.tokens.data(), q_page_.col_blob(1), tok_bytes);
      row.first_pos = int(q_page_.col_int(6));
      found = &rows.emplace(key, std::move(row)).first->second;
    }
    q_page_.reset();
    return found;
  };
  std::unordered_set<Hash128, Hash128Hasher> taken;  // pages some chosen prefix already holds
  size_t budget = max_pages;
  for (const Hash128& leaf : order) {
    if (budget == 0) break;
    if (parents.count(leaf)) continue;  // not a leaf: its chain continues in a child
    // Walk up to the root; every link must hold (positions step down by P to 0).
    std::vector<const Row*> chain;
    Hash128 key = leaf;
    bool ok = true;
    for (const Row* r = fetch(key);; r = fetch(key)) {
      const bool linked = r && r->first_pos >= 0 && r->first_pos % P == 0 &&
                          (chain.empty() || r->first_pos == chain.back()->first_pos - P);
      if (!linked) {
        ok = false;
        break;
      }
      chain.push_back(r);
      if (r->parent.is_zero()) {
        ok = r->first_pos == 0;
        break;
      }
      key = r->parent;
    }
    if (!ok || chain.empty()) continue;
    std::reverse(chain.begin(), chain.end());  // root first
    // Keys root first, to count the pages not yet taken; a prefix over budget is cut short.
    std::vector<Hash128> keys(chain.size());
    keys.back() = leaf;
    for (size_t i = chain.size() - 1; i > 0; --i) keys[i - 1] = chain[i]->parent;
    size_t n = 0, fresh = 0;
    for (; n < chain.size(); ++n) {
      const bool is_new = !taken.count(keys[n]);
      if (is_new && fresh == budget) break;
      fresh += is_new ? 1 : 0;
    }
    if (fresh == 0) continue;
    std::vector<int32_t> toks;
    toks.reserve(n * size_t(P));
    for (size_t i = 0; i < n; ++i) {
      toks.insert(toks.end(), chain[i]->tokens.begin(), chain[i]->tokens.end());
      taken.insert(keys[i]);
    }
    budget -= fresh;
    out.push_back(std::move(toks));
  }
  return out;
}

}  // namespace anvil
