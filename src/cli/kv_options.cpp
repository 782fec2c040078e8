#include "cli/kv_options.h"

#include <cstdio>

namespace anvil::cli {

void add_kv_store_options(CLI::App& app, KVStoreFlags& f, bool session_flags, bool off_flag) {
  app.add_option("--kv-store", f.dir,
                 "Durable KV store directory (default: $XDG_CACHE_HOME/anvil/kv or ~/.cache/anvil/kv)")
      ->check([](const std::string& v) {
        return v.empty() ? std::string("an empty directory name (leave --kv-store out for the default store)")
                         : std::string();
      });
  if (off_flag) app.add_flag("--no-kv-store", f.off, "Do not persist or restore KV pages");
  app.add_option("--kv-store-max", f.max, "Size cap of the store (LRU eviction of unreferenced pages)")
      ->capture_default_str();
  app.add_option("--kv-durability", f.durability,
                 "none (no fsync), interval (fsync+commit every --kv-flush-ms), sync (after every page)")
      ->capture_default_str();
  add_int_option(app, "--kv-flush-ms", f.flush_ms, "Flush the store at least this often", 1, INT32_MAX)
      ->default_str(std::to_string(f.flush_ms));
  add_int_option(app, "--kv-flush-pages", f.flush_pages, "... or after this many pages", 1, INT32_MAX)
      ->default_str(std::to_string(f.flush_pages));
  add_int_option(app, "--kv-queue", f.queue_pages, "Pages the store's writer queue holds", 2, kMaxKVQueuePages)
      ->default_str(std::to_string(f.queue_pages));
  if (session_flags) {
    const auto not_empty = [](const std::string& v) { return v.empty() ? std::string("an empty session name") : std::string(); };
    app.add_option("--session", f.session,
                   "Record this run as session NAME in the store (a new name: 1-128 of A-Z a-z 0-9 . _ -)")
        ->check(not_empty);
    app.add_flag("--resume", f.resume, "Continue session NAME (the prompt, if any, is appended)");
    app.add_option("--fork", f.fork, "Start a new session NEW from session NAME's tokens (NAME is unchanged)")
        ->check(not_empty);
  }
  app.add_flag("--profile", f.profile, "Print the store's counters to stderr at the end");
}

Result<KVStoreOptions> kv_store_options(const KVStoreFlags& f) {
  KVStoreOptions o;
  o.dir = f.dir.empty() ? default_kv_store_dir() : f.dir;
  auto max = parse_size(f.max);
  if (!max.is_ok()) return invalid_argument("--kv-store-max: " + max.status().message());
  o.max_bytes = *max;
  ANVIL_ASSIGN_OR_RETURN(o.durability, parse_durability(f.durability));
  if (f.flush_ms < 1) return invalid_argument("--kv-flush-ms must be >= 1");
  if (f.flush_pages < 1) return invalid_argument("--kv-flush-pages must be >= 1");
  if (f.queue_pages < 2 || f.queue_pages > kMaxKVQueuePages)
    return invalid_argument(
        int_range_error("--kv-queue", "2", std::to_string(kMaxKVQueuePages), "", std::to_string(f.queue_pages)));
  o.flush_ms = f.flush_ms;
  o.flush_pages = f.flush_pages;
  o.queue_pages = f.queue_pages;
  return o;
}

void AttachedStore::finish() {
  if (!store_) return;
  if (engine_) engine_->persist_dropped();  // pages dropped under a burst, still in the prefix cache
  store_->flush();
}

AttachedStore::~AttachedStore() {
  if (!store_) return;
  finish();
  if (engine_) {
    store_->reap(engine_->pool(), true);
    engine_->set_page_store(nullptr);
  }
}

Result<AttachedStore> attach_kv_store(const KVStoreFlags& f, Stack& s) {
  AttachedStore a;
  if (f.off) {
    if (!f.session.empty() || f.resume || !f.fork.empty())
      return invalid_argument("--session/--resume/--fork need the KV store (drop --no-kv-store)");
    return a;
  }
  if (!s.backend->supports_page_store()) {
    // A backend without the store's device->host path (or CUDA with ANVIL_CUDA_PAGE_STORE=0): a
    // named session or an explicit --kv-store is refused; the default store is simply off, said once.
    if (!f.session.empty() || f.resume || !f.fork.empty() || !f.dir.empty())
      return unsupported("the durable KV store is off on " + s.backend->name() +
                         "; use --device cpu for --kv-store/--session/--resume/--fork (on CUDA, unset "
                         "ANVIL_CUDA_PAGE_STORE=0)");
    std::fprintf(stderr, "[anvil] KV store: off (not supported on %s)\n", s.backend->name().c_str());
    return a;
  }
  ANVIL_ASSIGN_OR_RETURN(KVStoreOptions o, kv_store_options(f));
  auto st = KVStore::open(o);
  if (!st.is_ok()) {
    // The default store is implicit: one that cannot be opened (a read-only home, a full disk) is
    // off, said once; a store the user named, or a session, needs it.
    if (f.dir.empty() && f.session.empty()) {
      std::fprintf(stderr, "[anvil] KV store: off (the default store %s cannot be opened: %s)\n", o.dir.c_str(),
                   st.status().message().c_str());
      return a;
    }
    // (The store's own messages that already name the flag are not prefixed twice.)
    if (st.status().message().rfind("--kv-store", 0) == 0) return st.status();
    return st.status().with_context("--kv-store " + o.dir);
  }
  a.store_ = std::move(st).value();
  const KVCacheView& kv = s.engine->pool().view();
  ANVIL_RETURN_IF_ERROR(a.store_->attach(*s.backend, kv, s.engine->cache_root()));
  s.engine->set_page_store(a.store_.get());
  a.engine_ = s.engine.get();
  return a;
}

static std::string bad_name(const char* flag, const std::string& name) {
  return std::string(flag) + " '" + name +
         "': a session name is 1 to 128 of the letters A-Z a-z, digits, '.', '_' and '-', not starting with "
         "'.' or '-' (the server's rule: names appear in its URLs)";
}

// Why the command recording `want` does not take stored session `info`, of another kind, and what does.
static std::string other_kind(const KVStoreFlags& f, const SessionInfo& info, SessionKind want) {
  const SessionKind have = session_kind(info.meta);
  const char* cmd = want == SessionKind::kCompletion ? "anvil generate" : "anvil run";
  const std::string flags = "--session " + f.session + (f.fork.empty() ? " --resume" : " --fork " + f.fork);
  std::string m = "session '" + f.session + "' " + (f.resume || !f.fork.empty() ? "" : "already exists and ") +
                  "holds " + session_kind_what(have);
  switch (have) {
    case SessionKind::kCompletion:
      m += ", which " + std::string(cmd) + " cannot continue: continue it with anvil generate " + flags;
      break;
    case SessionKind::kChat:
    case SessionKind::kRunText:
      if (want == SessionKind::kCompletion)
        m += ", which anvil generate cannot continue (it would overwrite the " +
             std::string(have == SessionKind::kChat ? "conversation" : "text") + "): continue it with anvil run " +
             flags;
      else if (have == SessionKind::kChat)
        m += ", and this model has no chat template: anvil run (in completion mode) cannot continue it";
      else
        m += ", and this model has a chat template: anvil run cannot continue that text as a conversation";
      break;
    case SessionKind::kUnreadable:
      m += ": neither anvil generate nor anvil run continues it; remove it with anvil kv rm " + f.session;
      break;
  }
  if (!f.resume && f.fork.empty() && have != SessionKind::kUnreadable) m += ", or `anvil kv rm " + f.session + "`";
  return m + " (it is left as it is)";
}

Result<SessionPlan> plan_session(const KVStoreFlags& f, KVStore* store, SessionKind kind, const SessionCheck& accept) {
  SessionPlan p;
  if (f.session.empty()) {
    if (f.resume || !f.fork.empty()) return invalid_argument("--resume and --fork need --session NAME");
    return p;
  }
  if (f.resume && !f.fork.empty()) return invalid_argument("give one of --resume and --fork NEW");
  // Claimed before it is read, so that no other process records it in between (held until the
  // recording ends; a session only read, as --fork's source, is let go at once).
  if (!f.fork.empty() && !valid_session_name(f.fork)) return invalid_argument(bad_name("--fork", f.fork));
  ANVIL_RETURN_IF_ERROR(store->claim_session(f.session));
  if (!f.fork.empty()) ANVIL_RETURN_IF_ERROR(store->claim_session(f.fork));
  ANVIL_ASSIGN_OR_RETURN(auto info, store->get_session(f.session));
  if (f.resume || !f.fork.empty()) {
    if (!info) return not_found("no session named '" + f.session + "' in " + store->dir());
    if (info->fingerprint != store->fingerprint())
      return invalid_argument("session '" + f.session +
                              "' was recorded with another model or KV layout (--kv-dtype, --page-size)");
    if (session_kind(info->meta) != kind) return invalid_argument(other_kind(f, *info, kind));  // before a fork
    if (accept) ANVIL_RETURN_IF_ERROR(accept(*info));
    p.history = info->tokens;
    p.meta = info->meta;
    p.resumed = true;
    if (!f.fork.empty()) {
      ANVIL_RETURN_IF_ERROR(store->fork_session(f.session, f.fork));
      store->release_session(f.session);
      p.name = f.fork;
    } else {
      p.name = f.session;
    }
  } else {
    if (!valid_session_name(f.session)) return invalid_argument(bad_name("--session", f.session));
    if (info && session_kind(info->meta) != kind) return invalid_argument(other_kind(f, *info, kind));
    if (info)
      return invalid_argument("session '" + f.session +
                              "' already exists: --resume to continue it, --fork NEW to branch from it, or "
                              "`anvil kv rm " + f.session + "`");
    p.name = f.session;
  }
  return p;
}

Result<StoreSession> open_store_session(const KVStoreFlags& f, Stack& s, SessionKind kind, const SessionCheck& accept) {
  auto attached = attach_kv_store(f, s);
  if (!attached.is_ok()) return attached.status();
  StoreSession r{std::move(attached).value(), {}};  // AttachedStore moves by construction only
  if (r.store) {
    ANVIL_ASSIGN_OR_RETURN(r.plan, plan_session(f, r.store.get(), kind, accept));
  }
  return r;
}

nlohmann::ordered_json kv_profile_json(const KVStore& store) {
  const KVStoreCounters& c = store.counters();
  const double wall = store.attached_seconds();
  nlohmann::ordered_json j;
  j["pages_enqueued"] = c.pages_enqueued.load();
  j["pages_written"] = c.pages_written.load();
  j["pages_deduplicated"] = c.pages_deduped.load();
  j["pages_dropped"] = c.pages_dropped.load();
  j["pages_reoffered"] = c.pages_reoffered.load();
  j["tails_written"] = c.tails_written.load();
  j["bytes_written"] = c.bytes_written.load();
  j["fsyncs"] = c.fsyncs.load();
  j["transactions"] = c.transactions.load();
  j["write_errors"] = c.write_errors.load();
  j["queue_high_water"] = c.queue_high_water.load();
  j["writer_busy_pct"] = wall > 0 ? 100.0 * double(c.writer_busy_ns.load()) * 1e-9 / wall : 0.0;
  j["writer_sync_ms"] = double(c.sync_ns.load()) * 1e-6;
  j["writer_commit_ms"] = double(c.commit_ns.load()) * 1e-6;
  j["decode_blocked_ms"] = double(c.decode_blocked_ns.load()) * 1e-6;
  j["restored_pages"] = c.restored_pages.load();
  j["restored_bytes"] = c.restored_bytes.load();
  j["restore_ms"] = double(c.restore_ns.load()) * 1e-6;
  j["restore_misses"] = c.restore_misses.load();
  j["restore_corrupt"] = c.restore_corrupt.load();
  j["pages_evicted"] = c.pages_evicted.load();
  j["over_cap_warnings"] = c.over_cap_warnings.load();
  return j;
}

void print_kv_profile(const KVStore& store, int store_prompt_tokens, std::FILE* out) {
  auto j = kv_profile_json(store);
  std::fprintf(out, "[anvil] kv store %s\n", store.dir().c_str());
  std::fprintf(out, "  prompt tokens from the store   %d\n", store_prompt_tokens);
  for (auto& [k, v] : j.items()) std::fprintf(out, "  %-30s %s\n", k.c_str(), v.dump().c_str());
}

}  // namespace anvil::cli
