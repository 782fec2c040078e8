// The durable KV store as the model-running subcommands see it: its flags (--kv-store,
// --no-kv-store, --kv-store-max, --kv-durability, --session/--resume/--fork, --profile), opening it
// and attaching it to a stack's engine, and printing its counters.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/common.h"
#include "kvstore/kvstore.h"
#include "kvstore/session_kind.h"

namespace anvil::cli {

struct KVStoreFlags {
  std::string dir;  // empty: default_kv_store_dir()
  bool off = false;
  std::string max = "8G";
  std::string durability = "interval";
  int flush_ms = 100;
  int flush_pages = 64;
  int queue_pages = 256;
  std::string session, fork;
  bool resume = false;
  bool profile = false;
};
// `off_flag`: whether --no-kv-store is offered (bench-kv measures the store and has none).
void add_kv_store_options(CLI::App& app, KVStoreFlags& f, bool session_flags = true, bool off_flag = true);
// The --kv-store directory (flag or default) and the store options the flags describe.
Result<KVStoreOptions> kv_store_options(const KVStoreFlags& f);

// A store attached to a stack's engine. Destroy it before the stack (declare it after): it
// finishes (below), takes back every pool page it holds, and detaches itself from the engine.
class AttachedStore {
 public:
  AttachedStore() = default;
  ~AttachedStore();
  AttachedStore(AttachedStore&&) = default;
  KVStore* get() const { return store_.get(); }
  KVStore* operator->() const { return store_.get(); }
  explicit operator bool() const { return bool(store_); }
  // Hands the store every page it dropped that the engine's prefix cache still holds
  // (Engine::persist_dropped), then flushes: all of it committed. The destructor does it too.
  void finish();

 private:
  friend Result<AttachedStore> attach_kv_store(const KVStoreFlags& f, Stack& s);
  std::unique_ptr<KVStore> store_;
  Engine* engine_ = nullptr;
};
// Opens the store unless --no-kv-store (then the result holds none).
Result<AttachedStore> attach_kv_store(const KVStoreFlags& f, Stack& s);

// Session flags resolved against the store: the tokens to start from (the stored session's, for
// --resume/--fork) and the name to record under. `kind`: what the command records (session_kind.h:
// anvil generate a completion document, anvil run a conversation, or its text for a model without a
// chat template); a stored session of another kind is refused (--resume, --fork from it, or its name
// for a new session), naming what it holds and what continues it, before anything is written: the
// command would record its own meta over the session's (a conversation lost to anvil generate).
struct SessionPlan {
  std::string name;                 // empty: no session
  std::vector<int32_t> history;     // tokens of the resumed/forked session
  std::string meta;                 // its meta (anvil run's conversation)
  bool resumed = false;
};
// `accept`, when given, vets a stored session that is to be continued (--resume, --fork from it)
// once its kind is right, before a fork is made: an error from it is the plan's (anvil run: a
// --system other than the conversation's own).
using SessionCheck = std::function<Status(const SessionInfo&)>;
Result<SessionPlan> plan_session(const KVStoreFlags& f, KVStore* store, SessionKind kind,
                                 const SessionCheck& accept = {});

// attach_kv_store, then plan_session when a store is open: what a model-running subcommand does
// before its first sequence. Declare the result after the stack (the store goes first).
struct StoreSession {
  AttachedStore store;
  SessionPlan plan;
};
Result<StoreSession> open_store_session(const KVStoreFlags& f, Stack& s, SessionKind kind,
                                        const SessionCheck& accept = {});

// --profile: the store's counters, one line each, to `out`; and the same as JSON.
void print_kv_profile(const KVStore& store, int store_prompt_tokens, std::FILE* out);
nlohmann::ordered_json kv_profile_json(const KVStore& store);

}  // namespace anvil::cli
