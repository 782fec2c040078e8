// The durable KV store inside `anvil serve`: a prompt served before a restart is a cache hit after
// it (usage and /metrics), and sessions (chat and completion) are created, continued, listed and
// deleted, across a restart too. One store directory, two server processes one after the other.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/wait.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "kvstore/catalog.h"
#include "kvstore/kvstore.h"
#include "kvstore/sqlite_db.h"
#include "server_process.h"

using anvil::test::RawConnection;
using anvil::test::ServerProcess;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Srv {
  std::unique_ptr<ServerProcess> p;
  explicit Srv(const std::vector<std::string>& extra, const std::string& np = "4") {
    std::vector<std::string> args = {"--synthetic", "tiny", "-c", "512", "-np", np, "-t", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    p = std::make_unique<ServerProcess>(args);
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", p->port());
    c.set_read_timeout(60, 0);
    return c;
  }
  json post(const std::string& path, const json& body, int* status) const {
    auto r = client().Post(path.c_str(), body.dump(), "application/json");
    *status = r ? r->status : -1;
    return r ? json::parse(r->body, nullptr, false) : json();
  }
  json get(const std::string& path, int* status) const {
    auto r = client().Get(path.c_str());
    *status = r ? r->status : -1;
    return r ? json::parse(r->body, nullptr, false) : json();
  }
  int del(const std::string& path, json* body = nullptr) const {
    auto r = client().Delete(path.c_str());
    if (r && body) *body = json::parse(r->body, nullptr, false);
    return r ? r->status : -1;
  }
  double metric(const std::string& name) const {
    auto r = client().Get("/metrics");
    if (!r) return -1;
    std::smatch m;
    std::regex re("\n" + name + " ([0-9.e+-]+)\n");
    std::string body = "\n" + r->body;
    return std::regex_search(body, m, re) ? std::stod(m[1]) : -1;
  }
};

json chat(const std::string& user, const std::string& session, int max_tokens = 6) {
  json b = {{"messages", {{{"role", "user"}, {"content", user}}}}, {"max_tokens", max_tokens}, {"temperature", 0}};
  if (!session.empty()) b["session"] = session;
  return b;
}

json find_session(const json& list, const std::string& name) {
  for (const json& s : list["data"])
    if (s["id"] == name) return s;
  return json();
}

// A prompt of several full 16-token pages.
const std::string kDoc =
    "The durable store keeps every full page of key and value vectors on disk, so that a prompt seen before "
    "a restart is not computed again after it. This sentence only makes the prompt long enough.";

}  // namespace

TEST(ServeStore, RestartKeepsPrefixCacheAndSessions) {
  const std::string dir = (fs::temp_directory_path() / ("anvil_serve_store_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  const std::vector<std::string> store = {"--kv-store", dir};
  json first, doc_before, conv_before;
  int st = 0;
  {
    Srv a(store);
    ASSERT_TRUE(a.p->ok()) << a.p->startup_output();
    first = a.post("/v1/completions", {{"prompt", kDoc}, {"max_tokens", 8}, {"temperature", 0}}, &st);
    ASSERT_EQ(st, 200) << first;
    EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << "a fresh store";
    // A chat session: two turns; the second sends only its new message.
    auto t1 = a.post("/v1/chat/completions", chat("Hello, who are you?", "conv"), &st);
    ASSERT_EQ(st, 200) << t1;
    auto t2 = a.post("/v1/chat/completions", chat("Tell me more.", "conv"), &st);
    ASSERT_EQ(st, 200) << t2;
    EXPECT_GT(t2["usage"]["prompt_tokens"].get<int>(), t1["usage"]["prompt_tokens"].get<int>() + 5)
        << "the second turn's prompt holds the first";
    EXPECT_GT(t2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
    // A completion session: the prompt is appended to its tokens.
    auto d1 = a.post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 6}, {"temperature", 0},
                                         {"session", "doc"}, {"ignore_eos", true}}, &st);
    ASSERT_EQ(st, 200) << d1;
    auto list = a.get("/v1/sessions", &st);
    ASSERT_EQ(st, 200) << list;
    doc_before = find_session(list, "doc");
    conv_before = find_session(list, "conv");
    ASSERT_FALSE(doc_before.is_null() || conv_before.is_null()) << list;
    EXPECT_EQ(doc_before["type"], "completion");
    EXPECT_EQ(doc_before["tokens"], d1["usage"]["prompt_tokens"].get<int>() + 6);  // every sampled token
    EXPECT_EQ(doc_before["durable_tokens"], doc_before["tokens"].get<int>() - 1);  // the last has no KV yet
    EXPECT_EQ(conv_before["type"], "chat");
    EXPECT_EQ(conv_before["messages"], 4);
    EXPECT_EQ(conv_before["tokens"], t2["usage"]["prompt_tokens"].get<int>() + t2["usage"]["completion_tokens"].get<int>());
    // Sessions of the wrong kind, and a name in use, are refused naming the parameter.
    auto e = a.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}, {"session", "conv"}}, &st);
    EXPECT_EQ(st, 400);
    EXPECT_EQ(e["error"]["param"], "session");
    e = a.post("/v1/chat/completions", chat("x", "doc", 1), &st);
    EXPECT_EQ(st, 400);
    EXPECT_EQ(e["error"]["param"], "session");
    e = a.post("/v1/chat/completions", chat("x", "no/slash", 1), &st);
    EXPECT_EQ(st, 400);
    EXPECT_EQ(e["error"]["param"], "session");
    {
      RawConnection conn(a.p->port());
      std::string b = chat("Write a long story", "busy", 400).dump();
      ASSERT_TRUE(conn.send_all("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                "Content-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b));
      for (int i = 0; i < 100 && a.metric("anvil_requests_running") < 1; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      e = a.post("/v1/chat/completions", chat("me too", "busy", 1), &st);
      EXPECT_EQ(st, 409) << e;
      EXPECT_EQ(e["error"]["code"], "session_busy");
      EXPECT_EQ(a.del("/v1/sessions/busy"), 409);
    }  // the client goes away: its turn is cancelled and the session freed
    for (int i = 0; i < 100; ++i) {
      a.post("/v1/chat/completions", chat("again", "busy", 1), &st);
      if (st != 409) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(st, 200);
    EXPECT_EQ(a.p->terminate(30), 0);
  }
  {
    // Restored on demand (--kv-warm 0: nothing loaded before the first request; the default is
    // checked by the third server below).
    std::vector<std::string> args = store;
    args.insert(args.end(), {"--kv-warm", "0"});
    Srv b(args);
    ASSERT_TRUE(b.p->ok()) << b.p->startup_output();
    EXPECT_EQ(b.metric("anvil_kv_store_pages_restored_total"), 0) << "nothing restored before a request";
    // The same prompt after the restart: its full pages come from the store, the output is the same.
    auto again = b.post("/v1/completions", {{"prompt", kDoc}, {"max_tokens", 8}, {"temperature", 0}}, &st);
    ASSERT_EQ(st, 200) << again;
    const int n = again["usage"]["prompt_tokens"];
    const int cached = again["usage"]["prompt_tokens_details"]["cached_tokens"];
    EXPECT_EQ(cached, (n - 1) / 16 * 16) << "every full page but the one holding the last token";
    EXPECT_GE(cached, 32);
    EXPECT_EQ(again["choices"][0]["text"], first["choices"][0]["text"]);
    EXPECT_GE(b.metric("anvil_kv_store_pages_restored_total"), cached / 16);
    EXPECT_GE(b.metric("anvil_prompt_tokens_from_store_total"), cached);
    EXPECT_GE(b.metric("anvil_prompt_tokens_cached_total"), cached);
    for (const char* m : {"anvil_kv_store_pages_written_total", "anvil_kv_store_bytes_written_total",
                          "anvil_kv_store_fsyncs_total", "anvil_kv_store_transactions_total",
                          "anvil_kv_store_queue_high_water", "anvil_kv_store_writer_busy_seconds_total",
                          "anvil_kv_store_decode_blocked_seconds_total"})
      EXPECT_GE(b.metric(m), 0) << m << " missing";
    // The sessions survived, as they were.
    auto list = b.get("/v1/sessions", &st);
    ASSERT_EQ(st, 200);
    EXPECT_EQ(find_session(list, "doc")["tokens"], doc_before["tokens"]);
    EXPECT_EQ(find_session(list, "conv")["tokens"], conv_before["tokens"]);
    // The completion session goes on from its stored KV: all of it (full pages and its tail).
    auto d2 = b.post("/v1/completions", {{"prompt", " and then"}, {"max_tokens", 4}, {"temperature", 0},
                                         {"session", "doc"}}, &st);
    ASSERT_EQ(st, 200) << d2;
    EXPECT_GT(d2["usage"]["prompt_tokens"].get<int>(), doc_before["tokens"].get<int>());
    EXPECT_EQ(d2["usage"]["prompt_tokens_details"]["cached_tokens"], doc_before["durable_tokens"]);
    // An empty prompt goes on from the document as it is (its prompt: exactly the session's tokens);
    // on a session that holds nothing it is refused, naming the prompt.
    auto d3 = b.post("/v1/completions", {{"prompt", ""}, {"max_tokens", 3}, {"temperature", 0}, {"session", "doc"},
                                         {"ignore_eos", true}}, &st);
    ASSERT_EQ(st, 200) << d3;
    EXPECT_EQ(d3["usage"]["prompt_tokens"],
              d2["usage"]["prompt_tokens"].get<int>() + d2["usage"]["completion_tokens"].get<int>());
    EXPECT_EQ(d3["usage"]["completion_tokens"], 3);
    auto e = b.post("/v1/completions", {{"prompt", ""}, {"max_tokens", 1}, {"session", "nothing-yet"}}, &st);
    EXPECT_EQ(st, 400) << e;
    EXPECT_EQ(e["error"]["param"], "prompt");
    e = b.post("/v1/completions", {{"prompt", ""}, {"max_tokens", 1}}, &st);
    EXPECT_EQ(st, 400) << e;
    EXPECT_EQ(e["error"]["param"], "prompt");
    // The conversation goes on: a third turn over the two recorded ones.
    auto t3 = b.post("/v1/chat/completions", chat("And then?", "conv"), &st);
    ASSERT_EQ(st, 200) << t3;
    EXPECT_GT(t3["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
    auto conv = b.get("/v1/sessions/conv", &st);
    ASSERT_EQ(st, 200);
    ASSERT_EQ(conv["messages"].size(), 6u) << conv;
    EXPECT_EQ(conv["messages"][0]["content"], "Hello, who are you?");
    EXPECT_EQ(conv["messages"][2]["content"], "Tell me more.");
    EXPECT_EQ(conv["messages"][4]["content"], "And then?");
    EXPECT_EQ(conv["messages"][5]["role"], "assistant");
    EXPECT_EQ(conv["messages"][5]["content"], t3["choices"][0]["message"]["content"]);
    // Delete: once, then 404; a bad name is 400.
    json body;
    EXPECT_EQ(b.del("/v1/sessions/conv", &body), 200);
    EXPECT_EQ(body["deleted"], true);
    EXPECT_EQ(b.del("/v1/sessions/conv", &body), 404);
    EXPECT_EQ(body["error"]["code"], "session_not_found");
    b.get("/v1/sessions/conv", &st);
    EXPECT_EQ(st, 404);
    EXPECT_EQ(b.del("/v1/sessions/.hidden"), 400);
    // So is a name with a '/', sent encoded (the route sees the decoded path) or not: 400 naming
    // the rule, as for every invalid name, not 404 unknown_url.
    for (const char* path : {"/v1/sessions/a%2Fb", "/v1/sessions/a/b"}) {
      EXPECT_EQ(b.del(path, &body), 400) << path << ": " << body;
      EXPECT_EQ(body["error"]["param"], "session") << path << ": " << body;
      EXPECT_NE(body["error"]["message"].get<std::string>().find("A-Z a-z 0-9 . _ -"), std::string::npos) << body;
      body = b.get(path, &st);
      EXPECT_EQ(st, 400) << path << ": " << body;
      EXPECT_NE(body["error"]["message"].get<std::string>().find("'a/b' is not a session name"), std::string::npos)
          << body;
    }
    EXPECT_TRUE(find_session(b.get("/v1/sessions", &st), "conv").is_null());
    EXPECT_EQ(b.p->terminate(30), 0);
  }
  {
    // By default a restarted server loads the store's most recent prefixes into its prefix cache
    // before it listens; the prompt is then served from memory, with the same output.
    Srv c(store);
    ASSERT_TRUE(c.p->ok()) << c.p->startup_output();
    const double warmed = c.metric("anvil_kv_store_pages_restored_total");
    EXPECT_GT(warmed, 0) << "pages restored before any request";
    EXPECT_GT(c.metric("anvil_kv_prefix_cache_pages"), 0);
    auto again = c.post("/v1/completions", {{"prompt", kDoc}, {"max_tokens", 8}, {"temperature", 0}}, &st);
    ASSERT_EQ(st, 200) << again;
    const int n = again["usage"]["prompt_tokens"];
    EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], (n - 1) / 16 * 16);
    EXPECT_EQ(again["choices"][0]["text"], first["choices"][0]["text"]);
    // Loaded from the store before listening: they count as from the store for this first use, and
    // none was restored on demand.
    EXPECT_GE(c.metric("anvil_prompt_tokens_from_store_total"), (n - 1) / 16 * 16);
    EXPECT_EQ(c.metric("anvil_kv_store_pages_restored_total"), warmed);
    EXPECT_EQ(c.p->terminate(30), 0);
  }
  fs::remove_all(dir);
}

TEST(ServeStore, WithoutTheStoreSessionsAreRefused) {
  Srv s({"--no-kv-store"});
  ASSERT_TRUE(s.p->ok()) << s.p->startup_output();
  int st = 0;
  auto e = s.post("/v1/chat/completions", chat("hi", "conv", 1), &st);
  EXPECT_EQ(st, 400);
  EXPECT_EQ(e["error"]["param"], "session");
  s.get("/v1/sessions", &st);
  EXPECT_EQ(st, 400);
  EXPECT_EQ(s.metric("anvil_kv_store_pages_written_total"), -1) << "no store counters without a store";
  EXPECT_EQ(s.p->terminate(30), 0);
}

namespace {
std::string store_dir(const char* what) {
  return (fs::temp_directory_path() / (std::string("anvil_serve_") + what + "_" + std::to_string(::getpid()))).string();
}
std::string error_message(const json& j) {
  return j.contains("error") && j["error"].contains("message") ? j["error"]["message"].dump() : j.dump();
}
json doc_turn(const std::string& prompt, int max_tokens, const std::string& session) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"session", session}, {"ignore_eos", true}};
}
}  // namespace

// A session another process on the store holds (this test process, through its own store handle:
// anvil run/generate, or another server): a request naming it and its DELETE get 409 session_busy
// (docs/api.md), and the server neither continues nor removes it; once let go, both work.
TEST(ServeStore, ASessionAnotherProcessHoldsIsBusy) {
  const std::string dir = store_dir("held");
  fs::remove_all(dir);
  {
    Srv a({"--kv-store", dir});
    ASSERT_TRUE(a.p->ok()) << a.p->startup_output();
    int st = 0;
    auto d1 = a.post("/v1/completions", doc_turn("Once upon a time", 4, "held"), &st);
    ASSERT_EQ(st, 200) << d1;
    const json before = a.get("/v1/sessions/held", &st);
    ASSERT_EQ(st, 200) << before;
    anvil::KVStoreOptions o;
    o.dir = dir;
    auto other = anvil::KVStore::open(o);
    ASSERT_TRUE(other.is_ok()) << other.status().message();
    ASSERT_TRUE((*other)->claim_session("held").is_ok()) << "the server kept the session after its turn ended";
    auto e = a.post("/v1/completions", doc_turn(" and then", 2, "held"), &st);
    EXPECT_EQ(st, 409) << e;
    EXPECT_EQ(e["error"]["code"], "session_busy") << e;
    EXPECT_EQ(e["error"]["param"], "session") << e;
    EXPECT_NE(error_message(e).find("another process"), std::string::npos) << e;
    // A chat request naming a new session another process claimed (anvil run --session NEW) too.
    ASSERT_TRUE((*other)->claim_session("fresh").is_ok());
    e = a.post("/v1/chat/completions", chat("hi", "fresh", 1), &st);
    EXPECT_EQ(st, 409) << e;
    EXPECT_EQ(e["error"]["code"], "session_busy") << e;
    json body;
    EXPECT_EQ(a.del("/v1/sessions/held", &body), 409) << body;
    EXPECT_EQ(body["error"]["code"], "session_busy") << body;
    EXPECT_NE(error_message(body).find("in use by another process"), std::string::npos) << body;
    auto now = a.get("/v1/sessions/held", &st);
    ASSERT_EQ(st, 200) << "a DELETE refused must leave the session: " << now;
    EXPECT_EQ(now["tokens"], before["tokens"]);
    // Let go: the next turn continues it, and DELETE removes it.
    (*other)->release_session("held");
    (*other)->release_session("fresh");
    auto d2 = a.post("/v1/completions", doc_turn(" and then", 2, "held"), &st);
    ASSERT_EQ(st, 200) << d2;
    EXPECT_GT(d2["usage"]["prompt_tokens"].get<int>(), before["tokens"].get<int>());
    EXPECT_EQ(a.del("/v1/sessions/held", &body), 200) << body;
    a.get("/v1/sessions/held", &st);
    EXPECT_EQ(st, 404);
    EXPECT_EQ(a.p->terminate(30), 0);
  }
  fs::remove_all(dir);
}

// The lost update: a request for a session, queued behind a busy slot, must not continue what the
// session held when it was validated if another process committed a turn of it meanwhile (that turn
// would be written over). The request claims the session when it is validated, so the other process
// is refused until the request's turn ends; the turn continues exactly what is committed.
TEST(ServeStore, AQueuedRequestHoldsItsSessionAgainstOtherProcesses) {
  const std::string dir = store_dir("queued");
  fs::remove_all(dir);
  {
    Srv a({"--kv-store", dir}, "1");
    ASSERT_TRUE(a.p->ok()) << a.p->startup_output();
    int st = 0;
    auto d1 = a.post("/v1/completions", doc_turn("Once upon a time", 4, "X"), &st);
    ASSERT_EQ(st, 200) << d1;
    const int n0 = a.get("/v1/sessions/X", &st)["tokens"];
    ASSERT_EQ(st, 200);
    // The only slot is taken by a long request; the session's turn waits in the queue.
    RawConnection conn(a.p->port());
    const std::string b = json{{"prompt", kDoc}, {"max_tokens", 440}, {"temperature", 0}, {"ignore_eos", true}}.dump();
    ASSERT_TRUE(conn.send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b));
    for (int i = 0; i < 250 && a.metric("anvil_requests_running") < 1; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_EQ(a.metric("anvil_requests_running"), 1);
    json queued;
    int queued_st = 0;
    std::thread t([&] { queued = a.post("/v1/completions", doc_turn("", 5, "X"), &queued_st); });
    for (int i = 0; i < 250 && a.metric("anvil_requests_waiting") < 1; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const bool was_queued = a.metric("anvil_requests_waiting") >= 1;
    // Another process continues X by 10 tokens (what anvil generate --session X --resume does:
    // claim, read, commit a longer row), if it may.
    anvil::KVStoreOptions o;
    o.dir = dir;
    auto other = anvil::KVStore::open(o);
    ASSERT_TRUE(other.is_ok()) << other.status().message();
    int committed = n0;
    anvil::Status claim = (*other)->claim_session("X");
    if (claim.is_ok()) {
      auto info = (*other)->get_session("X");
      ASSERT_TRUE(info.is_ok() && *info);
      std::vector<int32_t> toks = (*info)->tokens;
      for (int i = 0; i < 10; ++i) toks.push_back(toks[size_t(i)]);
      anvil::SqliteDb db;
      ASSERT_TRUE(db.open(dir + "/catalog.db", 10000).is_ok());
      anvil::SqliteStmt u;
      ASSERT_TRUE(u.prepare(db, "UPDATE sessions SET tokens = ?, sum = ? WHERE name = 'X'").is_ok());
      u.bind_blob(1, toks.data(), toks.size() * 4);
      u.bind(2, int64_t(anvil::session_sum(toks.data(), toks.size(), (*info)->meta)));
      ASSERT_TRUE(u.run().is_ok());
      committed = int(toks.size());
      (*other)->release_session("X");
    }
    EXPECT_FALSE(claim.is_ok()) << "another process claimed a session a queued request had validated"
                                << (was_queued ? "" : " (the request was no longer queued)");
    EXPECT_EQ(claim.code(), anvil::StatusCode::kBusy) << claim.message();
    conn.close();  // the long request's client goes away: the slot frees, the queued turn runs
    t.join();
    ASSERT_EQ(queued_st, 200) << queued;
    EXPECT_EQ(queued["usage"]["prompt_tokens"], committed) << "the turn must continue what is committed";
    EXPECT_EQ(a.get("/v1/sessions/X", &st)["tokens"], committed + 5) << "a committed turn was written over";
    // The turn over, the session is free for other processes again.
    EXPECT_TRUE((*other)->claim_session("X").is_ok());
    (*other)->release_session("X");
    EXPECT_EQ(a.p->terminate(30), 0);
  }
  fs::remove_all(dir);
}

// A queued session turn whose client goes away gives its session and its queue place back within
// a step, not when a sequence frees up (the claim also holds other processes off: kv rm, anvil run).
// And a damaged session (its row fails its checksum) is listed marked, and DELETE removes it, as
// anvil kv rm does.
TEST(ServeStore, AQueuedTurnLeftByItsClientAndADamagedSessionAreGivenBack) {
  const std::string dir = store_dir("leftq");
  fs::remove_all(dir);
  {
    Srv a({"--kv-store", dir, "--max-queue", "1"}, "1");
    ASSERT_TRUE(a.p->ok()) << a.p->startup_output();
    int st = 0;
    ASSERT_EQ((a.post("/v1/completions", doc_turn("Once upon a time", 4, "Q"), &st), st), 200);
    RawConnection running(a.p->port()), queued(a.p->port());
    auto send = [](RawConnection& c, const json& body) {
      const std::string b = body.dump();
      return c.send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        "Content-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b);
    };
    // The only slot: a long request (~440 tokens of the tiny model, seconds on 2 cores).
    ASSERT_TRUE(send(running, json{{"prompt", kDoc}, {"max_tokens", 440}, {"temperature", 0}, {"ignore_eos", true}}));
    for (int i = 0; i < 250 && a.metric("anvil_requests_running") < 1; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_EQ(a.metric("anvil_requests_running"), 1);
    ASSERT_TRUE(send(queued, doc_turn(" and then", 3, "Q")));
    for (int i = 0; i < 250 && a.metric("anvil_requests_waiting") < 1; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_EQ(a.metric("anvil_requests_waiting"), 1);
    queued.close();  // its client goes away while it waits
    anvil::KVStoreOptions o;
    o.dir = dir;
    auto other = anvil::KVStore::open(o);
    ASSERT_TRUE(other.is_ok()) << other.status().message();
    bool freed = false;
    for (int i = 0; i < 100 && !freed; ++i) {  // bounded: 2 s, while the long request still runs
      freed = a.metric("anvil_requests_waiting") == 0 && (*other)->claim_session("Q").is_ok();
      if (!freed) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(freed) << "the left turn kept its queue place or its session";
    EXPECT_EQ(a.metric("anvil_requests_running"), 1) << "the long request should still be running";
    (*other)->release_session("Q");
    running.close();
    // A damaged row: listed marked, and DELETE removes it.
    {
      anvil::SqliteDb db;
      ASSERT_TRUE(db.open(dir + "/catalog.db", 10000).is_ok());
      anvil::SqliteStmt u;
      ASSERT_TRUE(u.prepare(db, "UPDATE sessions SET meta = meta || ' ' WHERE name = 'Q'").is_ok());
      ASSERT_TRUE(u.run().is_ok());
    }
    const json listed = find_session(a.get("/v1/sessions", &st), "Q");
    EXPECT_EQ(listed["damaged"], true) << listed;
    json body;
    EXPECT_EQ(a.del("/v1/sessions/Q", &body), 200) << body;
    EXPECT_TRUE(find_session(a.get("/v1/sessions", &st), "Q").is_null()) << "still listed after DELETE";
    EXPECT_EQ(a.p->terminate(30), 0);
  }
  fs::remove_all(dir);
}

namespace {
// Every session row of the catalog, byte for byte (tokens, meta, checksum, positions, tail, time).
std::string session_rows(const std::string& dir) {
  anvil::SqliteDb db;
  if (!db.open(dir + "/catalog.db", 10000).is_ok()) return "(no catalog)";
  anvil::SqliteStmt q;
  if (!q.prepare(db, "SELECT name || '|' || hex(tokens) || '|' || hex(meta) || '|' || quote(sum) || '|' || durable_pos "
                     "|| '|' || quote(tail_segment) || '|' || quote(tail_offset) || '|' || updated FROM sessions "
                     "ORDER BY name").is_ok())
    return "(no sessions table)";
  std::string all;
  for (auto r = q.step(); r.is_ok() && *r; r = q.step()) all += q.col_text(0) + "\n";
  return all;
}
void damage(const std::string& dir, const std::string& sql) {
  anvil::SqliteDb db;
  ASSERT_TRUE(db.open(dir + "/catalog.db", 10000).is_ok());
  ASSERT_TRUE(db.exec(sql).is_ok()) << sql;
}
}  // namespace

// A request naming a session whose own record is damaged (its token ids or conversation fail their
// checksum: a changed conversation, changed token ids, a token blob cut mid-id) is a client error,
// 409 session_damaged naming the session and the remedy, streaming or not, on either endpoint (it
// answered 500 server_error). The server changes nothing: every session row, damaged or not, stays
// byte for byte; the session is not held afterwards; GET shows it as the list does (it answered
// 500 too); DELETE removes it, and the name then starts a new session.
TEST(ServeStore, ADamagedSessionIsAClientErrorAndIsLeftAsItIs) {
  const std::string dir = store_dir("damaged");
  fs::remove_all(dir);
  {
    Srv a({"--kv-store", dir});
    ASSERT_TRUE(a.p->ok()) << a.p->startup_output();
    int st = 0;
    for (const char* name : {"conv", "cut"}) {
      auto t = a.post("/v1/chat/completions", chat("Hello, who are you?", name), &st);
      ASSERT_EQ(st, 200) << t;
    }
    for (const char* name : {"doc", "keep"}) {
      auto t = a.post("/v1/completions", doc_turn("Once upon a time", 4, name), &st);
      ASSERT_EQ(st, 200) << t;
    }
    damage(dir, "UPDATE sessions SET meta = replace(meta, 'Hello', 'Jello') WHERE name = 'conv'");
    damage(dir, "UPDATE sessions SET tokens = substr(tokens, 1, length(tokens) - 1) WHERE name = 'cut'");
    damage(dir, "UPDATE sessions SET tokens = zeroblob(length(tokens)) WHERE name = 'doc'");
    const std::string rows = session_rows(dir);
    struct Probe {
      const char* name;
      bool chat;
    };
    for (const Probe& p : {Probe{"conv", true}, Probe{"cut", true}, Probe{"doc", false}, Probe{"conv", false},
                           Probe{"doc", true}}) {
      for (bool stream : {false, true}) {
        json body = p.chat ? chat("And then?", p.name) : doc_turn(" and then", 3, p.name);
        body["stream"] = stream;
        const std::string what = std::string(p.name) + (p.chat ? " chat" : " completion") + (stream ? " stream" : "");
        auto e = a.post(p.chat ? "/v1/chat/completions" : "/v1/completions", body, &st);
        EXPECT_EQ(st, 409) << what << ": " << e;
        EXPECT_EQ(e["error"]["code"], "session_damaged") << what << ": " << e;
        EXPECT_EQ(e["error"]["param"], "session") << what << ": " << e;
        EXPECT_EQ(e["error"]["type"], "invalid_request_error") << what << ": " << e;
        const std::string m = error_message(e);
        for (const std::string& part : {"session '" + std::string(p.name) + "' is damaged", std::string("checksum"),
                                        "DELETE /v1/sessions/" + std::string(p.name),
                                        "anvil kv rm " + std::string(p.name)})
          EXPECT_NE(m.find(part), std::string::npos) << what << ": the message lacks '" << part << "': " << m;
      }
    }
    EXPECT_EQ(session_rows(dir), rows) << "a refused request changed a session";
    // The refusals held nothing: another process may claim them, and the sound session goes on.
    anvil::KVStoreOptions o;
    o.dir = dir;
    {
      auto other = anvil::KVStore::open(o);
      ASSERT_TRUE(other.is_ok()) << other.status().message();
      for (const char* name : {"conv", "cut", "doc"})
        EXPECT_TRUE((*other)->claim_session(name).is_ok()) << name << " is still held";
    }
    auto k = a.post("/v1/completions", doc_turn(" and then", 3, "keep"), &st);
    EXPECT_EQ(st, 200) << k;
    // GET shows it as the list does.
    auto g = a.get("/v1/sessions/conv", &st);
    EXPECT_EQ(st, 200) << g;
    EXPECT_EQ(g["id"], "conv") << g;
    EXPECT_EQ(g["damaged"], true) << g;
    EXPECT_NE((g["error"].is_string() ? g["error"].get<std::string>() : "").find("session 'conv' is damaged"),
              std::string::npos)
        << g;
    EXPECT_EQ(g, find_session(a.get("/v1/sessions", &st), "conv"));
    EXPECT_EQ(g.dump().find(dir), std::string::npos) << "the server's store path shown to a client: " << g;
    // DELETE removes it; the name then starts afresh.
    json body;
    EXPECT_EQ(a.del("/v1/sessions/conv", &body), 200) << body;
    auto fresh = a.post("/v1/chat/completions", chat("Hello, who are you?", "conv"), &st);
    EXPECT_EQ(st, 200) << fresh;
    auto now = a.get("/v1/sessions/conv", &st);
    EXPECT_EQ(st, 200) << now;
    EXPECT_EQ(now["messages"].size(), 2u) << now;
    EXPECT_EQ(find_session(a.get("/v1/sessions", &st), "cut")["damaged"], true) << "another damaged session changed";
    // To a server of another KV layout, this model's damaged session is another model's session,
    // damaged or not: 400 as for an intact one, not found by GET and DELETE, and left as it is.
    {
      const std::string cut_row = session_rows(dir);
      Srv b({"--kv-store", dir, "--kv-dtype", "f32"});
      ASSERT_TRUE(b.p->ok()) << b.p->startup_output();
      auto e = b.post("/v1/chat/completions", chat("And then?", "cut"), &st);
      EXPECT_EQ(st, 400) << e;
      EXPECT_NE(error_message(e).find("another model"), std::string::npos) << e;
      b.get("/v1/sessions/cut", &st);
      EXPECT_EQ(st, 404);
      EXPECT_EQ(b.del("/v1/sessions/cut"), 404);
      EXPECT_EQ(session_rows(dir), cut_row);
      EXPECT_EQ(b.p->terminate(30), 0);
    }
    EXPECT_EQ(a.p->terminate(30), 0);
  }
  fs::remove_all(dir);
}

namespace {
// Runs the anvil CLI; its exit code and its stdout and stderr together.
std::pair<int, std::string> anvil_cli(const std::vector<std::string>& args) {
  std::string cmd = ANVIL_BINARY;
  for (const std::string& a : args) cmd += " '" + a + "'";
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  char b[4096];
  for (size_t n; (n = fread(b, 1, sizeof b, p)) > 0;) out.append(b, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}
// Rewrites session `name`'s meta (its checksum recomputed: a row as anvil would have written it).
void set_meta(const std::string& dir, const std::string& name, const std::string& meta) {
  anvil::SqliteDb db;
  ASSERT_TRUE(db.open(dir + "/catalog.db", 10000).is_ok());
  anvil::SqliteStmt q, u;
  ASSERT_TRUE(q.prepare(db, "SELECT tokens FROM sessions WHERE name = ?").is_ok());
  q.bind(1, name);
  auto row = q.step();
  ASSERT_TRUE(row.is_ok() && *row) << name;
  std::vector<int32_t> toks(q.col_bytes(0) / 4);
  std::memcpy(toks.data(), q.col_blob(0), toks.size() * 4);
  ASSERT_TRUE(u.prepare(db, "UPDATE sessions SET meta = ?, sum = ? WHERE name = ?").is_ok());
  u.bind(1, meta);
  u.bind(2, int64_t(anvil::session_sum(toks.data(), toks.size(), meta)));
  u.bind(3, name);
  ASSERT_TRUE(u.run().is_ok());
}
}  // namespace

// A session is continued only by what records its kind. A conversation the server recorded is
// refused by anvil generate (--resume and --fork: it recorded meta "" over it, and the server then
// called it a completion document), and a completion document by anvil run; a session anvil run
// recorded in completion mode is refused by /v1/completions naming anvil run (it said "holds a
// conversation: continue it with /v1/chat/completions", which refuses it too). A row of the older
// store format (no checksum) whose conversation is unreadable is damaged: 409 session_damaged saying
// so on both endpoints (chat answered 400 "holds a completion document"), listed damaged. Nothing
// changes any row, no error shows the store's path (a DELETE refused because another process holds
// the session showed it too), and the conversation goes on afterwards.
TEST(ServeStore, ASessionIsContinuedOnlyAsItsKind) {
  const std::string dir = store_dir("kinds");
  fs::remove_all(dir);
  {
    Srv a({"--kv-store", dir});
    ASSERT_TRUE(a.p->ok()) << a.p->startup_output();
    int st = 0;
    for (const char* name : {"talk", "old"}) ASSERT_EQ((a.post("/v1/chat/completions", chat("Hello", name), &st), st), 200);
    for (const char* name : {"doc", "text"})
      ASSERT_EQ((a.post("/v1/completions", doc_turn("Once upon a time", 4, name), &st), st), 200);
    set_meta(dir, "text", R"({"messages":[],"document":[5,6,7],"turns":1})");  // anvil run's, no chat template
    damage(dir, "UPDATE sessions SET sum = NULL, meta = substr(meta, 1, length(meta) - 3) WHERE name = 'old'");
    const std::string rows = session_rows(dir);
    auto cli = [&](const char* verb, std::vector<std::string> extra) {
      std::vector<std::string> args = {verb, "--device", "cpu", "--synthetic", "tiny", "--kv-store", dir, "-n", "2"};
      args.insert(args.end(), extra.begin(), extra.end());
      return anvil_cli(args);
    };
    for (const auto& extra : std::vector<std::vector<std::string>>{{"--session", "talk", "--resume", "-p", " x"},
                                                                   {"--session", "talk", "--fork", "talk2"}}) {
      auto [code, out] = cli("generate", extra);
      EXPECT_EQ(code, 1) << out;
      EXPECT_NE(out.find("session 'talk' holds a conversation"), std::string::npos) << out;
      EXPECT_NE(out.find("anvil run --session talk"), std::string::npos) << out;
    }
    {
      auto [code, out] = cli("run", {"--session", "doc", "--resume", "-p", "x"});
      EXPECT_EQ(code, 1) << out;
      EXPECT_NE(out.find("anvil generate --session doc --resume"), std::string::npos) << out;
    }
    auto e = a.post("/v1/completions", doc_turn(" and", 2, "text"), &st);
    EXPECT_EQ(st, 400) << e;
    EXPECT_NE(error_message(e).find("anvil run --session text --resume"), std::string::npos) << e;
    EXPECT_EQ(error_message(e).find("/v1/chat/completions"), std::string::npos) << e;
    e = a.post("/v1/chat/completions", chat("And?", "text"), &st);
    EXPECT_EQ(st, 400) << e;
    for (bool chat_ep : {true, false}) {
      e = a.post(chat_ep ? "/v1/chat/completions" : "/v1/completions",
                 chat_ep ? chat("And?", "old") : doc_turn(" and", 2, "old"), &st);
      EXPECT_EQ(st, 409) << e;
      EXPECT_EQ(e["error"]["code"], "session_damaged") << e;
      EXPECT_NE(error_message(e).find("session 'old' is damaged (its conversation is unreadable"), std::string::npos)
          << e;
      EXPECT_EQ(error_message(e).find(dir), std::string::npos) << "the store's path: " << e;
    }
    const json listed = a.get("/v1/sessions", &st);
    EXPECT_EQ(find_session(listed, "old")["damaged"], true) << listed;
    EXPECT_EQ(listed.dump().find(dir), std::string::npos) << "the store's path: " << listed;
    const json one = a.get("/v1/sessions/old", &st);
    EXPECT_EQ(one, find_session(listed, "old"));
    {  // DELETE of a session another process holds: 409, and the store's message without its path
      anvil::KVStoreOptions o;
      o.dir = dir;
      auto other = anvil::KVStore::open(o);
      ASSERT_TRUE(other.is_ok()) << other.status().message();
      ASSERT_TRUE((*other)->claim_session("doc").is_ok());
      json body;
      EXPECT_EQ(a.del("/v1/sessions/doc", &body), 409) << body;
      EXPECT_NE(error_message(body).find("in use by another process"), std::string::npos) << body;
      EXPECT_EQ(body.dump().find(dir), std::string::npos) << "the store's path: " << body;
    }
    EXPECT_EQ(session_rows(dir), rows) << "a refused request or command changed a session";
    auto t = a.post("/v1/chat/completions", chat("And then?", "talk"), &st);
    EXPECT_EQ(st, 200) << t;
    EXPECT_EQ(a.get("/v1/sessions/talk", &st)["messages"].size(), 4u) << "the conversation was not kept";
    EXPECT_EQ(a.p->terminate(30), 0);
  }
  fs::remove_all(dir);
}

// Each session is listed as the kind it is, the one the endpoints continue it as, by GET
// /v1/sessions and anvil kv ls (text and --json) alike, whichever producer recorded it: anvil run
// (chat, and completion mode: a model without a chat template), anvil generate --session, and the
// server's two endpoints. anvil run's completion-mode text was listed "type": "chat" (with
// "messages": 0) although /v1/chat/completions refuses it (its meta holds no conversation), and
// kv ls gave no kind at all. One model (the tiny code model: its weights and config are its
// fingerprint), with and without a chat template, so the server lists every session.
TEST(ServeStore, EachSessionIsListedAsItsKind) {
  const std::string model = std::string(ANVIL_SOURCE_DIR) + "/models/anvil-tiny-code-q4";
  const std::string dir = store_dir("listed"), chat_model = dir + ".model";
  fs::remove_all(dir);
  fs::remove_all(chat_model);
  fs::create_directories(chat_model);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"})
    fs::create_symlink(model + "/" + f, chat_model + "/" + f);
  {
    std::ifstream in(model + "/tokenizer_config.json");
    json cfg = json::parse(in);
    ASSERT_FALSE(cfg.contains("chat_template")) << "the tiny code model is the one without a chat template";
    cfg["chat_template"] =
        "{% for m in messages %}<|user|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}";
    std::ofstream(chat_model + "/tokenizer_config.json") << cfg.dump();
  }
  auto cli = [&](const char* verb, const std::string& m, std::vector<std::string> extra) {
    std::vector<std::string> args = {verb, "--device", "cpu", "-m", m, "--kv-store", dir, "-n", "3", "--temp", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    return anvil_cli(args);
  };
  for (auto [code, out] : {cli("run", chat_model, {"--session", "run-chat", "-p", "Hello"}),
                           cli("run", model, {"--session", "run-text", "-p", "def f(x):"}),
                           cli("generate", model, {"--session", "gen", "-p", "def f(x):"})})
    ASSERT_EQ(code, 0) << out;
  const std::map<std::string, std::string> want = {{"run-chat", "chat"}, {"run-text", "run_text"}, {"gen", "completion"},
                                                   {"srv-chat", "chat"}, {"srv-doc", "completion"}};
  ServerProcess srv({"-m", chat_model, "-c", "256", "--kv-store", dir, "-t", "2"});
  ASSERT_TRUE(srv.ok()) << srv.startup_output();
  httplib::Client c("127.0.0.1", srv.port());
  c.set_read_timeout(60, 0);
  auto post = [&](const char* path, const json& body) {
    auto r = c.Post(path, body.dump(), "application/json");
    return r ? r->status : -1;
  };
  ASSERT_EQ(post("/v1/chat/completions", chat("Hello", "srv-chat", 3)), 200);
  ASSERT_EQ(post("/v1/completions", doc_turn("def g(y):", 3, "srv-doc")), 200);
  auto listed = c.Get("/v1/sessions");
  ASSERT_TRUE(listed && listed->status == 200);
  const json list = json::parse(listed->body);
  for (const auto& [name, type] : want) {
    const json s = find_session(list, name);
    EXPECT_EQ(s["type"], type) << name << ": " << list;
    EXPECT_EQ(s.contains("messages"), type == "chat") << name << ": only a conversation has messages: " << s;
    auto one = c.Get(("/v1/sessions/" + name).c_str());
    ASSERT_TRUE(one && one->status == 200) << name;
    EXPECT_EQ(json::parse(one->body)["type"], type) << name;
  }
  // What each endpoint does with it is what its type says: continued by the one it names, refused
  // by the other (run_text by both).
  for (const auto& [name, type] : want) {
    EXPECT_EQ(post("/v1/chat/completions", chat("And?", name, 1)), type == "chat" ? 200 : 400) << name;
    EXPECT_EQ(post("/v1/completions", doc_turn(" more", 1, name)), type == "completion" ? 200 : 400) << name;
  }
  EXPECT_EQ(srv.terminate(30), 0);
  auto [code, out] = anvil_cli({"kv", "ls", "--kv-store", dir, "--json"});
  ASSERT_EQ(code, 0) << out;
  const json ls = json::parse(out.substr(out.rfind('\n', out.size() - 2) + 1));  // its last line: stderr comes first
  std::map<std::string, std::string> got;
  for (const json& s : ls["sessions"]) got[s["name"]] = s.value("type", "");
  EXPECT_EQ(got, want) << ls;
  auto [tcode, text] = anvil_cli({"kv", "ls", "--kv-store", dir});
  ASSERT_EQ(tcode, 0) << text;
  for (const auto& [name, type] : want)
    EXPECT_TRUE(std::regex_search(text, std::regex("\n  " + name + " +" + type + " +[0-9]+ tokens")))
        << name << " " << type << ": " << text;
  for (const auto& [name, type] : want) {
    auto [scode, shown] = anvil_cli({"kv", "show", name, "--kv-store", dir, "--json"});
    ASSERT_EQ(scode, 0) << shown;
    EXPECT_EQ(json::parse(shown.substr(shown.rfind('\n', shown.size() - 2) + 1))["type"], type) << name;
  }
  fs::remove_all(dir);
  fs::remove_all(chat_model);
}

// Damaged KV pages of a sound session are only cache: the next turn recomputes them, with the output
// a server on an intact copy of the store gives, and stores them again (the store heals: verify finds
// nothing, and a later turn restores every page).
TEST(ServeStore, DamagedPagesOfASessionAreRecomputedAndStoredAgain) {
  const std::string dir = store_dir("pages"), intact = dir + ".intact";
  fs::remove_all(dir);
  fs::remove_all(intact);
  const std::vector<std::string> store = {"--kv-store", dir, "--kv-warm", "0"};
  {
    Srv a(store);
    ASSERT_TRUE(a.p->ok()) << a.p->startup_output();
    int st = 0;
    auto d1 = a.post("/v1/completions", doc_turn(kDoc, 4, "pages"), &st);
    ASSERT_EQ(st, 200) << d1;
    EXPECT_EQ(a.p->terminate(30), 0);
  }
  fs::copy(dir, intact, fs::copy_options::recursive);
  // A flipped byte in the middle of every record the session references: its pages and its tail.
  {
    anvil::SqliteDb db;
    ASSERT_TRUE(db.open(dir + "/catalog.db", 10000).is_ok());
    anvil::SqliteStmt q;
    ASSERT_TRUE(q.prepare(db, "SELECT p.segment, p.offset + p.length / 2 FROM session_pages s JOIN pages p ON "
                              "p.key = s.key WHERE s.session = 'pages' UNION ALL SELECT tail_segment, tail_offset + "
                              "tail_length / 2 FROM sessions WHERE name = 'pages' AND tail_segment IS NOT NULL")
                    .is_ok());
    int flipped = 0;
    for (auto r = q.step(); r.is_ok() && *r; r = q.step(), ++flipped) {
      std::fstream f(anvil::segment_file(dir, q.col_int(0)), std::ios::in | std::ios::out | std::ios::binary);
      ASSERT_TRUE(f.good());
      f.seekg(q.col_int(1));
      const char c = char(f.get());
      f.seekp(q.col_int(1));
      f.put(char(c ^ 0x5a));
    }
    ASSERT_GE(flipped, 3) << "the session should reference pages and its tail";
  }
  anvil::KVStoreOptions o;
  o.dir = dir;
  o.repair = false;
  {
    auto st = anvil::KVStore::open(o);
    ASSERT_TRUE(st.is_ok()) << st.status().message();
    std::vector<std::string> problems;
    int64_t n = 0;
    ASSERT_TRUE((*st)->verify(&problems, &n).is_ok());
    EXPECT_GE(problems.size(), 3u) << "the damage should be visible to verify";
  }
  const json turn = doc_turn(" and then", 6, "pages");
  json ref;
  int st = 0;
  {
    Srv r({"--kv-store", intact, "--kv-warm", "0"});
    ASSERT_TRUE(r.p->ok()) << r.p->startup_output();
    ref = r.post("/v1/completions", turn, &st);
    ASSERT_EQ(st, 200) << ref;
    EXPECT_EQ(r.p->terminate(30), 0);
  }
  {
    Srv b(store);
    ASSERT_TRUE(b.p->ok()) << b.p->startup_output();
    auto healed = b.post("/v1/completions", turn, &st);
    ASSERT_EQ(st, 200) << healed;
    EXPECT_EQ(healed["choices"][0]["text"], ref["choices"][0]["text"]);
    EXPECT_EQ(healed["usage"]["prompt_tokens"], ref["usage"]["prompt_tokens"]);
    EXPECT_LT(healed["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
              ref["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>())
        << "the damaged pages should have been recomputed";
    EXPECT_GE(b.metric("anvil_kv_store_restore_corrupt_total"), 1);
    EXPECT_EQ(b.p->terminate(30), 0);
  }
  {
    auto st2 = anvil::KVStore::open(o);
    ASSERT_TRUE(st2.is_ok()) << st2.status().message();
    std::vector<std::string> problems;
    int64_t n = 0;
    ASSERT_TRUE((*st2)->verify(&problems, &n).is_ok());
    EXPECT_TRUE(problems.empty()) << "not healed: " << json(problems);
  }
  {
    Srv c(store);
    ASSERT_TRUE(c.p->ok()) << c.p->startup_output();
    const json before = c.get("/v1/sessions/pages", &st);
    ASSERT_EQ(st, 200) << before;
    auto again = c.post("/v1/completions", doc_turn(" more", 2, "pages"), &st);
    ASSERT_EQ(st, 200) << again;
    EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], before["durable_tokens"])
        << "every page and the partial last page should come from the store";
    EXPECT_EQ(c.metric("anvil_kv_store_restore_corrupt_total"), 0);
    EXPECT_EQ(c.p->terminate(30), 0);
  }
  fs::remove_all(dir);
  fs::remove_all(intact);
}

// A conversation anvil run was recording when it was killed mid-answer: its meta ends with the
// question (recorded when the turn began), its token ids run on into the answer. anvil run --resume
// keeps what was answered as the assistant's message; the server appended the next message to the
// question instead (two user messages in a row, the answer lost), so the same session continued
// over HTTP became another conversation. Now both take the turn up alike (cut_turn.h): the same
// messages, the same prompt. The cut turn ran with --no-thinking and neither continuation says so.
TEST(ServeStore, AConversationCutInAnvilRunIsTakenUpAsAnvilRunDoes) {
  const std::string dir = store_dir("cut_run"), copy = dir + ".copy";
  fs::remove_all(dir);
  fs::remove_all(copy);
  auto run = [&](const std::string& store, std::vector<std::string> extra) {
    std::vector<std::string> args = {"run", "--device", "cpu", "--synthetic", "tiny", "--kv-store", store,
                                     "-n", "8", "--temp", "0", "-c", "512", "--session", "s"};
    args.insert(args.end(), extra.begin(), extra.end());
    return anvil_cli(args);
  };
  {
    auto [code, out] = run(dir, {"-p", "Hello there"});
    ASSERT_EQ(code, 0) << out;
  }
  {
    auto [code, out] = run(dir, {"--resume", "-p", "And then?", "--no-thinking"});
    ASSERT_EQ(code, 0) << out;
  }
  // The state a kill -9 after the answer's last flush leaves: the conversation as the turn began.
  json meta;
  {
    anvil::KVStoreOptions o;
    o.dir = dir;
    auto st = anvil::KVStore::open(o);
    ASSERT_TRUE(st.is_ok()) << st.status().message();
    auto s = (*st)->get_session("s");
    ASSERT_TRUE(s.is_ok() && s->has_value());
    meta = json::parse((*s)->meta);
  }
  ASSERT_EQ(meta["messages"].size(), 4u) << meta;
  const json answer = meta["messages"][3];
  meta["messages"].erase(3);
  set_meta(dir, "s", meta.dump());
  fs::copy(dir, copy, fs::copy_options::recursive);

  auto [code, out] = run(dir, {"--resume", "-p", "Why?"});
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("the last answer was cut short after"), std::string::npos) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("prompt ([0-9]+) tokens"))) << out;
  const int run_prompt = std::stoi(m[1]);
  json by_run;
  {
    Srv a({"--kv-store", dir});
    ASSERT_TRUE(a.p->ok()) << a.p->startup_output();
    int st = 0;
    by_run = a.get("/v1/sessions/s", &st)["messages"];
    EXPECT_EQ(a.p->terminate(30), 0);
  }
  ASSERT_EQ(by_run.size(), 6u) << by_run;
  EXPECT_EQ(by_run[3], answer) << "anvil run kept the answer as it was recorded";
  {
    Srv b({"--kv-store", copy});
    ASSERT_TRUE(b.p->ok()) << b.p->startup_output();
    int st = 0;
    auto t = b.post("/v1/chat/completions", chat("Why?", "s", 8), &st);
    ASSERT_EQ(st, 200) << t;
    EXPECT_EQ(t["usage"]["prompt_tokens"], run_prompt) << "the same conversation renders the same prompt";
    EXPECT_EQ(b.get("/v1/sessions/s", &st)["messages"], by_run);
    EXPECT_EQ(b.p->terminate(30), 0);
  }
  fs::remove_all(dir);
  fs::remove_all(copy);
}

namespace {
// Sends `body` to `path` on `c` as one HTTP/1.1 request.
bool send_post(RawConnection& c, const std::string& path, const json& body) {
  const std::string b = body.dump();
  return c.send_all("POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(b.size()) + "\r\n\r\n" + b);
}
// How many times `needle` occurs in `s`.
size_t count_of(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
  return n;
}
}  // namespace

// A chat UI's stop button: the client closes its stream in the middle of the reply and sends the
// next message at once, naming the same session. The stopped request held the session until the
// server noticed the disconnect and its turn ended (~70 ms), so the next message got 409
// session_busy. Now a request whose session is held by a request whose client has gone waits for
// that one to let go (bounded), and is served exactly as if the stop had finished first: the same
// prompt and reply, the same conversation, as the same turns sent once the stopped one had ended.
// A request left by its non-streaming client alike, and a client that resets its connection (closes
// with the reply's chunks unread, or SO_LINGER 0: the server's socket is then no longer connected,
// and was once taken for a live client's). Two live requests on one session still get 409 at once
// for the second, and so does a DELETE.
TEST(ServeStore, TheNextTurnAfterAStoppedReplyIsServed) {
  const std::string dir = store_dir("stopped");
  fs::remove_all(dir);
  {
    Srv a({"--kv-store", dir});
    ASSERT_TRUE(a.p->ok()) << a.p->startup_output();
    int st = 0;
    // Turn 1, then a long turn 2 stopped by its client, then turn 3 at once (or, for the reference,
    // once the session is free again: what a client had to do).
    auto stop_then_next = [&](const std::string& session, bool stream, bool reset, bool wait_first, int* status) {
      auto t1 = a.post("/v1/chat/completions", chat("Hello, who are you?", session), &st);
      EXPECT_EQ(st, 200) << t1;
      {
        RawConnection c(a.p->port());
        json b = chat("Tell me a very long story.", session, 400);
        b["ignore_eos"] = true;
        b["stream"] = stream;
        EXPECT_TRUE(send_post(c, "/v1/chat/completions", b));
        if (stream) {
          // A few chunks of the reply: it is well under way (400 tokens take seconds here).
          std::string got;
          for (int i = 0; i < 600 && count_of(got, "data: ") < 4; ++i) got = c.read_until("\x01", 0.05);  // (never sent)
          EXPECT_GE(count_of(got, "data: "), 4u) << got;
          EXPECT_EQ(got.find("[DONE]"), std::string::npos) << "the reply ended before the stop";
        } else {
          for (int i = 0; i < 250 && a.metric("anvil_requests_running") < 1; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          EXPECT_EQ(a.metric("anvil_requests_running"), 1);
        }
        if (reset) c.reset();
      }  // closed: the stop
      json t3;
      for (int i = 0; i < 100; ++i) {
        t3 = a.post("/v1/chat/completions", chat("Why?", session, 8), status);
        if (!wait_first || *status != 409) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      return t3;
    };
    for (auto [stream, reset] : {std::pair{true, false}, {true, true}, {false, false}, {false, true}}) {
      const std::string what = std::string(stream ? "stream" : "non-streaming") + (reset ? ", reset" : ", closed");
      const std::string tag = std::string(stream ? "s" : "n") + (reset ? "r" : "c");
      const std::string ref = "ref_" + tag, now = "now_" + tag;
      int ref_st = 0, now_st = 0;
      const json want = stop_then_next(ref, stream, reset, /*wait_first=*/true, &ref_st);
      ASSERT_EQ(ref_st, 200) << what << ": " << want;
      const json got = stop_then_next(now, stream, reset, /*wait_first=*/false, &now_st);
      ASSERT_EQ(now_st, 200) << what << ": the next turn right after the stop was refused: " << got;
      EXPECT_EQ(got["usage"]["prompt_tokens"], want["usage"]["prompt_tokens"]) << what;
      EXPECT_EQ(got["choices"][0]["message"], want["choices"][0]["message"]) << what;
      const json ref_conv = a.get("/v1/sessions/" + ref, &st), now_conv = a.get("/v1/sessions/" + now, &st);
      ASSERT_EQ(st, 200);
      EXPECT_EQ(now_conv["messages"], ref_conv["messages"]) << what;
      EXPECT_EQ(now_conv["messages"].size(), 4u) << what << ": the stopped turn leaves the conversation as it was";
    }
    // Two live requests on one session: the second gets 409 at once (it does not wait for the first).
    {
      RawConnection c(a.p->port());
      json b = chat("Tell me a very long story.", "live", 400);
      b["ignore_eos"] = true;
      b["stream"] = true;
      ASSERT_TRUE(send_post(c, "/v1/chat/completions", b));
      ASSERT_NE(c.read_until("data: ", 30).find("data: "), std::string::npos);
      const auto t0 = std::chrono::steady_clock::now();
      auto e = a.post("/v1/chat/completions", chat("me too", "live", 1), &st);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_EQ(st, 409) << e;
      EXPECT_EQ(e["error"]["code"], "session_busy") << e;
      EXPECT_LT(waited, 1.0) << "a request on a session a live request holds waited for it";
      EXPECT_EQ(a.del("/v1/sessions/live"), 409);
      EXPECT_EQ(c.read_until("[DONE]", 0.2).find("[DONE]"), std::string::npos) << "the live stream was ended";
    }
    EXPECT_EQ(a.p->terminate(30), 0);
  }
  fs::remove_all(dir);
}

namespace {
// Rewrites session `name`'s token ids and meta (its checksum recomputed: a row as anvil would have
// written it).
void set_row(const std::string& dir, const std::string& name, const std::vector<int32_t>& toks, const std::string& meta) {
  anvil::SqliteDb db;
  ASSERT_TRUE(db.open(dir + "/catalog.db", 10000).is_ok());
  anvil::SqliteStmt u;
  ASSERT_TRUE(u.prepare(db, "UPDATE sessions SET tokens = ?, meta = ?, sum = ? WHERE name = ?").is_ok());
  u.bind_blob(1, toks.data(), toks.size() * 4);
  u.bind(2, meta);
  u.bind(3, int64_t(anvil::session_sum(toks.data(), toks.size(), meta)));
  u.bind(4, name);
  ASSERT_TRUE(u.run().is_ok());
}
}  // namespace

// GET /v1/sessions/NAME of a conversation whose turn anvil run was killed in shows what a request
// naming it continues (as anvil run --resume takes it up, cut_turn.h): the answer so far as the
// assistant's message, an unanswered question dropped. It showed the stored conversation as it was
// (ending with the question), which no continuation uses. The list counts the same messages, and
// the next turn's conversation begins with exactly what GET showed.
TEST(ServeStore, ASessionCutInAnvilRunIsShownAsItIsContinued) {
  const std::string dir = store_dir("cut_shown");
  fs::remove_all(dir);
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"run", "--device", "cpu", "--synthetic", "tiny", "--kv-store", dir,
                                     "-n", "8", "--temp", "0", "-c", "512", "--session", "s"};
    args.insert(args.end(), extra.begin(), extra.end());
    return anvil_cli(args);
  };
  {
    auto [code, out] = run({"-p", "Hello there"});
    ASSERT_EQ(code, 0) << out;
  }
  {
    auto [code, out] = run({"--resume", "-p", "And then?"});
    ASSERT_EQ(code, 0) << out;
  }
  // The state a kill -9 after the answer's last flush leaves: the conversation as the turn began.
  json meta;
  std::vector<int32_t> tokens;
  {
    anvil::KVStoreOptions o;
    o.dir = dir;
    auto st = anvil::KVStore::open(o);
    ASSERT_TRUE(st.is_ok()) << st.status().message();
    auto s = (*st)->get_session("s");
    ASSERT_TRUE(s.is_ok() && s->has_value());
    meta = json::parse((*s)->meta);
    tokens = (*s)->tokens;
  }
  ASSERT_EQ(meta["messages"].size(), 4u) << meta;
  const json answered = meta["messages"];
  meta["messages"].erase(3);
  set_meta(dir, "s", meta.dump());
  json shown, q = json::array();
  {
    Srv a({"--kv-store", dir});
    ASSERT_TRUE(a.p->ok()) << a.p->startup_output();
    int st = 0;
    shown = a.get("/v1/sessions/s", &st);
    ASSERT_EQ(st, 200) << shown;
    EXPECT_EQ(shown["messages"], answered) << "the cut answer, as anvil run --resume takes it up";
    EXPECT_EQ(find_session(a.get("/v1/sessions", &st), "s")["messages"], answered.size());
    EXPECT_EQ(shown["tokens"], tokens.size()) << "the session's tokens are shown as they are";
    // A turn that fails (its client goes away) leaves the conversation as it is continued: the
    // turn it took up stays taken up. (It recorded the conversation as stored, ending with the
    // question, after tokens that now ran on through the failed turn: the next turn took all of
    // them, the failed turn's question and partial reply too, for the cut answer.)
    {
      RawConnection c(a.p->port());
      json b = chat("Tell me a very long story.", "s", 400);
      b["ignore_eos"] = true;
      ASSERT_TRUE(send_post(c, "/v1/chat/completions", b));
      for (int i = 0; i < 250 && a.metric("anvil_requests_running") < 1; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      EXPECT_EQ(a.metric("anvil_requests_running"), 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a few tokens of its reply
    }
    // (Whenever it is read: while the stopped turn still ends, or after.)
    const json failed = a.get("/v1/sessions/s", &st);
    ASSERT_EQ(st, 200) << failed;
    EXPECT_EQ(failed["messages"], shown["messages"]) << "a failed turn changed the conversation";
    // The next turn waits for the stopped one to let go of the session, and goes on from `shown`.
    auto t = a.post("/v1/chat/completions", chat("Why?", "s", 8), &st);
    ASSERT_EQ(st, 200) << t;
    const json after = a.get("/v1/sessions/s", &st)["messages"];
    ASSERT_EQ(after.size(), shown["messages"].size() + 2) << after;
    for (size_t i = 0; i < shown["messages"].size(); ++i) EXPECT_EQ(after[i], shown["messages"][i]) << i;
    // A question the killed run never began to answer (its prompt recorded, no token after it).
    for (const json& m : after) q.push_back(m);
    q.push_back({{"role", "user"}, {"content", "Really?"}});
    auto ids = a.post("/tokenize", {{"messages", q}}, &st);
    ASSERT_EQ(st, 200) << ids;
    tokens = ids["tokens"].get<std::vector<int32_t>>();
    EXPECT_EQ(a.p->terminate(30), 0);
  }
  set_row(dir, "s", tokens, json{{"messages", q}, {"document", json::array()}}.dump());
  {
    Srv a({"--kv-store", dir});
    ASSERT_TRUE(a.p->ok()) << a.p->startup_output();
    int st = 0;
    shown = a.get("/v1/sessions/s", &st);
    ASSERT_EQ(st, 200) << shown;
    EXPECT_EQ(shown["messages"].size(), q.size() - 1) << "the unanswered question is dropped: " << shown;
    EXPECT_EQ(shown["messages"].back(), q[q.size() - 2]) << shown;
    EXPECT_EQ(find_session(a.get("/v1/sessions", &st), "s")["messages"], q.size() - 1);
    auto t = a.post("/v1/chat/completions", chat("Go on.", "s", 8), &st);
    ASSERT_EQ(st, 200) << t;
    const json after = a.get("/v1/sessions/s", &st)["messages"];
    ASSERT_EQ(after.size(), shown["messages"].size() + 2) << after;
    for (size_t i = 0; i < shown["messages"].size(); ++i) EXPECT_EQ(after[i], shown["messages"][i]) << i;
    EXPECT_EQ(after[after.size() - 2]["content"], "Go on.");
    EXPECT_EQ(a.p->terminate(30), 0);
  }
  fs::remove_all(dir);
}
