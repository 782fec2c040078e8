// anvil kv ls|show|rm|gc|verify|export: look after the durable KV store (src/kvstore/).
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/kv_options.h"
#include "kvstore/kvstore.h"
#include "kvstore/session_kind.h"

namespace anvil::cli {
namespace {

struct KvArgs {
  std::string dir, name, out, max;
  bool json = false;
  CLI::App *ls = nullptr, *show = nullptr, *rm = nullptr, *gc = nullptr, *verify = nullptr, *exp = nullptr;
};

std::string when(int64_t us) {
  std::time_t t = std::time_t(us / 1000000);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%d %H:%M:%S", std::gmtime(&t));
  return b;
}

// MiB with one decimal; below 1 MiB in KiB, below 1 KiB in bytes (a tiny --max read "0.0 MiB").
std::string mib(int64_t bytes) {
  char b[32];
  if (bytes < 1024)
    std::snprintf(b, sizeof b, "%lld B", (long long)bytes);
  else if (bytes < (1 << 20))
    std::snprintf(b, sizeof b, "%.1f KiB", double(bytes) / 1024);
  else
    std::snprintf(b, sizeof b, "%.1f MiB", double(bytes) / (1 << 20));
  return b;
}

int run_kv(KvArgs& a) {
  KVStoreOptions o;
  o.dir = a.dir.empty() ? default_kv_store_dir() : a.dir;
  if (!a.max.empty()) {
    auto m = parse_size(a.max);
    if (!m.is_ok()) return fail("--max: " + m.status().message());
    o.max_bytes = *m;
  }
  o.repair = false;  // a damaged catalog is reported here, never moved aside
  // Maintenance never creates a store: a mistyped --kv-store is said, not made.
  std::error_code ec;
  if (!std::filesystem::exists(o.dir, ec)) {
    if (a.ls->parsed()) {
      if (a.json)
        std::printf("%s\n", nlohmann::ordered_json{{"dir", o.dir}, {"exists", false}, {"pages", 0}, {"page_bytes", 0},
                                                   {"segments", 0}, {"segment_file_bytes", 0},
                                                   {"sessions", nlohmann::json::array()}}
                                .dump()
                                .c_str());
      else
        std::printf("%s: no store there yet (0 sessions)\n", o.dir.c_str());
      return 0;
    }
    return fail("no KV store at " + o.dir + " (the directory does not exist)");
  }
  // Nor is a file one: said as such, not as a failure to create the store there.
  if (!std::filesystem::is_directory(o.dir, ec))
    return fail("no KV store at " + o.dir + " (it is not a directory)" +
                (a.dir.empty() ? "" : ": --kv-store names a store's directory"));
  auto opened = KVStore::open(o);
  if (!opened.is_ok()) {
    if (a.verify->parsed() && opened.status().code() == StatusCode::kCorrupt) {
      if (a.json)
        std::printf("%s\n", nlohmann::ordered_json{{"records", 0}, {"problems", {opened.status().message()}}}.dump().c_str());
      else
        std::printf("%s\nverify: 0 records checked, 1 problems\n", opened.status().message().c_str());
      return 1;
    }
    if (::access(o.dir.c_str(), W_OK) != 0)
      return fail(opened.status().message() + " (" + o.dir +
                  " is not writable: the store's catalog needs write access even to be read, for its "
                  "write-ahead log and locks)");
    return fail(opened.status().message());
  }
  KVStore& st = **opened;
  if (a.ls->parsed()) {
    StoreStats s = st.stats();
    auto sessions = st.list_sessions();
    if (a.json) {
      nlohmann::ordered_json j;
      j["dir"] = o.dir;
      j["pages"] = s.pages;
      j["page_bytes"] = s.page_bytes;
      j["segments"] = s.segments;
      j["segment_file_bytes"] = s.segment_file_bytes;
      j["sessions"] = nlohmann::json::array();
      for (auto& x : sessions) {
        if (!x.damaged.empty())  // listed, marked: its token ids are not trusted
          j["sessions"].push_back({{"name", x.name}, {"damaged", true},
                                   {"error", "session '" + x.name + "' is damaged (" + x.damaged + "); remove it with anvil kv rm " + x.name},
                                   {"updated", when(x.updated_us)}});
        else
          j["sessions"].push_back({{"name", x.name}, {"type", session_kind_name(session_kind(x.meta))},
                                   {"tokens", x.tokens.size()}, {"durable_tokens", x.durable_pos},
                                   {"updated", when(x.updated_us)}});
      }
      std::printf("%s\n", j.dump().c_str());
      return 0;
    }
    size_t damaged = 0;
    for (auto& x : sessions) damaged += !x.damaged.empty();
    std::printf("%s: %lld pages (%s), %lld segments (%s on disk), %zu sessions%s\n", o.dir.c_str(),
                (long long)s.pages, mib(s.page_bytes).c_str(), (long long)s.segments,
                mib(s.segment_file_bytes).c_str(), sessions.size(),
                damaged ? (" (" + std::to_string(damaged) + " damaged: see anvil kv verify)").c_str() : "");
    for (auto& x : sessions) {
      if (!x.damaged.empty())
        std::printf("  %-24s DAMAGED: %s (anvil kv verify; anvil kv rm %s), updated %s UTC\n", x.name.c_str(),
                    x.damaged.c_str(), x.name.c_str(), when(x.updated_us).c_str());
      else
        std::printf("  %-24s %-10s %7zu tokens, %7d durable, updated %s UTC\n", x.name.c_str(),
                    session_kind_name(session_kind(x.meta)), x.tokens.size(), x.durable_pos,
                    when(x.updated_us).c_str());
    }
    return 0;
  }
  if (a.show->parsed()) {
    auto s = st.get_session(a.name);
    if (!s.is_ok()) return fail(s.status().message());
    if (!*s) return fail("no session named '" + a.name + "' in " + o.dir);
    const SessionInfo& x = **s;
    nlohmann::ordered_json j;
    j["name"] = x.name;
    j["fingerprint"] = x.fingerprint.hex();
    j["type"] = session_kind_name(session_kind(x.meta));
    j["tokens"] = x.tokens.size();
    j["durable_tokens"] = x.durable_pos;
    j["tail"] = {{"first_pos", x.tail_first}, {"tokens", x.tail_n}};
    j["updated"] = when(x.updated_us);
    j["ids"] = x.tokens;
    std::printf("%s\n", a.json ? j.dump().c_str() : j.dump(2).c_str());
    return 0;
  }
  if (a.rm->parsed()) {
    Status s = st.remove_session(a.name);
    if (!s.is_ok()) return fail(s.message());
    if (a.json)
      std::printf("%s\n", nlohmann::ordered_json{{"removed", a.name}}.dump().c_str());
    else
      std::printf("removed session %s (its pages stay until gc evicts them)\n", a.name.c_str());
    return 0;
  }
  if (a.gc->parsed()) {
    const int64_t before = st.stats().pages;
    auto r = st.gc();
    if (!r.is_ok()) return fail(r.status().message());
    StoreStats s = st.stats();
    // Sessions' KV is never evicted (kvstore.h, invariant 7): a cap below it is not met, and said so.
    if (uint64_t(s.live_bytes) > o.max_bytes)
      std::fprintf(stderr,
                   "[anvil] kv gc: %s live is over the cap of %s: what is left is the KV of saved sessions, which "
                   "is never evicted; remove sessions (anvil kv rm NAME) to go under it\n",
                   mib(s.live_bytes).c_str(), mib(int64_t(o.max_bytes)).c_str());
    if (a.json)
      std::printf("%s\n", nlohmann::ordered_json{{"evicted_pages", before - s.pages},
                                                 {"reclaimed_bytes", *r},
                                                 {"pages", s.pages},
                                                 {"segment_file_bytes", s.segment_file_bytes},
                                                 {"live_bytes", s.live_bytes}}
                              .dump()
                              .c_str());
    else
      std::printf("gc: evicted %lld pages, reclaimed %s; now %lld pages, %s live, %s on disk\n",
                  (long long)(before - s.pages), mib(*r).c_str(), (long long)s.pages, mib(s.live_bytes).c_str(),
                  mib(s.segment_file_bytes).c_str());
    return 0;
  }
  if (a.verify->parsed()) {
    std::vector<std::string> problems;
    int64_t n = 0;
    Status s = st.verify(&problems, &n);
    if (!s.is_ok()) return fail(s.message());
    if (a.json) {
      std::printf("%s\n", nlohmann::ordered_json{{"records", n}, {"problems", problems}}.dump().c_str());
    } else {
      for (auto& p : problems) std::printf("%s\n", p.c_str());
      std::printf("verify: %lld records checked, %zu problems\n", (long long)n, problems.size());
    }
    return problems.empty() ? 0 : 1;
  }
  if (a.exp->parsed()) {
    if (a.out.empty()) return fail("export: give -o FILE.safetensors");
    Status s = st.export_session(a.name, a.out);
    if (!s.is_ok()) return fail(s.message());
    if (a.json)
      std::printf("%s\n", nlohmann::ordered_json{{"wrote", a.out}}.dump().c_str());
    else
      std::printf("wrote %s\n", a.out.c_str());
    return 0;
  }
  return fail("kv: give a subcommand: ls, show, rm, gc, verify or export");
}

Command reg("kv", "Inspect and maintain the durable KV store: ls, show, rm, gc, verify, export", 60,
            [](CLI::App& app) -> std::function<int()> {
              auto a = std::make_shared<KvArgs>();
              app.require_subcommand(1);
              app.fallthrough();
              app.add_option("--kv-store", a->dir, "Store directory (default: $XDG_CACHE_HOME/anvil/kv or ~/.cache/anvil/kv)");
              auto common = [&](CLI::App* sub) {
                sub->add_option("--kv-store", a->dir, "Store directory (default: $XDG_CACHE_HOME/anvil/kv or ~/.cache/anvil/kv)");
                sub->add_flag("--json", a->json, "Print JSON");
                return sub;
              };
              a->ls = common(app.add_subcommand("ls", "List the store's sessions and size"));
              a->show = common(app.add_subcommand("show", "Show one session (its tokens, durable position)"));
              a->show->add_option("name", a->name, "Session name")->required();
              a->rm = common(app.add_subcommand("rm", "Remove a session (its pages become evictable)"));
              a->rm->add_option("name", a->name, "Session name")->required();
              a->gc = common(app.add_subcommand("gc", "Evict LRU unreferenced pages under the cap; compact segments"));
              a->gc->add_option("--max", a->max, "Size cap for this gc (default 8G)");
              a->verify = common(app.add_subcommand(
                  "verify", "Check the catalog and every record's checksum; exit 1 when anything is wrong"));
              a->exp = common(app.add_subcommand("export", "Write one session's KV as a standalone safetensors file"));
              a->exp->add_option("name", a->name, "Session name")->required();
              a->exp->add_option("-o,--out", a->out, "Output .safetensors file")->required();
              return [a] { return run_kv(*a); };
            });

}  // namespace
}  // namespace anvil::cli
