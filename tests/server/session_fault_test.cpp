// A session turn the KV store cannot make durable (a full disk fails the catalog's commit, or an
// I/O error) is an error to the client, never a 200 for a turn that is not saved (docs/api.md,
// Sessions): 507 `session_not_saved` with the reply in the error (not streamed), or an error event
// instead of the last chunk (streamed); the session holds what the message says; DELETE alike
// (507 `session_not_removed`, the session kept); and once the store commits again the session goes
// on from what it holds. The fault is injected as tests/kvstore and the scheduler's tests inject
// it: a trigger in the catalog (through a connection of the test's: the server is another process
// on the same store) fails the writer's commit, as SQLite's COMMIT fails on a full disk, or a
// session's DELETE.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "kvstore/sqlite_db.h"
#include "model/loader.h"
#include "server/sessions.h"
#include "server_process.h"
#include "sse.h"

using anvil::test::run_python_check;
using anvil::test::ServerProcess;
using anvil::test::sse_events;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Srv {
  std::unique_ptr<ServerProcess> p;
  explicit Srv(const std::string& dir)
      : p(std::make_unique<ServerProcess>(std::vector<std::string>{"--synthetic", "tiny", "-c", "512", "-np", "4", "-t",
                                                                   "2", "--kv-store", dir})) {}
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", p->port());
    c.set_read_timeout(60, 0);
    return c;
  }
  json post(const std::string& path, const json& body, int* status, httplib::Headers* headers = nullptr) const {
    auto r = client().Post(path.c_str(), body.dump(), "application/json");
    *status = r ? r->status : -1;
    if (r && headers) *headers = r->headers;
    return r ? json::parse(r->body, nullptr, false) : json();
  }
  std::string post_raw(const std::string& path, const json& body, int* status) const {
    auto r = client().Post(path.c_str(), body.dump(), "application/json");
    *status = r ? r->status : -1;
    return r ? r->body : "";
  }
  json get(const std::string& path, int* status) const {
    auto r = client().Get(path.c_str());
    *status = r ? r->status : -1;
    return r ? json::parse(r->body, nullptr, false) : json();
  }
  int del(const std::string& path, json* body) const {
    auto r = client().Delete(path.c_str());
    if (r) *body = json::parse(r->body, nullptr, false);
    return r ? r->status : -1;
  }
  // anvil_requests_total of `endpoint` answered `code` (0 when none was).
  int requests(const std::string& endpoint, int code) const {
    auto r = client().Get("/metrics");
    if (!r) return -1;
    std::smatch m;
    const std::regex re("anvil_requests_total\\{endpoint=\"" + endpoint + "\",code=\"" + std::to_string(code) +
                        "\"\\} ([0-9]+)");
    return std::regex_search(r->body, m, re) ? std::stoi(m[1]) : 0;
  }
};

std::string store_dir(const char* what) {
  return (fs::temp_directory_path() / (std::string("anvil_fault_") + what + "_" + std::to_string(::getpid()))).string();
}
json chat(const std::string& user, const std::string& session, int max_tokens = 6) {
  return {{"messages", {{{"role", "user"}, {"content", user}}}}, {"max_tokens", max_tokens}, {"temperature", 0},
          {"session", session}};
}
json doc_turn(const std::string& prompt, int max_tokens, const std::string& session) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"session", session}, {"ignore_eos", true}};
}
std::string message_of(const json& e) {
  return e.is_object() && e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>() : e.dump();
}

// The disk of the store in `dir` is full for the catalog, or has room again: a trigger fails every
// commit of the store's writer (each one sets its segment's committed_end), or DELETE of a session.
void set_trigger(const std::string& dir, const std::string& name, const std::string& when, bool on) {
  anvil::SqliteDb db;
  ASSERT_TRUE(db.open(dir + "/catalog.db", 10000).is_ok());
  ASSERT_TRUE(db.exec(on ? "CREATE TRIGGER " + name + " " + when +
                               " BEGIN SELECT RAISE(ABORT, 'injected: the disk is full'); END"
                         : "DROP TRIGGER " + name)
                  .is_ok());
}
void fail_commits(const std::string& dir, bool on) {
  set_trigger(dir, "fail_commit", "BEFORE UPDATE OF committed_end ON segments", on);
}
void fail_deletes(const std::string& dir, bool on) { set_trigger(dir, "fail_delete", "BEFORE DELETE ON sessions", on); }

// What a 507 session_not_saved error must say: its fields, the session, the cause, what it holds.
void expect_not_saved(const json& err, const std::string& name, const std::string& holds, const std::string& what) {
  EXPECT_EQ(err["code"], "session_not_saved") << what << ": " << err;
  EXPECT_EQ(err["param"], "session") << what << ": " << err;
  EXPECT_EQ(err["type"], "server_error") << what << ": " << err;
  const std::string m = message_of(err);
  for (const std::string& part : {"session '" + name + "' was not saved", std::string("injected: the disk is full"), holds})
    EXPECT_NE(m.find(part), std::string::npos) << what << ": the message lacks '" << part << "': " << m;
}

}  // namespace

// Not streamed: a turn whose last state the store could not commit answered 200 with the reply (the
// server only said so on its stderr), so the client took the turn for saved. Now it is 507
// session_not_saved, param session, naming the session, the store's cause and what the session
// holds (read back from the store: here its state before the turn, as GET shows it; a new session
// was not created), with the reply the client would have had in `response` (nothing is lost) and
// x-should-retry: false (the openai client retries a 5xx by default, which would generate the turn
// again on a disk that is still full). The server goes on serving meanwhile, and once the store
// commits again the same turn is served as if the failed one had never been: the same prompt
// (continued from the state before it), the same reply, and now recorded.
TEST(ServeStoreFault, ATurnThatCannotBeSavedIs507WithTheReply) {
  const std::string dir = store_dir("turn");
  fs::remove_all(dir);
  {
    Srv a(dir);
    ASSERT_TRUE(a.p->ok()) << a.p->startup_output();
    int st = 0;
    ASSERT_EQ((a.post("/v1/chat/completions", chat("Hello, who are you?", "conv"), &st), st), 200);
    ASSERT_EQ((a.post("/v1/completions", doc_turn("Once upon a time", 4, "doc"), &st), st), 200);
    const json conv_before = a.get("/v1/sessions/conv", &st);
    ASSERT_EQ(st, 200) << conv_before;
    const json doc_before = a.get("/v1/sessions/doc", &st);
    ASSERT_EQ(st, 200) << doc_before;
    ASSERT_EQ(conv_before["messages"].size(), 2u) << conv_before;

    fail_commits(dir, true);
    httplib::Headers h;
    const json ce = a.post("/v1/chat/completions", chat("Tell me more.", "conv"), &st, &h);
    EXPECT_EQ(st, 507) << ce;
    ASSERT_TRUE(ce.contains("error")) << ce;
    expect_not_saved(ce["error"], "conv", "its conversation as it was before this turn (2 messages)", "chat");
    EXPECT_EQ(h.count("x-should-retry") ? h.find("x-should-retry")->second : "", "false");
    const json& cr = ce["error"]["response"];
    EXPECT_EQ(cr["object"], "chat.completion") << ce;
    EXPECT_EQ(cr["choices"][0]["message"]["role"], "assistant") << ce;
    EXPECT_GT(cr["usage"]["completion_tokens"].get<int>(), 0) << ce;
    EXPECT_EQ(a.get("/v1/sessions/conv", &st), conv_before) << "the session changed, or its GET did";

    const json de = a.post("/v1/completions", doc_turn(" and then", 5, "doc"), &st);
    EXPECT_EQ(st, 507) << de;
    ASSERT_TRUE(de.contains("error")) << de;
    expect_not_saved(de["error"], "doc",
                     "its document as it was before this turn (" + std::to_string(doc_before["tokens"].get<int>()) +
                         " tokens)",
                     "completion");
    const json& dr = de["error"]["response"];
    EXPECT_EQ(dr["object"], "text_completion") << de;
    EXPECT_EQ(dr["usage"]["completion_tokens"], 5) << de;
    EXPECT_EQ(a.get("/v1/sessions/doc", &st), doc_before);

    // A session this turn would have created is not: the message says so, and GET finds none.
    const json fe = a.post("/v1/chat/completions", chat("Hello, who are you?", "fresh"), &st);
    EXPECT_EQ(st, 507) << fe;
    ASSERT_TRUE(fe.contains("error")) << fe;
    expect_not_saved(fe["error"], "fresh", "the session was not created", "new chat");
    a.get("/v1/sessions/fresh", &st);
    EXPECT_EQ(st, 404);

    // The server still serves (a request without a session needs no commit to succeed).
    EXPECT_EQ((a.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}}, &st), st), 200);

    fail_commits(dir, false);
    const json c2 = a.post("/v1/chat/completions", chat("Tell me more.", "conv"), &st);
    ASSERT_EQ(st, 200) << c2;
    EXPECT_EQ(c2["usage"]["prompt_tokens"], cr["usage"]["prompt_tokens"]) << "not continued from the same state";
    EXPECT_EQ(c2["choices"][0]["message"], cr["choices"][0]["message"]) << "the error's reply is not the turn's reply";
    const json conv = a.get("/v1/sessions/conv", &st);
    ASSERT_EQ(conv["messages"].size(), 4u) << conv;
    EXPECT_EQ(conv["messages"][2]["content"], "Tell me more.");
    EXPECT_EQ(conv["messages"][3]["content"], c2["choices"][0]["message"]["content"]);

    const json d2 = a.post("/v1/completions", doc_turn(" and then", 5, "doc"), &st);
    ASSERT_EQ(st, 200) << d2;
    EXPECT_EQ(d2["usage"]["prompt_tokens"], dr["usage"]["prompt_tokens"]);
    EXPECT_EQ(d2["choices"][0]["text"], dr["choices"][0]["text"]);
    EXPECT_EQ(a.get("/v1/sessions/doc", &st)["tokens"], d2["usage"]["prompt_tokens"].get<int>() + 5);
    EXPECT_EQ(a.p->terminate(30), 0);
  }
  fs::remove_all(dir);
}

// Streamed: the deltas have gone out when the turn ends, and the stream ended with the usual last
// chunk (finish_reason) and [DONE] although the turn was not saved. Now the last chunk is an error
// event, as for any error after the stream started, then [DONE]: no chunk carries a finish_reason;
// the error says what the 507 says and carries the finish_reason and usage the last chunks would
// have. The deltas are the reply the turn gives once the store commits again.
TEST(ServeStoreFault, AStreamedTurnThatCannotBeSavedEndsWithAnErrorEvent) {
  const std::string dir = store_dir("stream");
  fs::remove_all(dir);
  {
    Srv a(dir);
    ASSERT_TRUE(a.p->ok()) << a.p->startup_output();
    int st = 0;
    ASSERT_EQ((a.post("/v1/chat/completions", chat("Hello, who are you?", "conv"), &st), st), 200);
    ASSERT_EQ((a.post("/v1/completions", doc_turn("Once upon a time", 4, "doc"), &st), st), 200);
    const json conv_before = a.get("/v1/sessions/conv", &st);
    const json doc_before = a.get("/v1/sessions/doc", &st);
    struct Case {
      bool chat;
      const char* session;
    };
    std::vector<std::string> streamed_text(2);
    fail_commits(dir, true);
    for (const Case& c : {Case{true, "conv"}, Case{false, "doc"}}) {
      json body = c.chat ? chat("Tell me more.", c.session) : doc_turn(" and then", 5, c.session);
      body["stream"] = true;
      body["stream_options"] = {{"include_usage", true}};
      const std::string raw = a.post_raw(c.chat ? "/v1/chat/completions" : "/v1/completions", body, &st);
      EXPECT_EQ(st, 200) << raw;
      bool done = false;
      const std::vector<json> evs = sse_events(raw, &done);
      EXPECT_TRUE(done) << raw;
      ASSERT_GE(evs.size(), 2u) << raw;
      std::string text;
      for (size_t i = 0; i + 1 < evs.size(); ++i) {
        ASSERT_TRUE(evs[i].contains("choices") && evs[i]["choices"].size() == 1) << raw;
        const json& ch = evs[i]["choices"][0];
        EXPECT_TRUE(ch["finish_reason"].is_null()) << "a finish_reason for a turn that was not saved: " << raw;
        text += c.chat ? ch["delta"].value("content", "") : ch["text"].get<std::string>();
      }
      const json& last = evs.back();
      ASSERT_TRUE(last.contains("error")) << raw;
      expect_not_saved(last["error"], c.session,
                       c.chat ? std::string("its conversation as it was before this turn (2 messages)")
                              : "its document as it was before this turn (" +
                                    std::to_string(doc_before["tokens"].get<int>()) + " tokens)",
                       c.session);
      EXPECT_TRUE(last["error"]["finish_reason"].is_string()) << raw;
      EXPECT_GT(last["error"]["usage"]["completion_tokens"].get<int>(), 0) << raw;
      streamed_text[c.chat ? 0 : 1] = text;
    }
    EXPECT_EQ(a.get("/v1/sessions/conv", &st), conv_before);
    EXPECT_EQ(a.get("/v1/sessions/doc", &st), doc_before);
    fail_commits(dir, false);
    const json c2 = a.post("/v1/chat/completions", chat("Tell me more.", "conv"), &st);
    ASSERT_EQ(st, 200) << c2;
    EXPECT_EQ(c2["choices"][0]["message"]["content"], streamed_text[0]);
    EXPECT_EQ(a.get("/v1/sessions/conv", &st)["messages"].size(), 4u);
    const json d2 = a.post("/v1/completions", doc_turn(" and then", 5, "doc"), &st);
    ASSERT_EQ(st, 200) << d2;
    EXPECT_EQ(d2["choices"][0]["text"], streamed_text[1]);
    EXPECT_EQ(a.p->terminate(30), 0);
  }
  fs::remove_all(dir);
}

// A session turn through /v1/responses alike: not streamed, 507 session_not_saved with the whole
// Response object in `response`; streamed, the output items close and an `error` event
// (session_not_saved) stands where response.completed would. The session is as it was, and once
// the store commits again the same turn gives the same text and is recorded.
TEST(ServeStoreFault, AResponsesTurnThatCannotBeSavedIsAnError) {
  const std::string dir = store_dir("responses");
  fs::remove_all(dir);
  {
    Srv a(dir);
    ASSERT_TRUE(a.p->ok()) << a.p->startup_output();
    int st = 0;
    auto turn = [](const std::string& input, bool stream) {
      return json{{"input", input}, {"max_output_tokens", 6}, {"temperature", 0}, {"session", "resp"}, {"stream", stream}};
    };
    ASSERT_EQ((a.post("/v1/responses", turn("Hello, who are you?", false), &st), st), 200);
    const json before = a.get("/v1/sessions/resp", &st);
    ASSERT_EQ(st, 200) << before;
    ASSERT_EQ(before["messages"].size(), 2u) << before;

    fail_commits(dir, true);
    httplib::Headers h;
    const json e = a.post("/v1/responses", turn("Tell me more.", false), &st, &h);
    EXPECT_EQ(st, 507) << e;
    ASSERT_TRUE(e.contains("error")) << e;
    expect_not_saved(e["error"], "resp", "its conversation as it was before this turn (2 messages)", "responses");
    EXPECT_EQ(h.count("x-should-retry") ? h.find("x-should-retry")->second : "", "false");
    const json& r = e["error"]["response"];
    EXPECT_EQ(r["object"], "response") << e;
    std::string text;
    for (const json& item : r["output"])
      if (item["type"] == "message") text += item["content"][0]["text"].get<std::string>();
    EXPECT_EQ(a.get("/v1/sessions/resp", &st), before);

    const std::string raw = a.post_raw("/v1/responses", turn("Tell me more.", true), &st);
    EXPECT_EQ(st, 200) << raw;
    std::string streamed;
    json last;
    for (size_t at = raw.find("data: "); at != std::string::npos; at = raw.find("data: ", at + 1)) {
      last = json::parse(raw.substr(at + 6, raw.find('\n', at) - at - 6), nullptr, false);
      if (last.is_object() && last["type"] == "response.output_text.delta") streamed += last["delta"].get<std::string>();
      EXPECT_NE(last.value("type", ""), "response.completed") << "completed, for a turn that was not saved: " << raw;
    }
    ASSERT_TRUE(last.is_object()) << raw;
    EXPECT_EQ(last["type"], "error") << raw;
    EXPECT_EQ(last["code"], "session_not_saved") << raw;
    EXPECT_NE(message_of(last).find("session 'resp' was not saved"), std::string::npos) << raw;
    EXPECT_EQ(streamed, text);
    EXPECT_EQ(a.get("/v1/sessions/resp", &st), before);

    fail_commits(dir, false);
    const json ok = a.post("/v1/responses", turn("Tell me more.", false), &st);
    ASSERT_EQ(st, 200) << ok;
    std::string now;
    for (const json& item : ok["output"])
      if (item["type"] == "message") now += item["content"][0]["text"].get<std::string>();
    EXPECT_EQ(now, text);
    EXPECT_EQ(a.get("/v1/sessions/resp", &st)["messages"].size(), 4u);
    EXPECT_EQ(a.p->terminate(30), 0);
  }
  fs::remove_all(dir);
}

// The official openai client surfaces both as errors (tests/server/session_fault_check.py): the 507
// as InternalServerError (status 507, code session_not_saved, the reply in body["response"]), sent
// once although the client retries a 5xx twice by default (x-should-retry: false); the stream's
// error event as APIError raised by the iterator after the deltas.
TEST(ServeStoreFault, TheOpenAIClientSeesTheTurnWasNotSaved) {
  const std::string dir = store_dir("openai");
  fs::remove_all(dir);
  {
    Srv a(dir);
    ASSERT_TRUE(a.p->ok()) << a.p->startup_output();
    int st = 0;
    ASSERT_EQ((a.post("/v1/chat/completions", chat("Hello, who are you?", "conv"), &st), st), 200);
    fail_commits(dir, true);
    auto [code, out] = run_python_check("session_fault_check.py", a.p->port(), {"conv"});
    fail_commits(dir, false);
    if (code == 77) GTEST_SKIP() << out;
    EXPECT_EQ(code, 0) << out;
    EXPECT_EQ(a.requests("/v1/chat/completions", 507), 1) << "the client sent the failed turn again";
    EXPECT_EQ(a.get("/v1/sessions/conv", &st)["messages"].size(), 2u);
    EXPECT_EQ(a.p->terminate(30), 0);
  }
  fs::remove_all(dir);
}

// DELETE of a session whose removal the store cannot commit answered 500 with the catalog's bare
// message ("catalog: DELETE FROM sessions ...: injected ..."), naming neither the session nor what
// became of it. Now 507 session_not_removed, param session, naming the session and the cause and
// saying it is kept as it was; it is (GET shows it unchanged), and once the store commits again
// DELETE removes it.
TEST(ServeStoreFault, ADeleteThatCannotBeCommittedIs507AndKeepsTheSession) {
  const std::string dir = store_dir("delete");
  fs::remove_all(dir);
  {
    Srv a(dir);
    ASSERT_TRUE(a.p->ok()) << a.p->startup_output();
    int st = 0;
    ASSERT_EQ((a.post("/v1/chat/completions", chat("Hello, who are you?", "conv"), &st), st), 200);
    const json before = a.get("/v1/sessions/conv", &st);
    fail_deletes(dir, true);
    json body;
    EXPECT_EQ(a.del("/v1/sessions/conv", &body), 507) << body;
    EXPECT_EQ(body["error"]["code"], "session_not_removed") << body;
    EXPECT_EQ(body["error"]["param"], "session") << body;
    EXPECT_EQ(body["error"]["type"], "server_error") << body;
    const std::string m = message_of(body["error"]);
    for (const std::string& part : {std::string("session 'conv' was not removed"),
                                    std::string("injected: the disk is full"), std::string("it is kept as it was")})
      EXPECT_NE(m.find(part), std::string::npos) << "the message lacks '" << part << "': " << m;
    EXPECT_EQ(m.find(dir), std::string::npos) << "the server's store path shown to a client: " << m;
    EXPECT_EQ(a.get("/v1/sessions/conv", &st), before);
    fail_deletes(dir, false);
    EXPECT_EQ(a.del("/v1/sessions/conv", &body), 200) << body;
    a.get("/v1/sessions/conv", &st);
    EXPECT_EQ(st, 404);
    EXPECT_EQ(a.p->terminate(30), 0);
  }
  fs::remove_all(dir);
}

// What the message says the session holds is what the store holds, read back, against the session
// as the turn found it: the state before the turn (send the turn again), none (not created), or,
// when a flush in the middle of the turn committed and its last state did not, a completion
// document that holds part of the turn (which sending the turn again would repeat: no such advice),
// or a conversation that is not the one the turn continued (the count GET shows).
TEST(ServeStoreFault, TheMessageSaysWhatTheStoreHolds) {
  using anvil::server::SessionBefore;
  auto tok = anvil::Tokenizer::load(anvil::default_tokenizer_dir() + "/tokenizer.json");
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  const anvil::TokenizerConfig cfg;
  const anvil::server::ChatModel model{cfg, **tok, {}};
  const anvil::Status why = anvil::io_error("session 'x' was not saved: database or disk is full");
  auto info = [](std::vector<int32_t> toks, const std::string& meta) {
    anvil::SessionInfo s;
    s.name = "x";
    s.tokens = std::move(toks);
    s.meta = meta;
    return anvil::Result<std::optional<anvil::SessionInfo>>(std::optional<anvil::SessionInfo>(std::move(s)));
  };
  auto message = [&](bool chat, const SessionBefore& before, const anvil::Result<std::optional<anvil::SessionInfo>>& now,
                     bool streamed = false) {
    anvil::server::ApiError e = anvil::server::session_not_saved_error("x", chat, before, why, now, model, streamed);
    EXPECT_EQ(e.status, 507);
    EXPECT_EQ(e.code, "session_not_saved");
    EXPECT_EQ(e.param, "session");
    EXPECT_EQ(e.message.rfind(why.message(), 0), 0u) << e.message;
    return e.message;
  };
  auto has = [](const std::string& m, const std::string& part) { return m.find(part) != std::string::npos; };
  SessionBefore doc{true, nlohmann::ordered_json::array(), {5, 6, 7}};
  std::string m = message(false, doc, info({5, 6, 7}, ""));
  EXPECT_TRUE(has(m, "its document as it was before this turn (3 tokens)")) << m;
  EXPECT_TRUE(has(m, "send the turn again")) << m;
  EXPECT_TRUE(has(m, "in this error's 'response'")) << m;
  m = message(false, doc, info({5, 6, 7, 8, 9}, ""), /*streamed=*/true);
  EXPECT_TRUE(has(m, "it holds 5 tokens: its document before this turn (3 tokens) and the first 2 of this turn's")) << m;
  EXPECT_FALSE(has(m, "send the turn again")) << "the turn would be repeated in part: " << m;
  EXPECT_TRUE(has(m, "the text streamed before this error")) << m;
  m = message(false, SessionBefore{}, anvil::Result<std::optional<anvil::SessionInfo>>(std::optional<anvil::SessionInfo>()));
  EXPECT_TRUE(has(m, "the session was not created")) << m;
  m = message(false, SessionBefore{}, anvil::Result<std::optional<anvil::SessionInfo>>(anvil::io_error("disk I/O error")));
  EXPECT_TRUE(has(m, "could not be read (disk I/O error)")) << m;

  const nlohmann::ordered_json two = {{{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", "Hello"}}};
  SessionBefore conv{true, two, {}};
  m = message(true, conv, info({1, 2}, anvil::server::chat_session_meta(two)));
  EXPECT_TRUE(has(m, "its conversation as it was before this turn (2 messages)")) << m;
  m = message(true, conv, info({1, 2}, anvil::server::chat_session_meta(nlohmann::ordered_json::array())));
  EXPECT_TRUE(has(m, "it holds a conversation of 0 messages, as GET /v1/sessions/x shows it")) << m;
  EXPECT_FALSE(has(m, "send the turn again")) << m;
}
