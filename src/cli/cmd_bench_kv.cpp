// anvil bench-kv: what the durable KV store costs and saves (docs/benchmarks.md).
//   default        decode with the store off and on, back to back in one process (off, on, off, on,
//                  ...; each run a fresh random prompt so every page is new and persisted): median and
//                  p99 per-token time of each, bytes written against the unique KV they carry.
//   --open-lookup N  a store of N small pages: time to open it (recovery included) and restore one.
// Time to first token after a restart needs two processes: scripts/bench_kv.sh runs them.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

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
  int prompt = 512, n = 128, pairs = 3;
  int64_t open_lookup = 0;
  bool json = false;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5));
  return v[i];
}

int bench_open_lookup(BenchKvArgs& a) {
  const std::string dir = a.kv.dir.empty() ? "/tmp/anvil-bench-kv-open" : a.kv.dir;
  std::filesystem::remove_all(dir);
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

int bench_overhead(BenchKvArgs& a) {
  a.model.no_prefix_cache = true;  // every run prefills and persists new pages
  if (a.model.ctx < a.prompt + a.n) a.model.ctx = a.prompt + a.n;
  auto stack = build_stack(a.model);
  if (!stack.is_ok()) return fail(stack.status().message());
  Stack& s = *stack;
  if (a.kv.dir.empty()) a.kv.dir = "/tmp/anvil-bench-kv-overhead";
  std::filesystem::remove_all(a.kv.dir);
  auto attached = attach_kv_store(a.kv, s);
  if (!attached.is_ok()) return fail(attached.status().message());
  AttachedStore& store = *attached;
  if (!store) return fail("bench-kv needs the store (drop --no-kv-store)");
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
    req.prompt.assign(size_t(a.prompt), 0);
    for (auto& t : req.prompt) t = int32_t(rng() % uint64_t(c.vocab_size));
    auto seq = s.engine->seq_create();
    if (!seq.is_ok()) return fail(seq.status().message());
    std::vector<Clock::time_point> stamps;
    stamps.reserve(size_t(a.n));
    auto r = generate(*s.engine, *seq, req, [&](int32_t) {
      stamps.push_back(Clock::now());
      return true;
    });
    if (!r.is_ok()) return fail(r.status().message());
    s.engine->seq_release(*seq);
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
  std::printf("%s\n", a.json ? j.dump().c_str() : j.dump(2).c_str());
  return 0;
}

Command reg("bench-kv", "Benchmark the durable KV store: decode overhead on vs off, open+lookup time", 55,
            [](CLI::App& app) -> std::function<int()> {
              auto a = std::make_shared<BenchKvArgs>();
              add_model_options(app, a->model);
              add_kv_store_options(app, a->kv, false);
              app.add_option("--prompt-tokens", a->prompt, "Prompt length in tokens (random ids)")->capture_default_str();
              app.add_option("-n,--max-tokens", a->n, "Tokens to generate per run")->capture_default_str();
              app.add_option("--pairs", a->pairs, "Timed off/on run pairs after one warm-up pair")
                  ->capture_default_str();
              app.add_option("--open-lookup", a->open_lookup,
                             "Instead: fill a store with this many small pages, then time open + first lookup");
              app.add_flag("--json", a->json, "Print one line of JSON");
              return [a] { return a->open_lookup > 0 ? bench_open_lookup(*a) : bench_overhead(*a); };
            });

}  // namespace
}  // namespace anvil::cli
