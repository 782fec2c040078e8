// anvil bench-kv: what the durable KV store costs and saves (docs/benchmarks.md).
//   default        decode with the store off and on, back to back in one process (off, on, off, on,
//                  ...; each run a fresh random prompt so every page is new and persisted): median and
//                  p99 per-token time of each, bytes written against the unique KV they carry.
//                  --seqs B decodes B sequences together (the per-token time is per step).
//   --open-lookup N  a store of N small pages: time to open it (recovery included) and restore one.
//   --restore-pages N  restore bandwidth: N full pages of qwen3-0.6b's KV layout stored, the store
//                  reopened, all N restored in one chain; beside it the two ceilings measured in the
//                  same process: sequential read of the segment files (page cache warm, as the
//                  restore reads them) and the backend's host->device copy (CPU: memcpy; CUDA:
//                  asynchronous copies from pinned memory into the device pool). --device picks it.
// Time to first token after a restart needs two processes: scripts/bench_kv.sh runs them.
#include <algorithm>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include <fcntl.h>
#include <unistd.h>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/kv_options.h"
#include "runtime/generate.h"

namespace anvil::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchKvArgs {
  ModelOptions model;
  KVStoreFlags kv;
  int prompt = 512, n = 128, pairs = 3, batch = 1;
  int64_t open_lookup = 0;
  int restore_pages = 0, reps = 3;
  bool json = false;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5));
  return v[i];
}

// The benchmark starts from an empty store. Its default directories (under /tmp) are its own and
// are wiped; a --kv-store given by the user must be new or empty: a benchmark never deletes what
// it did not make (an existing store, a model directory).
Result<std::string> fresh_store_dir(const std::string& given, const char* fallback) {
  if (given.empty()) {
    std::filesystem::remove_all(fallback);
    return std::string(fallback);
  }
  std::error_code ec;
  if (std::filesystem::exists(given, ec) && !std::filesystem::is_empty(given, ec))
    return invalid_argument("--kv-store " + given +
                            ": bench-kv needs a new or empty directory (it measures a store it fills itself, and "
                            "never deletes what it did not make)");
  return given;
}

// What the flags' ranges (checked as the command line is parsed: add_int_option) leave out.
Status check_bench_kv_args(const BenchKvArgs& a) {
  if (a.open_lookup > 0 && a.open_lookup < 8)
    return invalid_argument("--open-lookup must be 0 (off) or in [8, 100000000], got '" + std::to_string(a.open_lookup) + "'");
  return Status::ok();
}

int bench_open_lookup(BenchKvArgs& a) {
  auto fresh = fresh_store_dir(a.kv.dir, "/tmp/anvil-bench-kv-open");
  if (!fresh.is_ok()) return fail(fresh.status().message());
  const std::string dir = *fresh;
  auto be = make_cpu_backend(1);
  KVCacheView v;
  v.dtype = DType::kBF16;
  v.n_layers = 1;
  v.n_kv_heads = 1;
  v.head_dim = 8;
  v.page_size = 16;
  v.n_pages = 1024;
  KVPool pool(*be, v);
  if (!pool.init().is_ok()) return fail("pool");
  const Hash128 fp = hash128("bench-open-lookup", 17);
  KVStoreOptions o;
  o.dir = dir;
  o.flush_pages = 4096;
  o.queue_pages = 8192;
  std::vector<int32_t> probe;
  const auto t_fill = Clock::now();
  {
    auto st = KVStore::open(o);
    if (!st.is_ok()) return fail(st.status().message());
    if (Status s = (*st)->attach(*be, pool.view(), fp); !s.is_ok()) return fail(s.message());
    std::mt19937 rng(1);
    // Chains of 64 pages (1,024-token prompts), like many stored conversations.
    std::vector<int32_t> toks(64 * 16);
    for (int64_t i = 0; i < a.open_lookup;) {
      for (auto& t : toks) t = int32_t(rng() % 150000);
      Hash128 parent;
      for (int p = 0; p < 64 && i < a.open_lookup; ++p, ++i) {
        auto span = std::span<const int32_t>(toks).subspan(size_t(p) * 16, 16);
        Hash128 key = kv_page_key(fp, parent, span);
        int32_t page = pool.kv_page_alloc();
        if (page < 0) {
          (*st)->reap(pool, true);
          page = pool.kv_page_alloc();
        }
        (*st)->page_full(0, key, parent, p * 16, span, page, pool);
        pool.kv_page_release(page);
        parent = key;
      }
      (*st)->reap(pool, false);
    }
    probe.assign(toks.begin(), toks.begin() + 16 * 8 + 1);
    (*st)->flush();
    (*st)->reap(pool, true);
  }
  const double fill_s = std::chrono::duration<double>(Clock::now() - t_fill).count();
  // A restart: open (recovery + catalog check), attach, then the first lookup restores 8 pages of the
  // last chain written.
  const auto t0 = Clock::now();
  auto st = KVStore::open(o);
  if (!st.is_ok()) return fail(st.status().message());
  const auto t1 = Clock::now();
  if (Status s = (*st)->attach(*be, pool.view(), fp); !s.is_ok()) return fail(s.message());
  std::vector<int32_t> pages;
  std::vector<Hash128> keys;
  const int got = (*st)->restore_pages(probe, 0, Hash128{}, 8, pool, &pages, &keys);
  const auto t2 = Clock::now();
  const StoreStats ss = (*st)->stats();
  const double open_s = std::chrono::duration<double>(t1 - t0).count();
  const double total_s = std::chrono::duration<double>(t2 - t0).count();
  nlohmann::ordered_json j;
  j["pages_stored"] = ss.pages;
  j["fill_s"] = fill_s;
  j["open_s"] = open_s;
  j["open_attach_lookup_s"] = total_s;
  j["pages_restored"] = got;
  std::printf("%s\n", a.json ? j.dump().c_str() : j.dump(2).c_str());
  for (int32_t p : pages) pool.kv_page_release(p);
  return got == 8 ? 0 : 1;
}

int bench_restore(BenchKvArgs& a) {
  auto fresh = fresh_store_dir(a.kv.dir, "/tmp/anvil-bench-kv-restore");
  if (!fresh.is_ok()) return fail(fresh.status().message());
  const std::string dir = *fresh;
  const int N = a.restore_pages;
  // --device (auto: CUDA where a GPU is usable): on CUDA the pool is device memory, the restore goes
  // through pinned staging, and the host->device ceiling copies from pinned memory.
  auto be_or = make_backend(a.model.device, 1);
  if (!be_or.is_ok()) return fail(be_or.status().message());
  std::unique_ptr<Backend> be = std::move(*be_or);
  const bool host_pool = be->device_memory_is_host();
  KVCacheView v;  // qwen3-0.6b: 28 layers, 8 KV heads of 128, BF16, 16-token pages (1.75 MiB a page)
  v.dtype = DType::kBF16;
  v.n_layers = 28;
  v.n_kv_heads = 8;
  v.head_dim = 128;
  v.page_size = 16;
  v.n_pages = N + 1;
  KVPool pool(*be, v);
  if (!pool.init().is_ok()) return fail("pool of " + std::to_string(N + 1) + " pages");
  const size_t page_bytes = v.page_bytes();
  const Hash128 fp = hash128("bench-restore", 13);
  KVStoreOptions o;
  o.dir = dir;
  o.queue_pages = 64;
  std::mt19937 rng(3);
  std::vector<uint32_t> fill(page_bytes / 4);
  std::vector<int32_t> toks(size_t(N) * 16 + 1);
  for (auto& t : toks) t = int32_t(rng() % 150000);
  {
    auto st = KVStore::open(o);
    if (!st.is_ok()) return fail(st.status().message());
    if (Status s = (*st)->attach(*be, pool.view(), fp); !s.is_ok()) return fail(s.message());
    Hash128 parent;
    for (int p = 0; p < N; ++p) {
      auto span = std::span<const int32_t>(toks).subspan(size_t(p) * 16, 16);
      Hash128 key = kv_page_key(fp, parent, span);
      int32_t page = pool.kv_page_alloc();
      while (page < 0) {
        (*st)->reap(pool, true);
        page = pool.kv_page_alloc();
      }
      for (auto& x : fill) x = rng();
      be->copy_to_device(static_cast<uint8_t*>(pool.view().base) + size_t(page) * page_bytes, fill.data(),
                         fill.size() * 4);
      if (!be->synchronize().is_ok()) return fail("synchronize");
      (*st)->page_full(0, key, parent, p * 16, span, page, pool);
      pool.kv_page_release(page);
      (*st)->reap(pool, false);
      parent = key;
    }
    (*st)->flush();
    (*st)->reap(pool, true);
  }
  const double bytes = double(N) * double(page_bytes);
  // Each repetition times the restore (in a reopened store: a restart; timed to completion,
  // restore_pages synchronizes before it returns; open + attach are not part of it) and then, right
  // after it, the two ceilings: on a shared machine only figures taken back to back compare.
  std::vector<std::string> segs;
  double seg_bytes = 0;
  for (auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".kv") {
      segs.push_back(e.path().string());
      seg_bytes += double(e.file_size());
    }
  std::vector<uint8_t> buf(16u << 20);
  // The host->device ceiling's source: 8 pages of the memory a restore copies from (CUDA: pinned).
  uint8_t* host = nullptr;
  std::vector<uint8_t> host_vec;
  if (host_pool) {
    host_vec.assign(page_bytes * 8, 1);
    host = host_vec.data();
  } else {
    auto h = be->alloc_host_staging(page_bytes * 8);
    if (!h.is_ok()) return fail(h.status().message());
    host = static_cast<uint8_t*>(*h);
    std::memset(host, 1, page_bytes * 8);
  }
  auto rate = [](double bytes, Clock::time_point t) {
    return bytes / std::chrono::duration<double>(Clock::now() - t).count();
  };
  int got = 0;
  std::vector<double> restore_r, read_r, read_pool_r, h2d_r, ratio_r;
  for (int r = 0; r < a.reps; ++r) {
    auto st = KVStore::open(o);
    if (!st.is_ok()) return fail(st.status().message());
    if (Status s = (*st)->attach(*be, pool.view(), fp); !s.is_ok()) return fail(s.message());
    std::vector<int32_t> pages;
    std::vector<Hash128> keys;
    auto t = Clock::now();
    got = (*st)->restore_pages(toks, 0, Hash128{}, N, pool, &pages, &keys);
    restore_r.push_back(rate(bytes, t));
    for (int32_t p : pages) pool.kv_page_release(p);
    if (got != N) return fail("restored " + std::to_string(got) + " of " + std::to_string(N) + " pages");
    // Ceiling 1: sequential read of every segment file, 16 MiB preads into one reused buffer.
    t = Clock::now();
    for (auto& f : segs) {
      int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return fail("open " + f);
      off_t off = 0;
      ssize_t n;
      while ((n = ::pread(fd, buf.data(), buf.size(), off)) > 0) off += n;
      ::close(fd);
    }
    read_r.push_back(rate(seg_bytes, t));
    // Ceiling 1b: the same sequential read landing where a restore's bytes land, in the pool's pages
    // (N pages of memory, far larger than the caches) instead of one cache-resident 16 MiB buffer: what
    // the store's read rate is for a real destination. Reported beside the ratio, not in it.
    t = Clock::now();
    if (host_pool) {
      uint8_t* dst = static_cast<uint8_t*>(pool.view().base);
      const size_t cap = size_t(N) * page_bytes;
      size_t at = 0;
      for (auto& f : segs) {
        int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return fail("open " + f);
        off_t off = 0;
        ssize_t n;
        while (at < cap && (n = ::pread(fd, dst + at, std::min(buf.size(), cap - at), off)) > 0) {
          off += n;
          at += size_t(n);
        }
        ::close(fd);
      }
      read_pool_r.push_back(rate(double(at), t));
    }
    // Ceiling 2: host -> device copy of the same bytes into the pool's pages (CUDA: asynchronous
    // copies from pinned memory, as a restore's).
    t = Clock::now();
    for (int p = 0; p < N; ++p) {
      uint8_t* dst = static_cast<uint8_t*>(pool.view().base) + size_t(p) * page_bytes;
      if (host_pool) be->copy_to_device(dst, host + size_t(p % 8) * page_bytes, page_bytes);
      else be->copy_to_device_async(dst, host + size_t(p % 8) * page_bytes, page_bytes);
    }
    if (!host_pool && !be->wait_device_copies().is_ok()) return fail("host->device copies");
    if (!be->synchronize().is_ok()) return fail("synchronize");
    h2d_r.push_back(rate(bytes, t));
    ratio_r.push_back(restore_r.back() / std::min(read_r.back(), h2d_r.back()));
    std::fprintf(stderr, "[anvil] rep %d: restore %.3f GB/s, read %.3f GB/s, host->device %.3f GB/s: %.0f%%", r + 1,
                 restore_r.back() / 1e9, read_r.back() / 1e9, h2d_r.back() / 1e9, 100 * ratio_r.back());
    if (host_pool)
      std::fprintf(stderr, " (read into the pool's pages %.3f GB/s: %.0f%%)", read_pool_r.back() / 1e9,
                   100 * restore_r.back() / read_pool_r.back());
    std::fprintf(stderr, "\n");
  }
  if (!host_pool) be->free_host_staging(host);
  nlohmann::ordered_json j;
  j["backend"] = be->name();
  j["pages"] = N;
  j["page_bytes"] = page_bytes;
  j["restored_pages"] = got;
  j["reps"] = a.reps;
  j["restore_gb_s_median"] = percentile(restore_r, 0.5) / 1e9;
  j["segment_read_gb_s_median"] = percentile(read_r, 0.5) / 1e9;
  if (host_pool) j["segment_read_into_pool_gb_s_median"] = percentile(read_pool_r, 0.5) / 1e9;
  j["host_to_device_gb_s_median"] = percentile(h2d_r, 0.5) / 1e9;
  j["restore_over_lower_ceiling_median"] = percentile(ratio_r, 0.5);
  j["restore_over_lower_ceiling_best"] = percentile(ratio_r, 1.0);
  std::printf("%s\n", a.json ? j.dump().c_str() : j.dump(2).c_str());
  return got == N ? 0 : 1;
}

int bench_overhead(BenchKvArgs& a) {
  a.model.no_prefix_cache = true;  // every run prefills and persists new pages
  // Each sequence's context: prompt + n (or a larger -c/--ctx), kept by build_stack even above its
  // default (4096, or the model's sliding_window) and named as such in its errors.
  size_context_for_run(a.model, a.prompt, a.n);
  a.model.seqs_flag = "--seqs";
  if (a.batch < 1) return fail("--seqs must be >= 1");
  auto stack = build_stack(a.model, a.batch);
  if (!stack.is_ok()) return fail(stack.status().message());
  Stack& s = *stack;
  auto fresh = fresh_store_dir(a.kv.dir, "/tmp/anvil-bench-kv-overhead");
  if (!fresh.is_ok()) return fail(fresh.status().message());
  a.kv.dir = *fresh;
  auto attached = attach_kv_store(a.kv, s);
  if (!attached.is_ok()) return fail(attached.status().message());
  AttachedStore& store = *attached;
  if (!store) return fail("bench-kv: the store did not open");
  const ModelConfig& c = s.model->config;
  std::mt19937_64 rng(0);
  GenerateRequest req;
  req.max_new_tokens = a.n;
  req.sampling.temperature = 0;
  req.eos_ids = c.eos_token_ids;
  req.ignore_eos = true;
  std::vector<double> per_tok[2];  // [0] store off, [1] on
  std::fprintf(stderr, "[anvil] bench-kv %s on %s: prompt %d, generate %d, 1 warm-up + %d off/on pairs\n",
               s.model->source.c_str(), s.backend->name().c_str(), a.prompt, a.n, a.pairs);
  for (int run = 0; run < 2 * (a.pairs + 1); ++run) {
    const int on = run % 2;
    const bool warm = run < 2;
    s.engine->set_page_store(on ? store.get() : nullptr);
    std::vector<Clock::time_point> stamps;
    stamps.reserve(size_t(a.n));
    if (a.batch == 1) {
      req.prompt.assign(size_t(a.prompt), 0);
      for (auto& t : req.prompt) t = int32_t(rng() % uint64_t(c.vocab_size));
      auto seq = s.engine->seq_create();
      if (!seq.is_ok()) return fail(seq.status().message());
      auto r = generate(*s.engine, *seq, req, [&](int32_t) {
        stamps.push_back(Clock::now());
        return true;
      });
      if (!r.is_ok()) return fail(r.status().message());
      s.engine->seq_release(*seq);
    } else {
      // `batch` sequences, each with its own random prompt, decoded together: one stamp per step.
      std::vector<int> seqs;
      std::vector<int32_t> toks, next;
      std::vector<float> logits;
      for (int b = 0; b < a.batch; ++b) {
        auto seq = s.engine->seq_create();
        if (!seq.is_ok()) return fail(seq.status().message());
        std::vector<int32_t> prompt(size_t(a.prompt));
        for (auto& t : prompt) t = int32_t(rng() % uint64_t(c.vocab_size));
        // The prompt but its last token, which the first decode step appends.
        if (Status st = s.engine->extend(*seq, std::span<const int32_t>(prompt).first(prompt.size() - 1), &logits);
            !st.is_ok())
          return fail(st.message());
        seqs.push_back(*seq);
        toks.push_back(prompt.back());
      }
      for (int i = 0; i < a.n; ++i) {
        if (Status st = s.engine->decode_greedy(seqs, toks, {}, &next); !st.is_ok()) return fail(st.message());
        toks = next;
        stamps.push_back(Clock::now());
      }
      for (int q : seqs) s.engine->seq_release(q);
    }
    if (on) {  // the next (off) run starts with an idle writer and every pool page back
      store->flush();
      store->reap(s.engine->pool(), true);
    }
    std::vector<double> dt;
    for (size_t i = 1; i < stamps.size(); ++i) dt.push_back(std::chrono::duration<double>(stamps[i] - stamps[i - 1]).count());
    std::fprintf(stderr, "[anvil] %s store %s: median %.2f ms/token\n", warm ? "warm-up" : "run", on ? "on " : "off",
                 1e3 * percentile(dt, 0.5));
    if (!warm) per_tok[on].insert(per_tok[on].end(), dt.begin(), dt.end());
  }
  const KVStoreCounters& k = store->counters();
  const int64_t unique_bytes = k.pages_written.load() * int64_t(s.engine->pool().view().page_bytes());
  nlohmann::ordered_json j;
  j["model"] = s.model->source;
  j["backend"] = s.backend->name();
  j["batch"] = a.batch;
  j["prompt_tokens"] = a.prompt;
  j["generated_tokens"] = a.n;
  j["pairs"] = a.pairs;
  for (int on = 0; on < 2; ++on) {
    const char* key = on ? "store_on" : "store_off";
    j[key] = {{"median_ms", 1e3 * percentile(per_tok[on], 0.5)}, {"p99_ms", 1e3 * percentile(per_tok[on], 0.99)},
              {"tokens", per_tok[on].size()}};
  }
  j["median_speed_ratio"] = percentile(per_tok[0], 0.5) / percentile(per_tok[1], 0.5);
  j["p99_speed_ratio"] = percentile(per_tok[0], 0.99) / percentile(per_tok[1], 0.99);
  j["bytes_written"] = k.bytes_written.load();
  j["unique_kv_bytes"] = unique_bytes;
  j["bytes_written_over_unique"] = unique_bytes ? double(k.bytes_written.load()) / double(unique_bytes) : 0.0;
  j["kv_store"] = kv_profile_json(*store.get());
  if (a.kv.profile) print_kv_profile(*store.get(), 0, stderr);
  std::printf("%s\n", a.json ? j.dump().c_str() : j.dump(2).c_str());
  return 0;
}

Command reg("bench-kv", "Benchmark the durable KV store: decode overhead on vs off, open+lookup time", 55,
            [](CLI::App& app) -> std::function<int()> {
              auto a = std::make_shared<BenchKvArgs>();
              add_model_options(app, a->model);
              add_kv_store_options(app, a->kv, /*session_flags=*/false, /*off_flag=*/false);
              add_int_option(app, "--prompt-tokens", a->prompt, "Prompt length in tokens (random ids)", 1, 1 << 24)
                  ->default_str(std::to_string(a->prompt));
              add_int_option(app, "-n,--max-tokens", a->n, "Tokens to generate per run", 2, 1 << 24,
                             "decode speed needs two tokens")
                  ->default_str(std::to_string(a->n));
              add_int_option(app, "--seqs", a->batch, "Sequences decoded together (per-token time = per step)", 1,
                             INT32_MAX)
                  ->default_str(std::to_string(a->batch));
              add_int_option(app, "--pairs", a->pairs, "Timed off/on run pairs after one warm-up pair", 1, 1000)
                  ->default_str(std::to_string(a->pairs));
              add_int_option(app, "--open-lookup", a->open_lookup,
                             "Instead: fill a store with this many small pages, then time open + first lookup",
                             int64_t(0), int64_t(100000000), "0 = off; else at least 8");
              add_int_option(app, "--restore-pages", a->restore_pages,
                             "Instead: store this many qwen3-0.6b-sized pages, reopen, time restoring them "
                             "against the read and host->device ceilings",
                             0, 1 << 20, "0 = off");
              add_int_option(app, "--reps", a->reps, "--restore-pages: repetitions (medians reported)", 1, 1000)
                  ->default_str(std::to_string(a->reps));
              app.add_flag("--json", a->json, "Print one line of JSON");
              return [a, &app] {
                if (Status st = check_bench_kv_args(*a); !st.is_ok()) return fail(st.message());
                // --open-lookup and --restore-pages build their own store and pool (no model): a flag
                // they would ignore is refused by name instead.
                if (a->restore_pages > 0 || a->open_lookup > 0) {
                  const char* mode = a->restore_pages > 0 ? "--restore-pages" : "--open-lookup";
                  std::vector<std::string> used = {"--kv-store", "--json", "--open-lookup", "--restore-pages", "--help"};
                  if (a->restore_pages > 0) used.insert(used.end(), {"--reps", "--device"});
                  for (const CLI::Option* o : app.get_options()) {
                    if (o->count() == 0) continue;
                    if (o->get_lnames().empty()) continue;
                    const std::string name = "--" + o->get_lnames().front();
                    if (std::find(used.begin(), used.end(), name) == used.end())
                      return fail(name + " has no effect with " + std::string(mode) +
                                  " (it measures a store and pool of its own)");
                  }
                }
                if (a->restore_pages > 0) return bench_restore(*a);
                return a->open_lookup > 0 ? bench_open_lookup(*a) : bench_overhead(*a);
              };
            });

}  // namespace
}  // namespace anvil::cli
