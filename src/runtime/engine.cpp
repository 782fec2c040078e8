#include "runtime/engine.h"

#include "model/rope.h"

#include <algorithm>
#include <cstdint>

namespace anvil {

Result<std::unique_ptr<Engine>> Engine::create(Transformer& model, const Hash128& fp, const EngineOptions& opts) {
  if (opts.page_size <= 0) return invalid_argument("page size must be positive");
  if (opts.max_context <= 0) return invalid_argument("max context must be positive");
  if (opts.max_seqs <= 0) return invalid_argument("max sequences must be positive");
  std::unique_ptr<Engine> e(new Engine(model, fp, opts));
  ANVIL_RETURN_IF_ERROR(e->init());
  return e;
}

Engine::~Engine() {
  if (store_) store_->reap(*pool_, true);  // the store's writer may still be copying pool pages
  for (int i = 0; i < int(seqs_.size()); ++i)
    if (seqs_[i].live) seq_release(i);
  Backend& be = model_.backend();
  for (void* p : {(void*)pos_dev_, (void*)seq_dev_, (void*)table_dev_})
    if (p) be.free(p);
  sample_state_free();
}

Status Engine::init() {
  const ModelConfig& c = model_.config();
  KVCacheView kv;
  kv.dtype = opts_.kv_dtype;
  kv.n_layers = c.num_hidden_layers;
  kv.n_kv_heads = c.num_key_value_heads;
  kv.head_dim = c.head_dim;
  kv.rotary_dim = c.rotary_dim;
  kv.rope_scale = rope_scale_in_rotation(c);
  kv.window = c.sliding_window;
  kv.page_size = opts_.page_size;
  // In 64 bits: a context near INT_MAX plus a page would wrap around in int.
  max_pages_per_seq_ = int((int64_t(opts_.max_context) + opts_.page_size - 1) / opts_.page_size);
  kv.n_pages = opts_.kv_pages > 0 ? opts_.kv_pages : int64_t(max_pages_per_seq_) * opts_.max_seqs;
  if (kv.n_pages > INT32_MAX)
    return invalid_argument("KV cache: " + std::to_string(opts_.max_seqs) + " sequence(s) of " +
                            std::to_string(max_pages_per_seq_) + " pages (a context of " +
                            std::to_string(opts_.max_context) + " tokens in pages of " + std::to_string(opts_.page_size) +
                            ") is " + std::to_string(kv.n_pages) + " pages, more than the pool's limit of " +
                            std::to_string(INT32_MAX) + ": lower the context or the number of sequences");
  pool_ = std::make_unique<KVPool>(model_.backend(), kv);
  ANVIL_RETURN_IF_ERROR(pool_->init());
  Backend& be = model_.backend();
  const int T = std::max(model_.max_tokens(), opts_.max_seqs);
  ANVIL_ASSIGN_OR_RETURN(void* p1, be.alloc(size_t(T) * 4));
  pos_dev_ = static_cast<int32_t*>(p1);
  ANVIL_ASSIGN_OR_RETURN(void* p2, be.alloc(size_t(T) * 4));
  seq_dev_ = static_cast<int32_t*>(p2);
  size_t table_bytes = 0;  // the page tables: one int32 per page of every sequence
  if (__builtin_mul_overflow(size_t(opts_.max_seqs) * 4, size_t(max_pages_per_seq_), &table_bytes))
    return invalid_argument("KV cache: the page tables of " + std::to_string(opts_.max_seqs) + " sequences of " +
                            std::to_string(max_pages_per_seq_) + " pages do not fit in 64-bit memory");
  ANVIL_ASSIGN_OR_RETURN(void* p3, be.alloc(table_bytes));
  table_dev_ = static_cast<int32_t*>(p3);
  return Status::ok();
}

Result<int> Engine::seq_create() {
  int live = 0;
  for (auto& s : seqs_) live += s.live;
  if (live >= opts_.max_seqs)
    return invalid_argument("too many sequences: " + std::to_string(live) + " are live, the engine allows " +
                            std::to_string(opts_.max_seqs));
  for (int i = 0; i < int(seqs_.size()); ++i)
    if (!seqs_[i].live) {
      seqs_[i] = Seq{};
      seqs_[i].live = true;
      return i;
    }
  seqs_.push_back(Seq{});
  seqs_.back().live = true;
  return int(seqs_.size()) - 1;
}

void Engine::seq_release(int seq) {
  Seq& s = seqs_[seq];
  for (int32_t p : s.pages) pool_->kv_page_release(p);
  s = Seq{};
}

Status Engine::ensure_pages(Seq& s, int n_positions) {
  const int P = opts_.page_size;
  int need = (n_positions + P - 1) / P;
  // The limit is exact: pages round it up, the check below must not.
  if (n_positions > opts_.max_context || need > max_pages_per_seq_)
    return invalid_argument("sequence of " + std::to_string(n_positions) + " tokens exceeds the context limit of " +
                            std::to_string(opts_.max_context) + " (raise --ctx)");
  while (int(s.pages.size()) < need) {
    int32_t p = pool_->kv_page_alloc();
    if (p < 0 && store_) {  // pages the store still holds for copying come back first
      store_->reap(*pool_, true);
      p = pool_->kv_page_alloc();
    }
    if (p < 0)
      return Status(StatusCode::kOutOfMemory, "KV cache is full: " + std::to_string(pool_->n_pages()) +
                                                  " pages of " + std::to_string(P) + " tokens are all in use");
    s.pages.push_back(p);
    s.page_key.push_back(Hash128{});
  }
  return Status::ok();
}

// The index's run of full pages of `tokens` from the root, at most max_pages: each retained and
// appended with its key to pages/keys. Returns the key of the last one (zero: none).
Hash128 Engine::index_run(std::span<const int32_t> tokens, int max_pages, std::vector<int32_t>* pages,
                          std::vector<Hash128>* keys) {
  const int P = opts_.page_size;
  Hash128 parent{};
  for (int i = 0; i < max_pages; ++i) {
    auto page_tokens = tokens.subspan(size_t(i) * P, P);
    const Hash128 key = kv_page_key(root_, parent, page_tokens);
    const int32_t page = pool_->prefix_lookup(key, parent, page_tokens);
    if (page < 0) break;
    pages->push_back(page);
    keys->push_back(key);
    parent = key;
  }
  return parent;
}

// Continues the run at page `have` from the durable store (at most max_pages, validated, installed
// only once loaded); with the prefix cache the restored pages join the index, marked from the store
// when `mark` (warm_from_store). Returns how many; *parent becomes the last key.
int Engine::restore_run(std::span<const int32_t> tokens, int have, int max_pages, std::vector<int32_t>* pages,
                        std::vector<Hash128>* keys, Hash128* parent, bool mark) {
  const int P = opts_.page_size;
  const int n = max_pages > 0 ? store_->restore_pages(tokens, have, *parent, max_pages, *pool_, pages, keys) : 0;
  for (int i = have; i < have + n; ++i) {
    if (opts_.prefix_cache) {
      pool_->prefix_insert((*keys)[size_t(i)], i == 0 ? Hash128{} : (*keys)[size_t(i) - 1],
                           tokens.subspan(size_t(i) * P, P), (*pages)[size_t(i)]);
      if (mark) pool_->mark_from_store((*pages)[size_t(i)]);  // its first user counts it as restored
    }
    *parent = (*keys)[size_t(i)];
  }
  return n;
}

// Takes pages from the prefix index for the longest run of full pages of s.tokens it knows,
// always leaving at least one token to compute (its logits are needed).
void Engine::reuse_prefix(Seq& s) {
  if ((!opts_.prefix_cache && !store_) || s.n_kv != 0 || !s.pages.empty()) return;
  const int P = opts_.page_size;
  const int max_full = (int(s.tokens.size()) - 1) / P;
  Hash128 parent = opts_.prefix_cache ? index_run(s.tokens, max_full, &s.pages, &s.page_key) : Hash128{};
  s.n_kv = int(s.pages.size()) * P;
  s.from_store = 0;  // tokens of pages the store loaded ahead of any request, first reused here
  for (int32_t page : s.pages)
    if (pool_->take_from_store(page)) s.from_store += P;
  if (store_) {
    // The durable store continues where memory ended: full pages, then a session's partial tail.
    const int have = int(s.pages.size());
    const int n = restore_run(s.tokens, have, max_full - have, &s.pages, &s.page_key, &parent, false);
    s.n_kv += n * P;
    s.from_store += n * P;
    int32_t tail = -1;
    const int m = store_->restore_tail(s.tokens, s.n_kv, parent, int(s.tokens.size()) - 1 - s.n_kv, *pool_, &tail);
    if (m > 0) {
      s.pages.push_back(tail);
      s.page_key.push_back(Hash128{});
      s.n_kv += m;
      s.from_store += m;
    }
  }
  s.reused = s.n_kv;
}

Engine::Warmed Engine::warm_from_store(size_t max_pages) {
  Warmed w;
  if (!store_ || !opts_.prefix_cache || max_pages == 0) return w;
  const int P = opts_.page_size;
  for (const std::vector<int32_t>& toks : store_->recent_prefixes(max_pages)) {
    const int n_pages = int(toks.size()) / P;
    std::vector<int32_t> pages;
    std::vector<Hash128> keys;
    Hash128 parent = index_run(toks, n_pages, &pages, &keys);  // what memory already has
    const int have = int(pages.size());
    const int n = restore_run(toks, have, n_pages - have, &pages, &keys, &parent, true);
    for (int32_t p : pages) pool_->kv_page_release(p);  // the index keeps its own reference
    ++w.prefixes;
    w.pages += size_t(n);
  }
  return w;
}

void Engine::publish_full_pages(Seq& s) {
  if (!opts_.prefix_cache && !store_) return;
  const int P = opts_.page_size;
  for (int i = 0; i < s.n_kv / P; ++i) {
    if (!s.page_key[i].is_zero()) continue;
    const Hash128 parent = i == 0 ? Hash128{} : s.page_key[i - 1];
    auto page_tokens = std::span<const int32_t>(s.tokens).subspan(size_t(i) * P, P);
    s.page_key[i] = kv_page_key(root_, parent, page_tokens);
    const bool indexed = opts_.prefix_cache && pool_->prefix_insert(s.page_key[i], parent, page_tokens, s.pages[i]);
    // Computed here (restored and reused pages have their key already): hand it to the store. A
    // page it drops is offered again later while the index holds it (offer_dropped).
    if (store_ && !store_->page_full(int(&s - seqs_.data()), s.page_key[i], parent, i * P, page_tokens, s.pages[i],
                                     *pool_) &&
        indexed)
      note_dropped(s.pages[i], s.page_key[i], i * P);
  }
}

void Engine::set_page_store(PageStore* store) {
  store_ = store;
  // (Reserved here, once: note_dropped and offer_dropped run on the decode thread and never grow them.)
  dropped_key_.assign(store ? size_t(pool_->n_pages()) : 0, Hash128{});
  dropped_pos_.assign(dropped_key_.size(), 0);
  dropped_.clear();
  dropped_.reserve(dropped_key_.size());
  dropped_head_ = 0;
}

void Engine::note_dropped(int32_t page, const Hash128& key, int first_pos) {
  if (size_t(page) >= dropped_key_.size()) return;
  if (dropped_key_[size_t(page)].is_zero()) {
    if (dropped_head_ > 0 && dropped_.size() == dropped_.capacity()) {  // the consumed front makes room
      dropped_.erase(dropped_.begin(), dropped_.begin() + std::ptrdiff_t(dropped_head_));
      dropped_head_ = 0;
    }
    dropped_.push_back(page);
  }
  dropped_key_[size_t(page)] = key;  // (a page listed under an older key that was evicted: now this one)
  dropped_pos_[size_t(page)] = first_pos;
}

void Engine::take_failed(bool all) {
  store_->take_failed(all, [this](int32_t page, const Hash128& key, int first_pos) {
    note_dropped(page, key, first_pos);
  });
}

size_t Engine::offer_dropped() {
  if (!store_) return 0;
  take_failed(false);  // pages the store could not write (a full disk), once it can again
  while (dropped_head_ < dropped_.size()) {
    const int32_t page = dropped_[dropped_head_];
    const Hash128 key = dropped_key_[size_t(page)];
    Hash128 parent;
    const std::vector<int32_t>* tokens = key.is_zero() ? nullptr : pool_->prefix_tokens_of(page, key, &parent);
    if (tokens && !store_->page_offer(key, parent, dropped_pos_[size_t(page)], *tokens, page, *pool_)) break;
    dropped_key_[size_t(page)] = Hash128{};  // offered, or no longer indexed under that key: done with it
    ++dropped_head_;
  }
  if (dropped_head_ == dropped_.size()) dropped_.clear(), dropped_head_ = 0;
  return dropped_.size() - dropped_head_;
}

void Engine::persist_dropped() {
  if (!store_) return;
  // What the store has queued is committed or has failed by now; what failed is offered once more,
  // whenever the store last failed (the process is about to let its prefix cache go).
  store_->flush();
  take_failed(true);
  for (size_t left = offer_dropped(); left > 0;) {
    store_->flush();  // the queue drains: room for the next round
    store_->reap(*pool_, false);
    const size_t now = offer_dropped();
    if (now >= left) break;  // no progress (cannot happen with an empty queue; never spin)
    left = now;
  }
}

void Engine::store_tick() {
  store_->reap(*pool_, false);  // pages the store's writer has copied come back
  offer_dropped();              // dropped and failed pages offered again (nothing to do: two loads)
}

Status Engine::run_batch(const std::vector<int>& seqs, const std::vector<int32_t>& ids,
                         const std::vector<int32_t>& seq_idx, const std::vector<int32_t>& pos,
                         const std::vector<int>& logit_rows, float* logits, const Greedy* greedy) {
  Backend& be = model_.backend();
  // The table's row stride is fixed (max_pages_per_seq_), not the batch's longest sequence, so a
  // decode step keeps one shape and its captured graph stays valid as sequences grow.
  const int max_pages = max_pages_per_seq_;
  std::vector<int32_t>& table = scratch_.table;  // reused: no allocation per decode step
  table.assign(size_t(seqs.size()) * max_pages, 0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto& pages = seqs_[seqs[i]].pages;
    std::copy(pages.begin(), pages.end(), table.begin() + i * max_pages);
  }
  be.copy_to_device(pos_dev_, pos.data(), pos.size() * 4);
  be.copy_to_device(seq_dev_, seq_idx.data(), seq_idx.size() * 4);
  be.copy_to_device(table_dev_, table.data(), table.size() * 4);
  BatchView b;
  b.n_tokens = int(ids.size());
  b.n_seqs = int(seqs.size());
  b.max_pages = max_pages;
  b.pos = pos_dev_;
  b.seq = seq_dev_;
  b.page_table = table_dev_;
  b.pos_host = pos.data();
  b.seq_host = seq_idx.data();
  // Counted when asked for: a failed forward may have copied some of them.
  if (greedy && greedy->sample) {
    logit_rows_to_host_ += greedy->host_rows.size();
    return model_.forward_sample(ids.data(), b, pool_->view(), logit_rows, greedy->suppress, *greedy->sample,
                                 greedy->ids, greedy->host_rows, greedy->host_logits);
  }
  if (greedy) return model_.forward_greedy(ids.data(), b, pool_->view(), logit_rows, greedy->suppress, greedy->ids);
  logit_rows_to_host_ += logit_rows.size();
  return model_.forward(ids.data(), b, pool_->view(), logit_rows, logits);
}

Status Engine::extend(int seq, std::span<const int32_t> tokens, std::vector<float>* last_logits,
                      std::vector<float>* all_logits, const std::function<bool()>& keep_going) {
  if (seq < 0 || seq >= int(seqs_.size()) || !seqs_[seq].live) return invalid_argument("extend: no such sequence");
  if (tokens.empty()) return invalid_argument("extend: no tokens");
  if (store_) store_tick();
  Seq& s = seqs_[seq];
  const int V = model_.config().vocab_size;
  for (int32_t t : tokens)
    if (t < 0 || t >= V)
      return invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(V) +
                              ")");
  // On any failure below the sequence returns to exactly this state: the tokens, the pages taken
  // from the prefix index or allocated here, and n_kv (a reused prefix advances it before the
  // pages for the rest are known to exist).
  const size_t old_tokens = s.tokens.size(), old_pages = s.pages.size();
  const int old_n_kv = s.n_kv, old_reused = s.reused, old_from_store = s.from_store;
  auto roll_back = [&] {
    for (size_t i = old_pages; i < s.pages.size(); ++i) pool_->kv_page_release(s.pages[i]);
    s.pages.resize(old_pages);
    s.page_key.resize(old_pages);
    s.tokens.resize(old_tokens);
    s.n_kv = old_n_kv;
    s.reused = old_reused;
    s.from_store = old_from_store;
  };
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  if (!all_logits) reuse_prefix(s);
  Status st = ensure_pages(s, int(s.tokens.size()));
  if (!st.is_ok()) {
    roll_back();
    return st;
  }
  if (all_logits) all_logits->assign(tokens.size() * size_t(V), 0.0f);
  const int first_new = int(s.tokens.size() - tokens.size());
  // Every token's logits: chunks of at most the rows the model keeps logits for.
  const int chunk = all_logits ? std::min(model_.max_tokens(), model_.max_logit_rows()) : model_.max_tokens();
  std::vector<float> chunk_logits;
  if (last_logits) last_logits->clear();
  for (bool first = true; s.n_kv < int(s.tokens.size()); first = false) {
    if (!first && keep_going && !keep_going()) {
      s.tokens.resize(size_t(s.n_kv));  // stopped: the chunks computed so far keep their KV and pages
      return Status::ok();
    }
    int n = std::min(chunk, int(s.tokens.size()) - s.n_kv);
    std::vector<int32_t> ids(s.tokens.begin() + s.n_kv, s.tokens.begin() + s.n_kv + n);
    std::vector<int32_t> pos(n), sidx(n, 0);
    for (int i = 0; i < n; ++i) pos[i] = s.n_kv + i;
    std::vector<int> rows;
    const bool last_chunk = s.n_kv + n == int(s.tokens.size());
    if (all_logits) {
      for (int i = 0; i < n; ++i) rows.push_back(i);
    } else if (last_chunk) {
      rows.push_back(n - 1);
    }
    chunk_logits.resize(rows.size() * size_t(V));
    Status fs = run_batch({seq}, ids, sidx, pos, rows, chunk_logits.data());
    if (!fs.is_ok()) {
      // Chunks already computed keep their KV (and pages); the rest of the tokens are dropped.
      s.tokens.resize(size_t(s.n_kv));
      return fs;
    }
    if (all_logits) {
      // Rows of tokens before first_new (a reused-prefix recompute never happens with all_logits).
      std::copy(chunk_logits.begin(), chunk_logits.end(),
                all_logits->begin() + size_t(s.n_kv - first_new) * V);
    }
    if (last_chunk && last_logits)
      last_logits->assign(chunk_logits.end() - V, chunk_logits.end());
    s.n_kv += n;
    // Every chunk: the store's writer copies a long prompt's pages while later chunks compute
    // (handed over only at the end, a 16k-token prompt's 1,024 pages overflowed its queue).
    publish_full_pages(s);
  }
  return Status::ok();
}

Status Engine::decode(std::span<const int> seqs, std::span<const int32_t> tokens, std::vector<float>* logits) {
  return decode_impl(seqs, tokens, logits, nullptr);
}

Status Engine::decode_greedy(std::span<const int> seqs, std::span<const int32_t> tokens,
                             std::span<const int32_t> suppress, std::vector<int32_t>* next) {
  next->resize(seqs.size());
  Greedy g{suppress, next->data()};
  return decode_impl(seqs, tokens, nullptr, &g);
}

Status Engine::decode_impl(std::span<const int> seqs, std::span<const int32_t> tokens, std::vector<float>* logits,
                           const Greedy* greedy) {
  if (seqs.size() != tokens.size() || seqs.empty()) return invalid_argument("decode: one token per sequence");
  if (int(seqs.size()) > std::max(model_.max_tokens(), 1)) return invalid_argument("decode: batch too large");
  const int V = model_.config().vocab_size;
  if (store_) store_tick();
  // Per-step index vectors are members reused across calls: no allocation per decode step.
  std::vector<int>& order = scratch_.order;
  std::vector<int32_t>&ids = scratch_.ids, &sidx = scratch_.sidx, &pos = scratch_.pos;
  std::vector<int>& rows = scratch_.rows;
  order.assign(seqs.begin(), seqs.end());
  ids.clear();
  sidx.clear();
  pos.clear();
  rows.clear();
  // Validate everything before touching any sequence. A sequence listed twice would put two
  // tokens at one position (one KV slot, n_kv counting a position without KV) and overflow the
  // page table, which holds max_seqs distinct sequences.
  for (size_t i = 0; i < seqs.size(); ++i) {
    int sq = seqs[i];
    if (sq < 0 || sq >= int(seqs_.size()) || !seqs_[sq].live)
      return invalid_argument("decode: no such sequence: " + std::to_string(sq));
    if (tokens[i] < 0 || tokens[i] >= V)
      return invalid_argument("token id " + std::to_string(tokens[i]) + " is outside the vocabulary");
    for (size_t j = 0; j < i; ++j)
      if (seqs[j] == sq) return invalid_argument("decode: sequence " + std::to_string(sq) + " is listed twice");
    const Seq& s = seqs_[sq];
    if (s.n_kv != int(s.tokens.size())) return internal_error("decode: sequence has tokens without KV");
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    Seq& s = seqs_[seqs[i]];
    ANVIL_RETURN_IF_ERROR(ensure_pages(s, int(s.tokens.size()) + 1));
    ids.push_back(tokens[i]);
    sidx.push_back(int32_t(i));
    pos.push_back(int32_t(s.tokens.size()));
    rows.push_back(int(i));
  }
  if (logits) logits->resize(seqs.size() * size_t(V));
  ANVIL_RETURN_IF_ERROR(run_batch(order, ids, sidx, pos, rows, logits ? logits->data() : nullptr, greedy));
  for (size_t i = 0; i < seqs.size(); ++i) {
    Seq& s = seqs_[seqs[i]];
    s.tokens.push_back(tokens[i]);
    s.n_kv += 1;
    publish_full_pages(s);
  }
  return Status::ok();
}

}  // namespace anvil
