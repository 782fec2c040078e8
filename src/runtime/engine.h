// Engine: sequences over the paged KV pool, driving Transformer::forward.
// A sequence is its token ids plus a page table; KV exists for its first n_kv tokens. extend()
// computes KV for new tokens (prefill, chunked to the model's max batch), decode() advances many
// sequences by one token in a single batched forward. Full pages enter the prefix index under their
// chain key (kv_page_key, rooted at kv_cache_root of the model fingerprint and the KV layout), so a
// new sequence whose prompt starts with known pages skips their prefill.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "model/transformer.h"
#include "runtime/kv_pool.h"
#include "runtime/page_store.h"
#include "runtime/sampler.h"

namespace anvil {

struct EngineOptions {
  int page_size = 16;
  int max_context = 4096;     // longest sequence, in tokens
  int max_seqs = 8;           // sequences decoded together at most
  int64_t kv_pages = 0;       // 0: enough for max_seqs sequences of max_context tokens
  DType kv_dtype = DType::kBF16;
  bool prefix_cache = true;
};

class Engine {
 public:
  // model_fingerprint: LoadedModel::fingerprint (every weight byte and the config).
  static Result<std::unique_ptr<Engine>> create(Transformer& model, const Hash128& model_fingerprint,
                                                const EngineOptions& opts);
  ~Engine();

  const EngineOptions& options() const { return opts_; }
  KVPool& pool() { return *pool_; }
  Transformer& model() { return model_; }

  Result<int> seq_create();
  void seq_release(int seq);
  const std::vector<int32_t>& seq_tokens(int seq) const { return seqs_[seq].tokens; }
  int seq_cached_tokens(int seq) const { return seqs_[seq].reused; }  // prompt tokens served from the prefix index
  // ... of which from the durable store: restored for this sequence, or loaded by warm_from_store and
  // reused by no sequence before this one.
  int seq_store_tokens(int seq) const { return seqs_[seq].from_store; }
  int seq_kv(int seq) const { return seqs_[seq].n_kv; }                 // positions with KV
  // The pool page holding position n_kv (the partially filled tail), or -1.
  int32_t seq_tail_page(int seq) const {
    const Seq& s = seqs_[seq];
    size_t i = size_t(s.n_kv / opts_.page_size);
    return i < s.pages.size() ? s.pages[i] : -1;
  }

  // Attaches a durable page store (src/kvstore/): full pages are handed to it as they fill, and a
  // new sequence's prefix is restored from it where the in-memory index has no page. Its
  // fingerprint() must be this engine's cache_root().
  void set_page_store(PageStore* store);
  PageStore* page_store() const { return store_; }
  const Hash128& cache_root() const { return root_; }
  // Full pages the store dropped (its queue was full under a burst of pages), or could not write
  // (PageStore::take_failed: a failed write or commit, handed over once the store recovered), and
  // the prefix index still holds are offered to it again (PageStore::page_offer), oldest first, at
  // every step and extend, as long as it takes them; a page evicted meanwhile is forgotten.
  // Returns how many still wait. The server also calls it while idle.
  size_t offer_dropped();
  // Loads the store's most recently used prefixes (PageStore::recent_prefixes), at most max_pages
  // pages, into the prefix index, as a sequence reusing them would, without computing anything: a
  // restarted server's first requests for them then find them in memory. Pages already indexed are
  // kept; a prefix stops at its first page the store cannot restore. Needs the prefix cache.
  struct Warmed {
    size_t prefixes = 0, pages = 0;  // prefixes touched, pages restored from the store
  };
  Warmed warm_from_store(size_t max_pages);
  // Before the store is detached or shut down: flushes the store, then offers every dropped or
  // failed page still indexed (failed ones whenever the store last failed: one more try), letting
  // the store's queue drain (PageStore::flush) between rounds, until none is left or one round
  // makes no progress.
  void persist_dropped();

  // Appends `tokens` to the sequence and computes their KV. Writes the logits of the last token to
  // last_logits ([vocab]) and, when all_logits is set, of every new token ([n, vocab]).
  // keep_going, when given, is asked before each prefill chunk after the first (a long prompt on a
  // CPU takes minutes: Ctrl-C must not wait for all of it); false stops there: the chunks computed
  // so far keep their KV (and go to the prefix index and the store like any full page), the rest of
  // `tokens` is not appended, last_logits is left empty, and extend returns ok, so the caller sees
  // the stop as seq_tokens() ending short of what it asked for.
  Status extend(int seq, std::span<const int32_t> tokens, std::vector<float>* last_logits,
                std::vector<float>* all_logits = nullptr, const std::function<bool()>& keep_going = {});
  // Appends tokens[i] to seqs[i] for every i in one batched forward; logits: [n, vocab].
  Status decode(std::span<const int> seqs, std::span<const int32_t> tokens, std::vector<float>* logits);
  // The same step, sampling greedily on the backend (Transformer::forward_greedy): (*next)[i] is the
  // token after tokens[i], never one of `suppress`; no logits come back to the host.
  Status decode_greedy(std::span<const int> seqs, std::span<const int32_t> tokens, std::span<const int32_t> suppress,
                       std::vector<int32_t>* next);

  // The same step with the full sampler on the backend (engine_sample.cpp, Backend::sample_rows):
  // (*next)[i] is the token seqs[i] samples with params[i] and the 53 random bits random[i] (its
  // Sampler's next_random53()), never one of `suppress` (-1: no token possible), with params[i]'s
  // logit_bias (ids at or above the vocabulary: invalid_argument). Exactly the token
  // the host Sampler picks from decode()'s logits with the sequence's tokens as history. The
  // repetition-penalty history lives on the device as per-sequence token counts, updated by the
  // tokens each step adds (and drops from the window); only the ids come back.
  Status decode_sample(std::span<const int> seqs, std::span<const int32_t> tokens,
                       std::span<const SamplingParams> params, std::span<const uint64_t> random,
                       std::span<const int32_t> suppress, std::vector<int32_t>* next);

  // Continuous batching (engine_step.cpp). A sequence's tokens may run ahead of its KV: append()
  // adds pending tokens, step() computes KV for chunks of pending tokens of several sequences in
  // one forward, so prefill chunks and decode tokens share a step.
  // Appends pending tokens; a fresh sequence first takes the longest known prefix from the index
  // (reuse false: it does not, so that every token is computed: a step's all_logits needs them).
  Status seq_append(int seq, std::span<const int32_t> tokens, bool reuse = true);
  int seq_pending(int seq) const { return int(seqs_[seq].tokens.size()) - seqs_[seq].n_kv; }
  // Gives the sequence pages for its first n_positions tokens. kOutOfMemory when the pool is full
  // (pages taken so far stay with the sequence); the caller decides whom to preempt.
  Status seq_reserve(int seq, int n_positions) { return ensure_pages(seqs_[seq], n_positions); }
  struct StepItem {
    int seq;
    int n_tokens;      // the next n pending tokens get KV
    bool want_logits;  // logits of the last of them
    bool all_logits = false;  // logits of every one of them (a prompt's log-probabilities: echo)
  };
  // One forward over every item (distinct sequences, sum of n_tokens <= the model's max tokens,
  // at most max_seqs items). logits: in item order, n_tokens rows for an item with all_logits (its
  // last is the want_logits row), one for an item wanting logits, none otherwise; at most the
  // model's max_logit_rows() rows in all.
  Status step(std::span<const StepItem> items, std::vector<float>* logits);
  // How step_sample takes one row (an item wanting logits).
  struct RowMode {
    bool host = false;     // not sampled: its logits come back (host_logits) for the caller to sample
    bool suppress = true;  // `suppress` applies to it
  };
  // The same step sampling on the backend (engine_sample.cpp): (*next)[r] is the token the r-th item
  // wanting logits samples with params[r] and random[r], never one of `suppress` (-1: none
  // possible); exactly the token the host Sampler picks from step()'s logits row r with the
  // sequence's tokens as history. Only the ids come back.
  // modes (empty: every row sampled, suppressing) says per row otherwise: a host row is not sampled
  // ((*next)[r] = -1; its params[r] and random[r] are not read, and its repetition-penalty counts on
  // the device stay as they were); its logits row, as step() would return it, goes to *host_logits
  // ([host rows, vocab], in row order), and only those rows are copied from the device. A row whose
  // suppress is false samples as if `suppress` were empty.
  Status step_sample(std::span<const StepItem> items, std::span<const SamplingParams> params,
                     std::span<const uint64_t> random, std::span<const int32_t> suppress, std::vector<int32_t>* next,
                     std::span<const RowMode> modes = {}, std::vector<float>* host_logits = nullptr);
  // The last successful step()/step_sample(): nanoseconds from its start until its forward pass began
  // issuing kernels (checking the items, taking pages, building and uploading the batch and the
  // sampler's inputs). On a GPU, host time that the device waits through (Transformer::last_issue).
  uint64_t last_step_prep_ns() const { return last_step_prep_ns_; }
  // Rows of logits ([vocab] fp32 each) copied from the backend to the host so far: every logits row
  // of extend/decode/step, a step_sample's host rows; none for decode_greedy/decode_sample or a
  // step_sample's sampled rows.
  uint64_t logit_rows_to_host() const { return logit_rows_to_host_; }

 private:
  struct Seq {
    bool live = false;
    std::vector<int32_t> tokens;
    std::vector<int32_t> pages;
    std::vector<Hash128> page_key;  // chain key of each full page (zero until computed)
    int n_kv = 0;
    int reused = 0;
    int from_store = 0;
    int sample_counted = -1;  // decode_sample: tokens whose window is in the device counts (-1: none)
    int sample_window = 0;    // ... and the window they were counted with
  };
  Engine(Transformer& model, const Hash128& fp, const EngineOptions& opts)
      : model_(model), root_(kv_cache_root(fp, opts.kv_dtype, opts.page_size)), opts_(opts) {}
  Status init();
  Status ensure_pages(Seq& s, int n_positions);
  void reuse_prefix(Seq& s);
  Hash128 index_run(std::span<const int32_t> tokens, int max_pages, std::vector<int32_t>* pages,
                    std::vector<Hash128>* keys);
  int restore_run(std::span<const int32_t> tokens, int have, int max_pages, std::vector<int32_t>* pages,
                  std::vector<Hash128>* keys, Hash128* parent, bool mark);
  void publish_full_pages(Seq& s);
  void store_tick();  // the store's copied pages back (reap), then offer_dropped
  void take_failed(bool all);  // the store's failed pages into the dropped list (note_dropped)
  void note_dropped(int32_t page, const Hash128& key, int first_pos);
  struct Greedy {
    std::span<const int32_t> suppress;
    int32_t* ids;
    const SampleArgs* sample = nullptr;  // decode_sample: the full sampler instead of argmax
    std::span<const int> host_rows = {};  // step_sample: rows not sampled, their logits to host_logits
    float* host_logits = nullptr;
  };
  // Runs one forward over tokens (seq_of[t], pos_of[t]); `seqs` lists the distinct sequences in order.
  // With `greedy`, samples on the backend into greedy->ids instead of returning logits.
  Status run_batch(const std::vector<int>& seqs, const std::vector<int32_t>& ids, const std::vector<int32_t>& seq_idx,
                   const std::vector<int32_t>& pos, const std::vector<int>& logit_rows, float* logits,
                   const Greedy* greedy = nullptr);
  Status decode_impl(std::span<const int> seqs, std::span<const int32_t> tokens, std::vector<float>* logits,
                     const Greedy* greedy);

  Transformer& model_;
  Hash128 root_;  // kv_cache_root: the parent of every sequence's first page
  EngineOptions opts_;
  std::unique_ptr<KVPool> pool_;
  std::vector<Seq> seqs_;
  int max_pages_per_seq_ = 0;
  struct Scratch {  // host-side batch description, reused between calls
    std::vector<int> order, rows;
    std::vector<int32_t> ids, sidx, pos, table;
  } scratch_;
  int32_t* pos_dev_ = nullptr;
  int32_t* seq_dev_ = nullptr;
  int32_t* table_dev_ = nullptr;
  PageStore* store_ = nullptr;
  // The store's dropped pages (offer_dropped): per pool page the key it was dropped under (zero:
  // none) and its first position, and those pages oldest first from dropped_head_, each at most
  // once (so never more than the pool's pages: reserved once, no allocation per step).
  std::vector<Hash128> dropped_key_;
  std::vector<int32_t> dropped_pos_;
  std::vector<int32_t> dropped_;
  size_t dropped_head_ = 0;
  uint64_t last_step_prep_ns_ = 0;
  uint64_t logit_rows_to_host_ = 0;
  struct SampleState {  // decode_sample's buffers (engine_sample.cpp), allocated on first use
    SampleRowParams* params = nullptr;  // [max_seqs]
    int32_t* counts = nullptr;          // [max_seqs, vocab], row = sequence id
    int32_t* updates = nullptr;         // [update_cap]
    int32_t* offsets = nullptr;         // [max_seqs + 1]
    void* scratch = nullptr;
    size_t update_cap = 0;
    int32_t* bias_offsets = nullptr;  // [max_seqs + 1]: each row's logit_bias entries
    int32_t* bias_ids = nullptr;      // [max_seqs * kMaxLogitBiasEntries]
    float* bias_values = nullptr;     // [max_seqs * kMaxLogitBiasEntries]
    std::vector<SampleRowParams> host_params;
    std::vector<int32_t> host_updates, host_offsets, zeros;
    std::vector<int32_t> host_bias_offsets, host_bias_ids, uploaded_bias_offsets;
    std::vector<float> host_bias_values;
  } samp_;
  Status sample_state_init();
  Status sample_upload(std::span<const int> seqs, std::span<const int32_t> extra, std::span<const SamplingParams> params,
                       std::span<const uint64_t> random, std::span<const RowMode> modes, SampleArgs* out);
  void sample_committed(std::span<const int> seqs, std::span<const SamplingParams> params,
                        std::span<const RowMode> modes);
  // step()/step_sample(): checks the items, takes their pages and runs one forward, then advances
  // the sequences. With `sample` (step_sample), called once the items are known valid and before any
  // page is taken, the forward samples on the backend (its Greedy) instead of returning logits.
  Status step_impl(std::span<const StepItem> items, std::vector<float>* logits,
                   const std::function<Status(Greedy*)>& sample);
  void sample_state_free();
};

}  // namespace anvil
