#include "server/http_server.h"

#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "server/api_key.h"
#include "server/chat_output.h"
#include "server/chat_page.h"
#include "server/connection_probe.h"
#include "server/http_threads.h"
#include "server/openai_reply.h"
#include "server/response_store.h"
#include "server/responses_items.h"
#include "server/responses_reply.h"
#include "server/session_locks.h"
#include "server/sessions.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/reasoning.h"

namespace anvil::server {

using clock = std::chrono::steady_clock;

namespace {

std::string dump(const ojson& j) { return dump_json(j); }

void send_json(httplib::Response& res, int status, const ojson& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  if (e.status == 503) res.set_header("Retry-After", "1");
  send_json(res, e.status, error_body(e));
}

// send_error, and the connection closes after the reply (for a request whose body is left unread,
// which would otherwise be read as the next request). cpp-httplib 0.11 closes a connection only
// when the request asked for it or a write fails: a header the handler sets is just sent. So the
// request is marked "Connection: close" (the reply then says so, without the Keep-Alive header it
// would get), and the body goes out through a content provider that writes all of it, then
// cancels: the library ends the connection, whole reply sent.
void send_error_and_close(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
  // (The request is not const where the library holds it; only this handler's view of it is.)
  auto& headers = const_cast<httplib::Request&>(req).headers;
  headers.erase("Connection");
  headers.emplace("Connection", "close");
  res.status = e.status;
  auto body = std::make_shared<std::string>(dump(error_body(e)));
  res.set_content_provider(body->size(), "application/json",
                           [body](size_t offset, size_t length, httplib::DataSink& sink) {
                             sink.write(body->data() + offset, length);
                             return false;  // written: now cancel, which closes the connection
                           });
}

ApiError api_error(int status, const std::string& param, const std::string& message, const std::string& code = "",
                   const std::string& type = "invalid_request_error") {
  ApiError e;
  e.status = status;
  e.param = param;
  e.message = message;
  e.code = code;
  e.type = type;
  return e;
}

// A job's failure as the client sees it.
ApiError status_error(const Status& st) {
  switch (st.code()) {
    case StatusCode::kInvalidArgument: return api_error(400, "", st.message());
    case StatusCode::kOutOfMemory: return api_error(503, "", st.message(), "server_busy", "server_error");
    case StatusCode::kBusy: return api_error(409, "session", st.message(), "session_busy");
    default: return api_error(500, "", st.message(), "", "server_error");
  }
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* kAlnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kAlnum[rng() % 62];
  return id;
}

// Debian's cpp-httplib listens with a backlog of 5: a burst of clients (32 streams connecting at
// once) overflows it, the kernel drops their handshakes, and a retransmitted request can arrive
// after the server gave up on the connection. listen() on a listening socket only raises its
// backlog, so find ours (the one listening on `port`) and raise it.
void raise_listen_backlog(int port, int backlog) {
  for (int fd = 0; fd < 4096; ++fd) {
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage ss{};
    socklen_t sl = sizeof ss;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl) != 0) continue;
    int p = ss.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port)
            : ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port) : -1;
    if (p == port) listen(fd, backlog);
  }
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Endpoint label for the request counter (a fixed set: unknown paths must not grow the metric).
std::string endpoint_label(const std::string& path) {
  static const char* known[] = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/health", "/metrics",
                                "/tokenize", "/detokenize", "/"};
  for (const char* k : known)
    if (path == k) return k;
  if (path == "/chat/completions") return "/v1/chat/completions";
  if (path == "/completions") return "/v1/completions";
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models";
  if (path == "/v1/sessions" || path.rfind("/v1/sessions/", 0) == 0) return "/v1/sessions";
  if (path.rfind("/v1/responses/", 0) == 0) return "/v1/responses";
  return "other";
}

}  // namespace

namespace {
struct SessionTurn;  // one request's hold on a session: below
}  // namespace

struct HttpServer::Impl {
  ServerOptions opts;
  Engine& engine;
  const Tokenizer& tok;
  TokenizerConfig cfg;
  Metrics& metrics;
  bool has_template = false;
  bool split_reasoning = false;  // the vocabulary has <think>
  std::unique_ptr<Scheduler> sched;
  httplib::Server svr;
  int port = 0;
  std::atomic<bool> draining{false};
  int64_t created = unix_now();
  std::mutex shutdown_mu;
  bool shut_down = false;
  // Streaming responses still writing. httplib stops calling a stream's content provider once the
  // server stops, so shutdown() waits for these to reach their last event first.
  std::atomic<int> open_streams{0};
  SessionLocks sessions;
  std::unique_ptr<ResponseStore> stored_responses;  // with the KV store and --responses-keep > 0

  Impl(ServerOptions o, Engine& e, const Tokenizer& t, TokenizerConfig c, Metrics& m)
      : opts(std::move(o)), engine(e), tok(t), cfg(std::move(c)), metrics(m) {
    has_template = !cfg.chat_template.empty() || !cfg.named_chat_templates.empty();
    split_reasoning = vocabulary_has_reasoning(tok);
    opts.defaults.vocab_size = int(engine.model().config().vocab_size);  // logit_bias ids are checked against it
  }

  void routes();
  // chat: /v1/chat/completions, or with `responses` /v1/responses (the chat path, another reply); else
  // /v1/completions.
  void handle_generate(const httplib::Request& req, httplib::Response& res, bool chat, bool responses = false);
  // A reply to `r` for `job` (stream as r asks; echo text and index left to the caller): for chat its
  // ChatOutput, started inside the forced tool call when tool_choice prefilled one (`forced`).
  std::shared_ptr<Reply> make_reply(const ApiRequest& r, std::shared_ptr<Job> job, std::string id, int64_t created,
                                    bool starts_in_reasoning, const std::string& forced) const;
  // A request of several choices (n > 1, or completions with several prompts; never a session or a
  // Response): a job per choice, prompt by prompt and n for each (choice j of a prompt samples
  // with base's seed + j), all submitted before the reply waits; the choices' replies as one body
  // or one stream, the usage over all of them (each prompt counted once).
  void serve_choices(const httplib::Request& req, httplib::Response& res, const ApiRequest& r, GenerationParams base,
                     std::vector<std::vector<int32_t>> prompts, std::vector<std::string> echo_texts,
                     bool starts_in_reasoning, const std::string& forced);
  // to_store: the conversation (instructions apart) to store with the reply under the response's id.
  void serve_responses(const httplib::Request& req, httplib::Response& res, std::shared_ptr<Reply> reply,
                       ResponsesEcho echo, bool stream, bool starts_in_reasoning, std::shared_ptr<SessionTurn> turn,
                       std::optional<ojson> to_store);
  ApiError response_not_found(const std::string& id) const;
  std::optional<StoredResponse> stored_or_error(const std::string& id, httplib::Response& res);
  // GET /v1/responses/{id}/input_items.
  void handle_input_items(const httplib::Request& req, httplib::Response& res);
  // GET / DELETE /v1/responses/{id}.
  void handle_stored_response(const httplib::Request& req, httplib::Response& res, bool remove);
  // A server-sent event stream of `job`'s events: `first()` once (nothing when empty), then what
  // `render` makes of each event; it ends after the first event that is not a delta. A client that
  // goes away cancels the job; `finished(success)` runs when the HTTP library lets go of the stream.
  void stream_job(httplib::Response& res, std::shared_ptr<Job> job, std::function<std::string()> first,
                  std::function<std::string(const JobEvent&)> render, std::function<void(bool)> finished);
  void handle_tokenize(const httplib::Request& req, httplib::Response& res);
  void handle_sessions(const httplib::Request& req, httplib::Response& res);
  void handle_session(const httplib::Request& req, httplib::Response& res, bool remove);
  void handle_detokenize(const httplib::Request& req, httplib::Response& res);
  // `e` as a client may see it: the KV store's directory (a path of this host, in the store's own
  // messages) left out of its message; the server's log keeps the whole message.
  ApiError for_client(ApiError e) const;
  ChatModel chat_model() const { return ChatModel{cfg, tok, opts.eos_ids}; }
  ojson model_json() const {
    return ojson{{"id", opts.defaults.model_id}, {"object", "model"}, {"created", created}, {"owned_by", "anvil"},
                 {"max_model_len", opts.defaults.max_context}};
  }
};


namespace {
// A non-streamed request's job, waited for: each event goes to `on_event` until it returns true (the
// reply is sent). A client that goes away is noticed within ~100 ms and its job cancelled (its
// sequence's pages freed). Its socket is looked up at once, while it is surely connected (one that
// the client has reset is no longer connected, and a search by addresses does not find it).
void wait_unstreamed(const httplib::Request& req, Job& job, const std::function<bool(const JobEvent&)>& on_event) {
  const int fd = connection_socket(req.remote_addr, req.remote_port, req.local_port);
  auto next_probe = clock::now() + std::chrono::milliseconds(100);
  for (;;) {
    std::vector<JobEvent> evs;
    job.wait(&evs, std::chrono::milliseconds(100));
    if (clock::now() >= next_probe && !job.cancelled()) {
      next_probe = clock::now() + std::chrono::milliseconds(100);
      if (fd >= 0 && connection_gone(fd, req.remote_addr, req.remote_port, req.local_port)) job.cancel();
    }
    for (const JobEvent& e : evs)
      if (on_event(e)) return;
  }
}

// One wait of a stream's content provider for its job's next events (into *evs). False when none
// came: then, after a second without a write, a comment line keeps proxies from timing out and finds
// a client that has gone (the second write to a closed socket fails: *gone).
bool stream_events(Job& job, std::vector<JobEvent>* evs, clock::time_point* last_write, httplib::DataSink& sink,
                   bool* gone) {
  *gone = false;
  if (job.wait(evs, std::chrono::milliseconds(250))) return true;
  if (clock::now() - *last_write > std::chrono::seconds(1)) {
    static const std::string kKeepAlive = ": keep-alive\n\n";
    *last_write = clock::now();
    *gone = !sink.write(kKeepAlive.data(), kKeepAlive.size());
  }
  return false;
}
}  // namespace

namespace {
// A request's hold on its session as the requests that find it held see it (SessionLocks::Holder):
// leaving once its client has gone away (its connection's peer closed; its job is then cancelled
// here, so that the scheduler drops it at its next step instead of when the stream's next write
// fails), its job was cancelled, or its turn is ending. Only a connection seen closed counts: one
// that cannot be found is taken as live (never a live client's turn cancelled by mistake). Its
// socket is found when the request comes, while it is surely connected: a client that resets the
// connection (closes with the reply's bytes unread) leaves a socket no longer connected, which no
// search by addresses finds.
class RequestHolder : public SessionLocks::Holder {
 public:
  explicit RequestHolder(const httplib::Request& req)
      : remote_addr_(req.remote_addr),
        remote_port_(req.remote_port),
        local_port_(req.local_port),
        fd_(connection_socket(remote_addr_, remote_port_, local_port_)) {}

  bool leaving() override {
    std::lock_guard<std::mutex> lk(mu_);
    if (leaving_ || (job_ && job_->cancelled())) return leaving_ = true;
    // The socket is still this request's: it holds the session, and lets go of it before its handler
    // returns and the HTTP library closes the connection (SessionLocks calls this under its mutex,
    // which that release takes).
    if (fd_ < 0 || !connection_gone(fd_, remote_addr_, remote_port_, local_port_)) return false;
    leaving_ = true;
    if (job_) job_->cancel();
    return true;
  }
  // The request's job, once submitted (cancelled at once when its client was seen gone before).
  void set_job(std::shared_ptr<Job> job) {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = std::move(job);
    if (leaving_) job_->cancel();
  }
  // The turn is ending (SessionTurn::end): it lets go once its recording is committed.
  void ending() {
    std::lock_guard<std::mutex> lk(mu_);
    leaving_ = true;
  }

 private:
  const std::string remote_addr_;
  const int remote_port_, local_port_;
  const int fd_;  // -1: not found (taken as live)
  std::mutex mu_;
  bool leaving_ = false;
  std::shared_ptr<Job> job_;
};

// What became of a turn whose last state the store could not commit (a full disk, an I/O error):
// session_finish's error, and the session as it is afterwards, read back while the turn still
// claims it (no other process can have changed it since).
struct NotSaved {
  Status why;
  Result<std::optional<SessionInfo>> now = std::optional<SessionInfo>();
};

// One request's hold on a session (sessions.h): the name's lock in this server and its claim in the
// store (KVStore::claim_session: no other process changes it meanwhile), both from validation,
// before the session is read, to the end of the turn; and the end of its recording
// (KVStore::session_finish, which waits for the commit, so a reply that is complete is durable).
// Ending it without a successful reply keeps the session's conversation as it was (its tokens keep
// whatever was generated: tokens are the truth).
struct SessionTurn {
  SessionLocks* locks = nullptr;
  std::shared_ptr<RequestHolder> holder;  // what a request that finds the session held asks
  KVStore* store = nullptr;
  Scheduler* sched = nullptr;  // reads the store on its thread (the store's connection is the scheduler's)
  std::string name;
  bool chat = false;
  bool claimed = false;   // the store's claim is this turn's to let go
  std::shared_ptr<Job> job;
  ojson messages;         // chat: the stored messages + this request's
  std::string keep_meta;  // the meta recorded when the turn does not succeed
  SessionBefore before;   // the session as this turn found it (what a turn not saved is told against)
  bool ended = false;

  // `reply`: the finished reply (kDone), or nullptr (an error, or the client went away). Returns
  // what became of a turn whose last state could not be committed (nullopt: it was, or nothing was
  // recorded), for the reply to say so; it is logged either way.
  std::optional<NotSaved> end(const Reply* reply) {
    if (ended) return std::nullopt;
    ended = true;
    std::optional<NotSaved> lost;
    holder->ending();  // a next turn that comes meanwhile waits for the release below
    if (job) {
      if (!job->wait_ended(std::chrono::milliseconds(0))) job->cancel();
      while (!job->wait_ended(std::chrono::seconds(1))) {
      }  // the scheduler ends every job (its invariant 3), also when it stops
      if (job->session_recorded()) {
        std::string meta = keep_meta;
        if (chat && reply && reply->finish != "cancelled" && reply->violation.empty()) {
          ojson m = messages;
          m.push_back(reply->assistant_message());
          meta = chat_session_meta(m);
        }
        auto d = store->session_finish(name, meta);
        if (!d.is_ok()) {
          std::fprintf(stderr, "[anvil] session %s: %s\n", name.c_str(), d.status().message().c_str());
          lost = NotSaved{d.status()};
          sched->call([&] { lost->now = store->find_session(name); });
        }
      }
    }
    if (claimed) store->release_session(name);
    locks->release(name);
    return lost;
  }
  ~SessionTurn() { end(nullptr); }
};
}  // namespace

void HttpServer::Impl::handle_generate(const httplib::Request& req, httplib::Response& res, bool chat, bool responses) {
  if (draining.load())
    return send_error(res, api_error(503, "", "the server is shutting down", "server_busy", "server_error"));
  ApiRequest r;
  ResponsesEcho echo;
  auto err = responses ? parse_responses_request(req.body, opts.defaults, &r, &echo)
             : chat    ? parse_chat_request(req.body, opts.defaults, &r)
                       : parse_completion_request(req.body, opts.defaults, &r);
  if (err) return send_error(res, *err);
  std::shared_ptr<SessionTurn> turn;
  std::optional<SessionInfo> sinfo;
  std::optional<ojson> to_store;  // /v1/responses: the conversation stored with the reply (instructions apart)
  if (responses) {
    const ojson& ins = echo.fields["instructions"];
    const bool has_ins = ins.is_string() && !ins.get_ref<const std::string&>().empty();  // r.messages[0] then
    if (!echo.previous_response_id.empty()) {
      const std::string& prev = echo.previous_response_id;
      if (!r.session.empty())
        return send_error(res, api_error(400, "previous_response_id",
                                         "give one of 'previous_response_id' and 'session' (a stored response is "
                                         "continued by its id, a session by its name)"));
      if (!stored_responses)
        return send_error(res, api_error(400, "previous_response_id",
                                         "'previous_response_id' needs stored responses: this server runs without the "
                                         "durable KV store (--no-kv-store) or with --responses-keep 0"));
      auto got = stored_responses->get(prev);
      if (!got.is_ok())
        return send_error(res, for_client(api_error(500, "previous_response_id", got.status().message(), "", "server_error")));
      if (!*got)
        return send_error(res, api_error(400, "previous_response_id",
                                         "previous response '" + prev.substr(0, 200) + "' not found (this server keeps "
                                         "the last " + std::to_string(opts.responses_keep) +
                                         " stored responses of this model; one sent with 'store': false is not kept)",
                                         "previous_response_not_found"));
      const ojson prior = ojson::parse((*got)->messages, nullptr, false);
      if (!prior.is_array())
        return send_error(res, api_error(500, "previous_response_id", "stored response '" + prev + "' is unreadable",
                                         "", "server_error"));
      // This request's instructions first (the previous response's are not carried over, as OpenAI's
      // API has it), then the conversation so far, then this request's input.
      ojson conv = ojson::array();
      if (has_ins) conv.push_back(r.messages[0]);
      for (const ojson& m : prior) conv.push_back(m);
      for (size_t i = has_ins ? 1 : 0; i < r.messages.size(); ++i) conv.push_back(r.messages[i]);
      r.messages = std::move(conv);
    }
    if (echo.store && stored_responses && r.session.empty()) {
      to_store = ojson::array();
      for (size_t i = has_ins ? 1 : 0; i < r.messages.size(); ++i) to_store->push_back(r.messages[i]);
    }
    echo.fields["store"] = to_store.has_value();
  }
  if (!r.session.empty()) {
    if (!opts.store)
      return send_error(res, api_error(400, "session",
                                       "'session' needs the durable KV store, and this server runs without one "
                                       "(--no-kv-store, or a device the store does not support yet)"));
    // A request holding the session whose client has gone (a stopped stream) is waited for, bounded.
    auto holder = std::make_shared<RequestHolder>(req);
    switch (sessions.acquire(r.session, holder)) {
      case SessionLocks::Acquire::kAcquired: break;
      case SessionLocks::Acquire::kBusy:
        return send_error(res, api_error(409, "session", "session '" + r.session +
                                                             "' is in use by another request; send the next turn when "
                                                             "that one has finished",
                                         "session_busy"));
      case SessionLocks::Acquire::kTimedOut:
        return send_error(res, api_error(409, "session", "session '" + r.session +
                                                             "' is still held by a request whose client went away; "
                                                             "send the turn again in a moment",
                                         "session_busy"));
    }
    turn = std::make_shared<SessionTurn>();
    turn->locks = &sessions;
    turn->holder = std::move(holder);
    turn->store = opts.store;
    turn->sched = sched.get();
    turn->name = r.session;
    turn->chat = chat;
    // Claimed before it is read (invariant 9 of kvstore.h): what this turn continues is what is
    // committed when it runs, since no other process can change the session until the turn ends.
    Status claim;
    Result<std::optional<SessionInfo>> got = std::optional<SessionInfo>();
    sched->call([&] {
      claim = opts.store->claim_session(r.session);
      if (claim.is_ok()) got = opts.store->find_session(r.session);
    });
    if (claim.code() == StatusCode::kBusy)
      return send_error(res, api_error(409, "session", "session '" + r.session +
                                                           "' is in use by another process on this server's KV store "
                                                           "(anvil run/generate or another server); send the turn when "
                                                           "that one has finished",
                                       "session_busy"));
    if (!claim.is_ok())
      return send_error(res, for_client(api_error(500, "session", claim.message(), "", "server_error")));
    turn->claimed = true;
    if (!got.is_ok())
      return send_error(res, for_client(api_error(500, "session", got.status().message(), "", "server_error")));
    sinfo = *got;
    turn->before.existed = sinfo.has_value();
    if (sinfo && sinfo->fingerprint != opts.store->fingerprint())
      return send_error(res, api_error(400, "session", "session '" + r.session +
                                                           "' was recorded with another model or KV layout (--kv-dtype, "
                                                           "--page-size)"));
    // Its own record cannot be trusted: refused, and left as it is (the turn ends here: its claim
    // and lock are let go, nothing was recorded).
    if (sinfo && !sinfo->damaged.empty()) return send_error(res, session_damaged_error(*sinfo));
    if (chat) {
      ojson stored = ojson::array();
      bool taken_up = false;
      if (sinfo) {
        // A turn anvil run began and never finished (killed mid-answer: its conversation ends with
        // the question) is taken up as anvil run --resume takes it up (cut_turn.h): what was
        // answered is the assistant's message, an unanswered question is dropped.
        if (auto e = session_messages(*sinfo, chat_model(), r.enable_thinking, &stored, &taken_up))
          return send_error(res, *e);
      }
      // What a turn that fails records: the conversation as this turn continued it. A taken-up turn
      // stays taken up: the stored conversation, ending with the question, would read the failed
      // turn's tokens (recorded: tokens are the truth) as the cut answer's next time.
      turn->keep_meta = sinfo && !taken_up ? sinfo->meta : chat_session_meta(stored);
      turn->before.messages = stored;
      // The Responses API sends its instructions with every request; a session holds them once, as
      // the system message it began with. The same instructions again are that message; others
      // (or instructions for a session that began without) are refused, not put mid-conversation.
      if (responses && !stored.empty() && echo.fields.contains("instructions") &&
          echo.fields["instructions"].is_string() && !echo.fields["instructions"].get_ref<const std::string&>().empty()) {
        const ojson& first = stored[0];
        const bool same = first.is_object() && first.value("role", "") == "system" && first.contains("content") &&
                          first["content"] == echo.fields["instructions"];
        if (!same)
          return send_error(res, api_error(400, "instructions",
                                           "session '" + r.session + "' began with " +
                                               (first.is_object() && first.value("role", "") == "system"
                                                    ? "other instructions"
                                                    : "no instructions") +
                                               "; a session keeps the instructions of its first turn (send the same "
                                               "instructions, or none)"));
        r.messages.erase(r.messages.begin());  // the instructions' system message: the session's first
      }
      for (const ojson& m : r.messages) stored.push_back(m);
      r.messages = stored;
      turn->messages = std::move(stored);
    } else {
      if (sinfo)
        if (auto e = session_kind_error(*sinfo, /*chat=*/false)) return send_error(res, *e);
      turn->keep_meta = sinfo ? sinfo->meta : "";
      if (sinfo) turn->before.tokens = sinfo->tokens;
    }
  }
  const int ctx = opts.defaults.max_context;
  const int V = engine.model().config().vocab_size;
  std::vector<int32_t> prompt;
  std::vector<std::vector<int32_t>> more_prompts;  // completions with several prompts: the others
  std::vector<std::string> echo_texts;             // echo: each prompt's text
  bool starts_in_reasoning = false;
  std::string forced;  // text the answer starts with (tool_choice required / named)
  const char* prompt_param = responses ? "input" : chat ? "messages" : "prompt";
  if (chat) {
    if (!has_template)
      return send_error(res, api_error(400, prompt_param,
                                       "this model has no chat template (tokenizer_config.json); use /v1/completions"));
    auto text = apply_chat_template(cfg, r.messages, r.tools, true, r.enable_thinking, r.template_kwargs);
    if (!text.is_ok()) return send_error(res, api_error(400, prompt_param, text.status().message()));
    starts_in_reasoning = split_reasoning && prompt_opens_reasoning(*text);
    if (r.tool_choice == "required" || r.tool_choice == "function") {
      // As vLLM and llama-server do for Qwen/Hermes templates, but by prefilling instead of a
      // grammar: the answer starts inside a tool call ("required": the model picks the function;
      // named: the function is given too), and the reply is checked to be a valid call.
      if (!tok.token_to_id("<tool_call>") || text->find("<tool_call>") == std::string::npos)
        return send_error(res, api_error(400, "tool_choice",
                                         "'tool_choice' '" + (r.forced_tool.empty() ? r.tool_choice : r.forced_tool) +
                                             "' needs a chat template that asks for Qwen/Hermes-style <tool_call> "
                                             "blocks; this model's does not (use 'auto')"));
      forced = std::string(starts_in_reasoning ? "</think>\n\n" : "") + "<tool_call>\n{\"name\": \"";
      // The name as a JSON string (escaped), its opening quote already written.
      if (!r.forced_tool.empty()) forced += ojson(r.forced_tool).dump().substr(1) + ", \"arguments\": ";
      *text += forced;
    }
    prompt = tok.encode(*text, /*add_special_tokens=*/false);  // the template wrote BOS itself
  } else {
    // Completions: each prompt (several: one or n choices each); a text prompt gets BOS as
    // transformers' tokenizer(prompt) adds it, not in the middle of a session's document.
    std::vector<const ApiRequest::Prompt*> rest;
    for (const auto& m : r.more_prompts) rest.push_back(&m);
    for (size_t k = 0; k <= rest.size(); ++k) {
      const bool is_ids = k == 0 ? r.prompt_is_ids : rest[k - 1]->is_ids;
      const std::vector<int32_t>& ids = k == 0 ? r.prompt_ids : rest[k - 1]->ids;
      const std::string& text = k == 0 ? r.prompt_text : rest[k - 1]->text;
      const std::string name = rest.empty() ? "prompt" : "prompt[" + std::to_string(k) + "]";
      std::vector<int32_t>& out = k == 0 ? prompt : more_prompts.emplace_back();
      if (is_ids) {
        for (size_t i = 0; i < ids.size(); ++i)
          if (ids[i] >= V)
            return send_error(res, api_error(400, "prompt", "'" + name + "[" + std::to_string(i) + "]' = " +
                                                                 std::to_string(ids[i]) + " is outside the vocabulary [0, " +
                                                                 std::to_string(V) + ")"));
        out = ids;
      } else {
        out = tok.encode(text, r.add_special_tokens && !sinfo);
      }
      // echo: the prompt as sent, or token ids as they decode (special tokens skipped, as vLLM does).
      if (r.gen.echo) echo_texts.push_back(is_ids ? tok.decode(out, /*skip_special=*/true) : text);
    }
  }
  if (!chat && sinfo) prompt.insert(prompt.begin(), sinfo->tokens.begin(), sinfo->tokens.end());  // the document goes on
  for (size_t k = 0; k <= more_prompts.size(); ++k) {
    const std::vector<int32_t>& pk = k == 0 ? prompt : more_prompts[k - 1];
    const std::string which = more_prompts.empty() ? "the prompt" : "prompt[" + std::to_string(k) + "]";
    if (pk.empty())
      return send_error(res, api_error(400, prompt_param,
                                       !chat && !r.session.empty()
                                           ? "'prompt' must not be empty (an empty prompt continues a session that "
                                             "holds tokens; session '" + r.session + "' holds none)"
                                           : which + " encodes to no tokens"));
    if (int(pk.size()) >= ctx)
      return send_error(res, api_error(400, prompt_param,
                                       which + " is " + std::to_string(pk.size()) +
                                           " tokens; this server's context is " + std::to_string(ctx) +
                                           " tokens, which must also hold at least one generated token",
                                       "context_length_exceeded"));
    const int room_k = ctx - int(pk.size());
    if (r.max_tokens && *r.max_tokens > room_k)
      return send_error(res, api_error(400, responses ? "max_output_tokens" : "max_tokens",
                                       std::string(responses ? "max_output_tokens" : "max_tokens") + " is " +
                                           std::to_string(*r.max_tokens) + " but " + which + " (" +
                                           std::to_string(pk.size()) + " tokens) leaves room for " +
                                           std::to_string(room_k) + " in the " + std::to_string(ctx) + "-token context",
                                       "context_length_exceeded"));
  }
  const int room = ctx - int(prompt.size());
  GenerationParams g = r.gen;
  g.prompt = std::move(prompt);
  if (g.json_object) {
    if (auto v = sched->json_vocab(); !v.is_ok()) return send_error(res, api_error(400, "response_format", v.status().message()));
    // Reasoning is not constrained: the content is, from its first token (after </think>).
    if (chat && split_reasoning) {
      g.json_think_open = *tok.token_to_id("<think>");  // split_reasoning: the vocabulary has both tags
      g.json_think_close = *tok.token_to_id("</think>");
      g.json_in_reasoning = starts_in_reasoning;
    }
  }
  // A stop never cuts a tag that opens or closes the reasoning, nor a tool call's; the state they
  // start in is the one the reply's ChatOutput starts in (a forced call is open, its prefill having
  // closed the reasoning).
  if (chat && split_reasoning) g.stop_markup.push_back(reasoning_markup(starts_in_reasoning && forced.empty()));
  if (chat && r.parse_tool_calls) g.stop_markup.push_back({"<tool_call>", "</tool_call>", !forced.empty()});
  if (turn) {
    g.session = r.session;
    g.session_meta = turn->keep_meta;
  }
  g.max_tokens = r.max_tokens.value_or(room);
  std::string echo_text = echo_texts.empty() ? std::string() : echo_texts[0];
  if ((!r.seed_given && !opts.seed_fixed) || r.seed_random) g.sampling.seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  if (Status st = validate(g.sampling); !st.is_ok()) return send_error(res, api_error(400, "", st.message()));
  if (r.n > 1 || !more_prompts.empty()) {
    if (responses) return send_error(res, api_error(400, "n", "a Response has one reply: 'n' must be 1"));
    more_prompts.insert(more_prompts.begin(), std::move(g.prompt));
    return serve_choices(req, res, r, std::move(g), std::move(more_prompts), std::move(echo_texts), starts_in_reasoning,
                         forced);
  }
  auto job = std::make_shared<Job>(std::move(g));
  if (Status st = sched->submit(job); !st.is_ok()) {
    metrics.rejected_busy++;
    return send_error(res, api_error(503, "", st.message(), "server_busy", "server_error"));
  }
  if (turn) {
    turn->job = job;
    turn->holder->set_job(job);
  }

  auto reply = make_reply(r, job, random_id(chat ? "chatcmpl-" : "cmpl-"), unix_now(), starts_in_reasoning, forced);
  reply->stream = r.stream && !responses;  // a Responses reply renders the chat one's accumulated parts
  reply->echo_text = std::move(echo_text);
  if (responses)
    return serve_responses(req, res, std::move(reply), std::move(echo), r.stream, starts_in_reasoning && forced.empty(),
                           std::move(turn), std::move(to_store));

  if (!r.stream) {
    wait_unstreamed(req, *job, [&](const JobEvent& e) {
      if (e.kind == JobEvent::kDelta) {
        reply->on_delta(e);
        return false;
      } else if (e.kind == JobEvent::kError) {
        if (turn) turn->end(nullptr);
        send_error(res, for_client(status_error(e.error)));
        return true;
      } else {
        reply->on_done(e.finish_reason);
        std::optional<NotSaved> lost;
        if (turn) lost = turn->end(reply.get());
        if (!reply->violation.empty()) {
          send_error(res, api_error(500, "tool_choice", reply->violation, "tool_choice_not_followed", "server_error"));
        } else if (lost) {
          // Not a 200 for a turn that is not saved; the reply goes with the error, so nothing is
          // lost. Sent once: a client that retries a 5xx would generate the turn again (the
          // openai client obeys x-should-retry).
          ApiError ae = for_client(session_not_saved_error(turn->name, chat, turn->before, lost->why, lost->now,
                                                           chat_model(), /*streamed=*/false));
          ae.extra = {{"response", reply->response()}};
          res.set_header("x-should-retry", "false");
          send_error(res, ae);
        } else {
          send_json(res, 200, reply->response());
        }
        return true;
      }
    });
    return;
  }

  stream_job(
      res, reply->job,
      [reply] { return reply->role_sse(); },
      [this, reply, turn](const JobEvent& e) {
        if (e.kind == JobEvent::kDelta) return reply->on_delta(e);
        if (e.kind == JobEvent::kDone) {
          std::string out = reply->on_finish(e.finish_reason);
          std::optional<NotSaved> lost;
          if (turn) lost = turn->end(reply.get());  // the last chunk goes out once the turn is durable
          if (lost && reply->violation.empty()) {
            // Instead of the chunk with finish_reason (the deltas are out already): the error
            // event, which carries what the last chunks would have.
            ApiError ae = for_client(session_not_saved_error(turn->name, turn->chat, turn->before, lost->why, lost->now,
                                                             chat_model(), /*streamed=*/true));
            ae.extra = {{"finish_reason", reply->finish}, {"usage", reply->usage()}};
            return out + Reply::error_close(error_body(ae));
          }
          return out + reply->on_close();
        }
        if (turn) turn->end(nullptr);
        ApiError ae = for_client(status_error(e.error));
        return "data: " + dump(error_body(ae)) + "\n\ndata: [DONE]\n\n";
      },
      [turn](bool) {
        if (turn) turn->end(nullptr);  // a client that went away: its turn ends without a reply
      });
}

std::shared_ptr<Reply> HttpServer::Impl::make_reply(const ApiRequest& r, std::shared_ptr<Job> job, std::string id,
                                                   int64_t created, bool starts_in_reasoning,
                                                   const std::string& forced) const {
  auto reply = std::make_shared<Reply>();
  reply->chat = r.chat;
  reply->stream = r.stream;
  reply->include_usage = r.include_usage;
  reply->logprobs = r.logprobs;
  reply->id = std::move(id);
  reply->model = opts.defaults.model_id;
  reply->created = created;
  reply->job = std::move(job);
  reply->tok = &tok;
  if (r.chat) {
    reply->out = std::make_unique<ChatOutput>(split_reasoning, starts_in_reasoning, r.parse_tool_calls,
                                              r.parallel_tool_calls ? 0 : 1);
    if (!forced.empty()) {
      (void)reply->out->push(forced);  // an open tool call: nothing to show yet
      reply->tool_required = true;
      if (!r.forced_tool.empty()) reply->allowed_tools = {r.forced_tool};
      else
        for (const ojson& t : r.tools) reply->allowed_tools.push_back(t["function"]["name"].get<std::string>());
    }
  }
  return reply;
}

void HttpServer::Impl::serve_choices(const httplib::Request& req, httplib::Response& res, const ApiRequest& r,
                                     GenerationParams base, std::vector<std::vector<int32_t>> prompts,
                                     std::vector<std::string> echo_texts, bool starts_in_reasoning,
                                     const std::string& forced) {
  const bool chat = r.chat;
  const int ctx = opts.defaults.max_context;
  const std::string id = random_id(chat ? "chatcmpl-" : "cmpl-");
  const int64_t made = unix_now();
  std::vector<std::shared_ptr<Job>> jobs;
  std::vector<std::shared_ptr<Reply>> replies;
  for (size_t p = 0; p < prompts.size(); ++p)
    for (int j = 0; j < r.n; ++j) {
      GenerationParams g = base;
      g.prompt = prompts[p];
      g.max_tokens = r.max_tokens.value_or(ctx - int(g.prompt.size()));
      g.sampling.seed = base.sampling.seed + uint64_t(j);
      auto job = std::make_shared<Job>(std::move(g));
      if (Status st = sched->submit(job); !st.is_ok()) {
        for (auto& o : jobs) o->cancel();
        metrics.rejected_busy++;
        return send_error(res, api_error(503, "", st.message() + " (this request asks for " +
                                                      std::to_string(prompts.size() * size_t(r.n)) + " choices)",
                                         "server_busy", "server_error"));
      }
      jobs.push_back(job);
      auto reply = make_reply(r, job, id, made, starts_in_reasoning, forced);
      reply->index = int(replies.size());
      if (p < echo_texts.size()) reply->echo_text = echo_texts[p];
      replies.push_back(std::move(reply));
    }
  const int n = r.n;
  auto usage = [jobs, n] {
    int pt = 0, ct = 0, cached = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (i % size_t(n) == 0) pt += jobs[i]->prompt_tokens(), cached += jobs[i]->cached_tokens();
      ct += jobs[i]->completion_tokens();
    }
    return ojson{{"prompt_tokens", pt},
                 {"completion_tokens", ct},
                 {"total_tokens", pt + ct},
                 {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  };
  auto cancel_all = [jobs] {
    for (auto& j : jobs) j->cancel();
  };

  if (!r.stream) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      std::optional<Status> failed;
      wait_unstreamed(req, *jobs[i], [&](const JobEvent& e) {
        if (e.kind == JobEvent::kDelta) return replies[i]->on_delta(e), false;
        if (e.kind == JobEvent::kError) failed = e.error;
        else replies[i]->on_done(e.finish_reason);
        return true;
      });
      if (failed) {
        cancel_all();
        return send_error(res, for_client(status_error(*failed)));
      }
      if (replies[i]->finish == "cancelled") cancel_all();  // the client went away: the others too
    }
    for (const auto& rep : replies)
      if (!rep->violation.empty())
        return send_error(res, api_error(500, "tool_choice", "choice " + std::to_string(rep->index) + ": " + rep->violation,
                                         "tool_choice_not_followed", "server_error"));
    ojson body = replies[0]->response();
    body["choices"] = ojson::array();
    for (const auto& rep : replies) body["choices"].push_back(rep->response()["choices"][0]);
    body["usage"] = usage();
    return send_json(res, 200, body);
  }

  // One stream: each choice's chunks (its index) as its job's events come, a finish chunk per
  // choice, then the usage (stream_options) and [DONE] once every choice has ended.
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  open_streams++;
  struct State {
    bool started = false;
    std::vector<bool> ended;
    clock::time_point last_write = clock::now();
  };
  auto state = std::make_shared<State>();
  state->ended.assign(jobs.size(), false);
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, jobs, replies, state, usage, cancel_all](size_t, httplib::DataSink& sink) -> bool {
        auto write = [&](const std::string& s) {
          if (s.empty()) return true;
          state->last_write = clock::now();
          return sink.write(s.data(), s.size());
        };
        auto close = [&](const std::string& last) {
          cancel_all();
          write(last);
          sink.done();
          return true;
        };
        if (!state->started) {
          state->started = true;
          for (const auto& rep : replies)
            if (!write(rep->role_sse())) return cancel_all(), false;
        }
        // Every choice's waiting events; when none had any, a short wait on the first still running.
        bool any = false;
        for (int pass = 0; pass < 2 && !any; ++pass)
          for (size_t i = 0; i < jobs.size(); ++i) {
            if (state->ended[i]) continue;
            std::vector<JobEvent> evs;
            const bool waited = pass == 1;
            if (!jobs[i]->wait(&evs, std::chrono::milliseconds(waited ? 20 : 0))) {
              if (waited) break;  // one short wait per call
              continue;
            }
            any = true;
            for (const JobEvent& e : evs) {
              if (e.kind == JobEvent::kDelta) {
                if (!write(replies[i]->on_delta(e))) return cancel_all(), false;
                continue;
              }
              if (e.kind == JobEvent::kError)
                return close("data: " + dump(error_body(for_client(status_error(e.error)))) + "\n\ndata: [DONE]\n\n");
              const std::string held = replies[i]->on_finish(e.finish_reason);
              if (!replies[i]->violation.empty()) return close(held + Reply::error_close(replies[i]->violation_body()));
              if (!write(held + replies[i]->finish_sse())) return cancel_all(), false;
              state->ended[i] = true;
              break;
            }
            if (waited) break;
          }
        if (std::all_of(state->ended.begin(), state->ended.end(), [](bool b) { return b; })) {
          std::string last = replies[0]->include_usage ? replies[0]->usage_sse(usage()) : std::string();
          write(last + "data: [DONE]\n\n");
          sink.done();
          return true;
        }
        if (!any && clock::now() - state->last_write > std::chrono::seconds(1)) {
          // As stream_events: a comment keeps proxies from timing out and finds a client that has gone.
          if (!write(": keep-alive\n\n")) return cancel_all(), false;
        }
        return true;
      },
      [this, cancel_all](bool success) {
        if (!success) cancel_all();
        open_streams--;
      });
}

void HttpServer::Impl::stream_job(httplib::Response& res, std::shared_ptr<Job> job, std::function<std::string()> first,
                                  std::function<std::string(const JobEvent&)> render,
                                  std::function<void(bool)> finished) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  open_streams++;
  auto started = std::make_shared<bool>(false);
  auto last_write = std::make_shared<clock::time_point>(clock::now());
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, first, render, started, last_write](size_t, httplib::DataSink& sink) -> bool {
        auto write = [&](const std::string& s) {
          if (s.empty()) return true;
          *last_write = clock::now();
          return sink.write(s.data(), s.size());
        };
        if (!*started) {
          *started = true;
          if (!write(first())) return job->cancel(), false;
        }
        // No event for a while (a long prefill, or a full queue): stream_events keeps the
        // connection alive and finds a client that has gone.
        std::vector<JobEvent> evs;
        bool gone = false;
        if (!stream_events(*job, &evs, last_write.get(), sink, &gone)) return gone ? (job->cancel(), false) : true;
        for (const JobEvent& e : evs) {
          if (!write(render(e))) return job->cancel(), false;
          if (e.kind != JobEvent::kDelta) {
            sink.done();
            return true;
          }
        }
        return true;
      },
      [this, job, finished](bool success) {
        if (!success) job->cancel();
        finished(success);
        open_streams--;
      });
}

// A /v1/responses request's reply, its job submitted: the chat reply's parts as a Response object,
// or its events (responses_reply.h). With a session (`turn`), its turn ends as a chat turn does:
// before the reply (or the last event) goes out, so that what the client reads is durable.
void HttpServer::Impl::serve_responses(const httplib::Request& req, httplib::Response& res, std::shared_ptr<Reply> reply,
                                       ResponsesEcho echo, bool stream, bool starts_in_reasoning,
                                       std::shared_ptr<SessionTurn> turn, std::optional<ojson> to_store) {
  const std::string instructions =
      echo.fields["instructions"].is_string() ? echo.fields["instructions"].get<std::string>() : std::string();
  std::shared_ptr<Job> job = reply->job;
  const int32_t think_open = split_reasoning ? *tok.token_to_id("<think>") : -1;
  const int32_t think_close = split_reasoning ? *tok.token_to_id("</think>") : -1;
  std::shared_ptr<Reply> chat_reply = reply;
  auto rr = std::make_shared<ResponsesReply>(std::move(reply), std::move(echo), stream, think_open, think_close,
                                             starts_in_reasoning);
  // A reply that kept its tool_choice, stored under its id with its conversation (to_store): before
  // the client has it, so that a previous_response_id sent at once finds it. A store that fails is
  // logged; the reply still goes out.
  auto store_reply = [this, to_store, instructions, chat_reply, rr] {
    if (!to_store || !rr->violation().empty() || chat_reply->finish == "cancelled") return;
    ojson conv = *to_store;
    conv.push_back(chat_reply->assistant_message());
    const Status st = stored_responses->put(rr->id(), StoredResponse{dump(conv), instructions, dump(rr->response())});
    if (!st.is_ok()) std::fprintf(stderr, "[anvil] response %s not stored: %s\n", rr->id().c_str(), st.message().c_str());
  };
  // The turn's end with the finished reply: what the reply says when its last state is not saved.
  auto end_turn = [this, turn, chat_reply, rr, store_reply](bool streamed) -> std::optional<ApiError> {
    store_reply();
    if (!turn) return std::nullopt;
    std::optional<NotSaved> lost = turn->end(chat_reply.get());
    if (!lost || !rr->violation().empty()) return std::nullopt;
    ApiError ae = for_client(session_not_saved_error(turn->name, turn->chat, turn->before, lost->why, lost->now,
                                                     chat_model(), streamed));
    if (!streamed) ae.extra = {{"response", rr->response()}};
    return ae;
  };
  if (!stream) {
    wait_unstreamed(req, *job, [&](const JobEvent& e) {
      if (e.kind == JobEvent::kDelta) {
        rr->on_delta(e);
        return false;
      }
      if (e.kind == JobEvent::kError) {
        if (turn) turn->end(nullptr);
        send_error(res, for_client(status_error(e.error)));
      } else {
        rr->on_done(e.finish_reason);
        const std::optional<ApiError> lost = end_turn(false);
        if (!rr->violation().empty()) {
          send_error(res, api_error(500, "tool_choice", rr->violation(), "tool_choice_not_followed", "server_error"));
        } else if (lost) {
          res.set_header("x-should-retry", "false");  // sent once, as for chat: a retry would generate the turn again
          send_error(res, *lost);
        } else {
          send_json(res, 200, rr->response());
        }
      }
      return true;
    });
    return;
  }
  stream_job(
      res, job, [rr] { return rr->on_start(); },
      [this, rr, turn, end_turn](const JobEvent& e) {
        if (e.kind == JobEvent::kDelta) return rr->on_delta(e);
        if (e.kind == JobEvent::kDone) return rr->on_done(e.finish_reason, [&] { return end_turn(true); });
        if (turn) turn->end(nullptr);
        return rr->on_error(for_client(status_error(e.error)));
      },
      [turn](bool) {
        if (turn) turn->end(nullptr);  // a client that went away: its turn ends without a reply
      });
}

// The 404 for a response id this server does not keep (or, without stored responses, for any).
ApiError HttpServer::Impl::response_not_found(const std::string& id) const {
  if (!stored_responses)
    return api_error(404, "response_id",
                     "no stored responses: this server runs without the durable KV store (--no-kv-store) or with "
                     "--responses-keep 0",
                     "not_found");
  return api_error(404, "response_id",
                   "no stored response with id '" + id.substr(0, 200) + "' (this server keeps the last " +
                       std::to_string(opts.responses_keep) +
                       " stored responses of this model; one sent with 'store': false is not kept)",
                   "not_found");
}

// The stored response `id`; or nullopt, its error (not kept, unreadable store) sent.
std::optional<StoredResponse> HttpServer::Impl::stored_or_error(const std::string& id, httplib::Response& res) {
  if (!stored_responses) {
    send_error(res, response_not_found(id));
    return std::nullopt;
  }
  auto got = stored_responses->get(id);
  if (!got.is_ok()) {
    send_error(res, for_client(api_error(500, "", got.status().message(), "", "server_error")));
    return std::nullopt;
  }
  if (!*got) send_error(res, response_not_found(id));
  return std::move(*got);
}

void HttpServer::Impl::handle_stored_response(const httplib::Request& req, httplib::Response& res, bool remove) {
  const std::string id = req.matches[1];
  if (remove) {
    if (!stored_responses) return send_error(res, response_not_found(id));
    auto gone = stored_responses->remove(id);
    if (!gone.is_ok()) return send_error(res, for_client(api_error(500, "", gone.status().message(), "", "server_error")));
    if (!*gone) return send_error(res, response_not_found(id));
    return send_json(res, 200, {{"id", id}, {"object", "response"}, {"deleted", true}});
  }
  const std::optional<StoredResponse> got = stored_or_error(id, res);
  if (!got) return;
  const ojson r = ojson::parse(got->response, nullptr, false);
  if (r.is_discarded()) return send_error(res, api_error(500, "", "stored response '" + id + "' is unreadable", "", "server_error"));
  send_json(res, 200, r);
}

// A stored response's input items (responses_items.h), a page at a time.
void HttpServer::Impl::handle_input_items(const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  const std::optional<StoredResponse> got = stored_or_error(id, res);
  if (!got) return;
  const ojson conv = ojson::parse(got->messages, nullptr, false);
  if (!conv.is_array())
    return send_error(res, api_error(500, "", "stored response '" + id + "' is unreadable", "", "server_error"));
  auto param = [&](const char* k) -> std::optional<std::string> {
    if (!req.has_param(k)) return std::nullopt;
    return req.get_param_value(k);
  };
  auto page = input_items_page(input_items(conv, id), param("limit"), param("order"), param("after"));
  if (auto* e = std::get_if<ApiError>(&page)) return send_error(res, *e);
  send_json(res, 200, std::get<ojson>(page));
}

void HttpServer::Impl::handle_sessions(const httplib::Request&, httplib::Response& res) {
  if (!opts.store)
    return send_error(res, api_error(400, "", "sessions need the durable KV store, and this server runs without one"));
  std::vector<SessionInfo> all;
  sched->call([&] { all = opts.store->list_sessions(); });
  ojson data = ojson::array();
  for (const SessionInfo& s : all)
    if (s.fingerprint == opts.store->fingerprint()) data.push_back(session_json(s, false, chat_model()));  // this model's only
  send_json(res, 200, {{"object", "list"}, {"data", data}});
}

void HttpServer::Impl::handle_session(const httplib::Request& req, httplib::Response& res, bool remove) {
  const std::string name = req.matches[1];
  if (!valid_session_name(name))
    return send_error(res, api_error(400, "session", "'" + name.substr(0, 200) +
                                                         "' is not a session name (1 to 128 of A-Z a-z 0-9 . _ -)"));
  if (!opts.store)
    return send_error(res, api_error(400, "session", "sessions need the durable KV store, and this server runs without one"));
  Result<std::optional<SessionInfo>> got = std::optional<SessionInfo>();
  if (!remove) {
    // A damaged session is shown as the list shows it (damaged: true, error), not as an error.
    sched->call([&] { got = opts.store->find_session(name); });
    if (!got.is_ok())
      return send_error(res, for_client(api_error(500, "session", got.status().message(), "", "server_error")));
    if (!*got || (*got)->fingerprint != opts.store->fingerprint())
      return send_error(res, api_error(404, "session", "no session named '" + name + "'", "session_not_found"));
    return send_json(res, 200, session_json(**got, true, chat_model()));
  }
  // As a request does: a request holding it whose client has gone is waited for (bounded).
  if (sessions.acquire(name, nullptr) != SessionLocks::Acquire::kAcquired)
    return send_error(res, api_error(409, "session", "session '" + name + "' is in use by a running request",
                                     "session_busy"));
  Status st;
  bool removing = false;  // found: st is remove_session's
  sched->call([&] {
    // Only this model's sessions are visible here (as in the list); another model's is not found.
    // A damaged one (listed, marked damaged) is removed as anvil kv rm removes it, if it is this
    // model's (find_session reads its fingerprint column without the checksummed tokens).
    auto s = opts.store->find_session(name);
    if (!s.is_ok()) st = s.status();
    else if (!*s || (*s)->fingerprint != opts.store->fingerprint()) st = not_found("no session named '" + name + "'");
    else removing = true, st = opts.store->remove_session(name);
  });
  sessions.release(name);
  if (st.code() == StatusCode::kBusy)  // another process records (or continues) it
    return send_error(res, for_client(api_error(409, "session", st.message(), "session_busy")));
  if (st.code() == StatusCode::kNotFound)
    return send_error(res, api_error(404, "session", "no session named '" + name + "'", "session_not_found"));
  // The removal did not commit (a full disk even after the store gave up its reserve, an I/O error).
  if (!st.is_ok() && removing) return send_error(res, for_client(session_not_removed_error(name, st)));
  if (!st.is_ok()) return send_error(res, for_client(api_error(500, "session", st.message(), "", "server_error")));
  send_json(res, 200, {{"id", name}, {"object", "session"}, {"deleted", true}});
}

ApiError HttpServer::Impl::for_client(ApiError e) const {
  if (!opts.store || opts.store->dir().empty()) return e;
  const std::string& dir = opts.store->dir();
  if (e.message.find(dir) == std::string::npos) return e;
  std::fprintf(stderr, "[anvil] %s\n", e.message.c_str());
  std::string m = e.message;
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"kv store " + dir, "the server's KV store"},
                                 {"--kv-store " + dir, "the server's KV store"},
                                 {"the store " + dir, "the server's KV store"},
                                 {dir, "<kv store>"}})
    for (size_t at = m.find(from); at != std::string::npos; at = m.find(from, at + to.size())) m.replace(at, from.size(), to);
  e.message = std::move(m);
  return e;
}

void HttpServer::Impl::handle_tokenize(const httplib::Request& req, httplib::Response& res) {
  ojson b;
  if (auto e = parse_json_object(req.body, &b)) return send_error(res, *e);
  std::string text;
  bool with_pieces = false;
  if (b.contains("with_pieces")) {
    if (!b["with_pieces"].is_boolean()) return send_error(res, api_error(400, "with_pieces", "'with_pieces' must be a boolean"));
    with_pieces = b["with_pieces"].get<bool>();
  }
  if (b.contains("messages")) {
    ApiRequest r;
    auto err = parse_chat_request(req.body, opts.defaults, &r);
    if (err) return send_error(res, *err);
    if (!has_template) return send_error(res, api_error(400, "messages", "this model has no chat template"));
    auto t = apply_chat_template(cfg, r.messages, r.tools, true, r.enable_thinking, r.template_kwargs);
    if (!t.is_ok()) return send_error(res, api_error(400, "messages", t.status().message()));
    text = *t;
  } else {
    const char* key = b.contains("content") ? "content" : "prompt";
    if (!b.contains(key)) return send_error(res, api_error(400, "content", "'content' (a string) is required"));
    if (!b[key].is_string()) return send_error(res, api_error(400, key, std::string("'") + key + "' must be a string"));
    text = b[key].get<std::string>();
  }
  // A text gets the tokenizer's BOS/EOS only when asked (llama-server's "add_special", vLLM's
  // "add_special_tokens"); rendered messages never do (the template holds them).
  bool add_special = false;
  for (const char* key : {"add_special", "add_special_tokens"}) {
    if (!b.contains(key)) continue;
    if (!b[key].is_boolean()) return send_error(res, api_error(400, key, std::string("'") + key + "' must be a boolean"));
    add_special = b[key].get<bool>() && !b.contains("messages");
  }
  std::vector<int32_t> ids = tok.encode(text, add_special);
  ojson tokens = ojson::array();
  for (int32_t id : ids) {
    if (!with_pieces) {
      tokens.push_back(id);
      continue;
    }
    // A piece is the token's own text (Tokenizer::token_raw_bytes, as logprobs give it), not the
    // token decoded alone, which loses a SentencePiece "▁Hello"'s space: so the pieces joined are
    // the text, less the one leading space the decoder cuts. As llama-server: a string, or the
    // bytes as a list of integers where they are not UTF-8 (a byte token of part of a character).
    const std::string bytes = tok.token_raw_bytes(id);
    tokens.push_back({{"id", id}, {"piece", tok::is_valid_utf8(bytes) ? ojson(bytes) : token_bytes_json(bytes)}});
  }
  send_json(res, 200, {{"tokens", tokens}, {"count", ids.size()}, {"max_model_len", opts.defaults.max_context}});
}

void HttpServer::Impl::handle_detokenize(const httplib::Request& req, httplib::Response& res) {
  ojson b;
  if (auto e = parse_json_object(req.body, &b)) return send_error(res, *e);
  if (!b.contains("tokens") || !b["tokens"].is_array())
    return send_error(res, api_error(400, "tokens", "'tokens' (an array of token ids) is required"));
  std::vector<int32_t> ids;
  const int V = engine.model().config().vocab_size;
  for (size_t i = 0; i < b["tokens"].size(); ++i) {
    const ojson& t = b["tokens"][i];
    if (!t.is_number_integer() && !t.is_number_unsigned())
      return send_error(res, api_error(400, "tokens", "'tokens[" + std::to_string(i) + "]' must be an integer"));
    int64_t v = t.is_number_unsigned() ? int64_t(std::min<uint64_t>(t.get<uint64_t>(), INT64_MAX)) : t.get<int64_t>();
    if (v < 0 || v >= V)
      return send_error(res, api_error(400, "tokens", "'tokens[" + std::to_string(i) + "]' = " + std::to_string(v) +
                                                          " is outside the vocabulary [0, " + std::to_string(V) + ")"));
    ids.push_back(int32_t(v));
  }
  std::string text = tok.decode(ids);
  send_json(res, 200, {{"content", text}, {"prompt", text}});
}

// The methods an endpoint takes (its Allow header), or "" for a path no route serves. Keep in step
// with the routes below.
static std::string allowed_methods(const std::string& path) {
  static const char* const kPost[] = {"/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions",
                                      "/v1/responses", "/tokenize", "/detokenize"};
  static const char* const kGet[] = {"/v1/sessions", "/v1/models", "/health", "/v1/health", "/metrics"};
  for (const char* p : kPost)
    if (path == p) return "POST";
  for (const char* p : kGet)
    if (path == p) return "GET, HEAD";
  auto under = [&](const char* prefix) {
    const size_t n = std::strlen(prefix);
    return path.size() > n && path.compare(0, n, prefix) == 0;
  };
  if (under("/v1/sessions/")) return "GET, HEAD, DELETE";  // (a name with a '/' is refused by the handler)
  if (under("/v1/responses/")) {
    const size_t id_at = std::strlen("/v1/responses/"), slash = path.find('/', id_at);
    if (slash == std::string::npos) return "GET, HEAD, DELETE";  // /v1/responses/{id}
    return slash > id_at && path.compare(slash, std::string::npos, "/input_items") == 0 ? "GET, HEAD" : "";
  }
  if (under("/v1/models/")) return "GET, HEAD";
  return "";
}

void HttpServer::Impl::routes() {
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!opts.cors_origin.empty()) {
      res.set_header("Access-Control-Allow-Origin", opts.cors_origin);
      if (opts.cors_origin != "*") res.set_header("Vary", "Origin");
    }
    if (req.method == "OPTIONS") {
      if (!opts.cors_origin.empty()) {
        res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
        // The headers the browser asks about, when they are plain header names (the OpenAI SDKs
        // send X-Stainless-* ones), else the two the API needs.
        std::string asked = req.get_header_value("Access-Control-Request-Headers");
        const bool plain = !asked.empty() && asked.size() <= 1024 &&
                           std::all_of(asked.begin(), asked.end(), [](char c) {
                             return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ',' ||
                                    c == ' ';
                           });
        res.set_header("Access-Control-Allow-Headers",
                       plain ? asked : std::string("Authorization, Content-Type, X-Api-Key"));
        res.set_header("Access-Control-Max-Age", "600");
      }
      res.status = 204;
      return httplib::Server::HandlerResponse::Handled;
    }
    // A body must announce its length, so that --max-body holds before it is read (the HTTP
    // library checks Content-Length only, and reads a chunked or unannounced body whole).
    if ((req.method == "POST" || req.method == "PUT" || req.method == "PATCH") &&
        (req.has_header("Transfer-Encoding") || !req.has_header("Content-Length"))) {
      // Its body (if any) is not read: the connection closes after the reply.
      send_error_and_close(req, res,
                           api_error(411, "",
                                     "Send the request body with a Content-Length header (chunked or unannounced "
                                     "bodies are not accepted)",
                                     "length_required"));
      return httplib::Server::HandlerResponse::Handled;
    }
    // Every body is JSON, whatever its Content-Type says. `curl -d` sends
    // application/x-www-form-urlencoded, and the HTTP library would parse such a body as a form
    // with a limit of its own (8 KB, compiled in): the type is dropped here, before the body is read.
    // (The request is not const where the library holds it; only this handler's view of it is.)
    if (req.get_header_value("Content-Type").rfind("application/x-www-form-urlencoded", 0) == 0) {
      const_cast<httplib::Request&>(req).headers.erase("Content-Type");  // (the map ignores case)
    }
    const bool open = req.path == "/" || req.path == "/health" || req.path == "/v1/health";
    if (!opts.api_key.empty() && !open) {
      const ApiKeyCheck check =
          check_api_key(req.get_header_value("Authorization"), req.get_header_value("X-Api-Key"), opts.api_key);
      if (check != ApiKeyCheck::kOk) {
        send_error(res, api_error(401, "", api_key_error_message(check), "invalid_api_key", "authentication_error"));
        res.set_header("WWW-Authenticate", "Bearer");  // RFC 9110 §11.6.1: a 401 names the scheme it takes
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  svr.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    // Answered already: a body, or one a content provider writes (send_error_and_close).
    if (!res.body.empty() || res.content_provider_) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    if (res.status == 404 && !allowed_methods(req.path).empty()) {
      // A known endpoint under another method: 405 with the methods it takes, as vLLM answers.
      res.status = 405;
      res.set_header("Allow", allowed_methods(req.path));
    }
    e.status = res.status;
    if (res.status == 404) {
      e.message = "Unknown endpoint: " + req.method + " " + req.path;
      e.code = "unknown_url";
    } else if (res.status == 413) {
      e.message = "The request body is larger than this server accepts (" + std::to_string(opts.max_body_bytes) +
                  " bytes; --max-body)";
      e.code = "request_too_large";
    } else if (res.status == 405) {
      e.message = "Method " + req.method + " is not allowed on " + req.path +
                  (allowed_methods(req.path).empty() ? "" : " (it takes " + allowed_methods(req.path) + ")");
      e.code = "method_not_allowed";
    } else if (res.status >= 500) {
      e.message = "Internal server error";
      e.type = "server_error";
    } else {
      e.message = "Malformed HTTP request";
    }
    send_error(res, e);
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
    send_error(res, api_error(500, "", "Internal server error: " + what, "", "server_error"));
  });
  svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics.count_request(endpoint_label(req.path), res.status);
  });

  svr.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& s) { handle_generate(q, s, true); });
  svr.Post("/chat/completions", [this](const httplib::Request& q, httplib::Response& s) { handle_generate(q, s, true); });
  svr.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& s) { handle_generate(q, s, false); });
  svr.Post("/v1/responses", [this](const httplib::Request& q, httplib::Response& s) { handle_generate(q, s, true, true); });
  svr.Post("/completions", [this](const httplib::Request& q, httplib::Response& s) { handle_generate(q, s, false); });
  svr.Post("/tokenize", [this](const httplib::Request& q, httplib::Response& s) { handle_tokenize(q, s); });
  svr.Post("/detokenize", [this](const httplib::Request& q, httplib::Response& s) { handle_detokenize(q, s); });
  svr.Get("/v1/sessions", [this](const httplib::Request& q, httplib::Response& s) { handle_sessions(q, s); });
  // Any name, '/' included: the path is matched decoded, so /v1/sessions/a%2Fb asks for "a/b", which
  // handle_session refuses as it refuses every invalid name (400, naming the rule).
  svr.Get(R"(/v1/sessions/(.+))", [this](const httplib::Request& q, httplib::Response& s) { handle_session(q, s, false); });
  svr.Delete(R"(/v1/sessions/(.+))", [this](const httplib::Request& q, httplib::Response& s) { handle_session(q, s, true); });
  svr.Get(R"(/v1/responses/([^/]+)/input_items)",
          [this](const httplib::Request& q, httplib::Response& s) { handle_input_items(q, s); });
  svr.Get(R"(/v1/responses/([^/]+))", [this](const httplib::Request& q, httplib::Response& s) { handle_stored_response(q, s, false); });
  svr.Delete(R"(/v1/responses/([^/]+))", [this](const httplib::Request& q, httplib::Response& s) { handle_stored_response(q, s, true); });
  svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& s) {
    send_json(s, 200, {{"object", "list"}, {"data", ojson::array({model_json()})}});
  });
  svr.Get(R"(/v1/models/(.+))", [this](const httplib::Request& q, httplib::Response& s) {
    std::string id = q.matches[1];
    if (id != opts.defaults.model_id && id != opts.defaults.model_alt)
      return send_error(s, api_error(404, "model", "The model '" + id + "' does not exist", "model_not_found"));
    send_json(s, 200, model_json());
  });
  auto health = [this](const httplib::Request&, httplib::Response& s) {
    if (draining.load()) send_json(s, 503, {{"status", "draining"}});
    else send_json(s, 200, {{"status", "ok"}});
  };
  svr.Get("/health", health);
  svr.Get("/v1/health", health);
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& s) {
    s.set_content(metrics.render(), "text/plain; version=0.0.4");
  });
  if (opts.chat_page)
    svr.Get("/", [](const httplib::Request&, httplib::Response& s) { s.set_content(chat_page_html(), "text/html; charset=utf-8"); });
}

HttpServer::HttpServer(ServerOptions opts, Engine& engine, const Tokenizer& tok, TokenizerConfig chat_cfg)
    : metrics_(std::make_unique<Metrics>()) {
  impl_ = std::make_unique<Impl>(std::move(opts), engine, tok, std::move(chat_cfg), *metrics_);
}

HttpServer::~HttpServer() { shutdown(); }

Result<int> HttpServer::start() {
  Impl& m = *impl_;
  SchedulerOptions so;
  so.max_queue = m.opts.max_queue;
  so.eos_ids = m.opts.eos_ids;
  so.store = m.opts.store;
  m.sched = std::make_unique<Scheduler>(m.engine, m.tok, *metrics_, so);
  Scheduler* sched = m.sched.get();
  metrics_->add_gauge("anvil_requests_running", "Requests holding a sequence slot", [sched] { return sched->running(); });
  metrics_->add_gauge("anvil_requests_waiting", "Requests queued for a sequence slot", [sched] { return sched->queued(); });
  metrics_->add_gauge("anvil_kv_pages_total", "KV cache pages in the pool", [sched] { return double(sched->kv_pages_total()); });
  metrics_->add_gauge("anvil_kv_pages_used", "KV cache pages held by sequences or the prefix cache",
                      [sched] { return double(sched->kv_pages_used()); });
  metrics_->add_gauge("anvil_kv_prefix_cache_pages", "Pages in the prefix index",
                      [sched] { return double(sched->kv_prefix_pages()); });
  if (m.opts.store && m.opts.responses_keep > 0) {
    // Stored /v1/responses (response_store.h) beside the store's catalog. One that cannot be opened
    // (a read-only directory) only stops responses from being stored: said once.
    auto rs = std::make_unique<ResponseStore>();
    const Status st = rs->open(m.opts.store->dir(), m.opts.store->fingerprint(), m.opts.responses_keep);
    if (st.is_ok()) m.stored_responses = std::move(rs);
    else std::fprintf(stderr, "[anvil] responses are not stored: %s\n", st.message().c_str());
  }
  if (KVStore* st = m.opts.store) {
    // The store's counters (KVStoreCounters), always on: what persistence costs and what it saves.
    const KVStoreCounters& c = st->counters();
    auto add = [&](const char* name, const char* help, const std::atomic<int64_t>& v, double scale = 1) {
      metrics_->add_counter(name, help, [&v, scale] { return double(v.load()) * scale; });
    };
    add("anvil_kv_store_pages_enqueued_total", "Full KV pages handed to the store's writer", c.pages_enqueued);
    add("anvil_kv_store_pages_written_total", "KV pages appended to the store", c.pages_written);
    add("anvil_kv_store_pages_deduplicated_total", "KV pages the store already had", c.pages_deduped);
    add("anvil_kv_store_pages_dropped_total", "KV pages dropped because the writer's queue was full", c.pages_dropped);
    add("anvil_kv_store_pages_reoffered_total", "Dropped KV pages queued again once the writer's queue had room",
        c.pages_reoffered);
    add("anvil_kv_store_tails_written_total", "Session tail (partial) pages written", c.tails_written);
    add("anvil_kv_store_bytes_written_total", "Bytes appended to the store's segments", c.bytes_written);
    add("anvil_kv_store_fsyncs_total", "fdatasync calls of the store's writer", c.fsyncs);
    add("anvil_kv_store_transactions_total", "Catalog transactions committed (group commits)", c.transactions);
    add("anvil_kv_store_write_errors_total", "Failed appends, syncs or commits", c.write_errors);
    add("anvil_kv_store_writer_busy_seconds_total", "Time the store's writer thread spent working", c.writer_busy_ns, 1e-9);
    add("anvil_kv_store_sync_seconds_total", "Of the writer's time: waiting in fdatasync", c.sync_ns, 1e-9);
    add("anvil_kv_store_commit_seconds_total", "Of the writer's time: committing catalog transactions", c.commit_ns,
        1e-9);
    add("anvil_kv_store_decode_blocked_seconds_total",
        "Time the scheduler thread spent in the store's enqueue (back-pressure included)", c.decode_blocked_ns, 1e-9);
    add("anvil_kv_store_pages_restored_total", "KV pages restored from the store into the pool", c.restored_pages);
    add("anvil_kv_store_restored_bytes_total", "Bytes of KV restored from the store", c.restored_bytes);
    add("anvil_kv_store_restore_seconds_total", "Time spent restoring pages (read, check, copy)", c.restore_ns, 1e-9);
    add("anvil_kv_store_restore_misses_total", "Prefix pages looked up in the store and not found", c.restore_misses);
    add("anvil_kv_store_restore_corrupt_total", "Store records that failed a check (recomputed instead)", c.restore_corrupt);
    add("anvil_kv_store_pages_evicted_total", "Pages evicted under --kv-store-max", c.pages_evicted);
    add("anvil_kv_store_over_cap_total",
        "Times the store stayed over --kv-store-max with only saved sessions' KV left (never evicted)",
        c.over_cap_warnings);
    metrics_->add_gauge("anvil_kv_store_queue_high_water", "Most descriptors ever waiting in the writer's queue",
                        [&c] { return double(c.queue_high_water.load()); });
    metrics_->add_gauge("anvil_kv_store_queue_depth", "Descriptors waiting in the writer's queue now",
                        [st] { return double(st->queued()); });
  }
  // Threads for every running and queued stream plus a few from the start; more as connections
  // need them (idle keep-alive ones, stalled clients), so that none waits unanswered (HttpThreads).
  const int threads = m.opts.http_threads > 0 ? m.opts.http_threads
                                              : m.engine.options().max_seqs + m.opts.max_queue + 8;
  const size_t max_threads = std::max<size_t>(size_t(threads), m.opts.max_http_threads);
  m.svr.new_task_queue = [threads, max_threads] { return new HttpThreads(size_t(threads), max_threads); };
  m.svr.set_payload_max_length(m.opts.max_body_bytes);
  m.svr.set_read_timeout(30, 0);
  m.svr.set_write_timeout(30, 0);
  m.svr.set_keep_alive_timeout(5);
  // The library's default socket options add SO_REUSEPORT, with which a second server binds a port
  // another one listens on and the kernel splits connections between them: SO_REUSEADDR alone.
  m.svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  m.routes();
  int port = m.opts.port;
  if (port == 0) {
    port = m.svr.bind_to_any_port(m.opts.host);
    if (port < 0) return io_error("cannot bind " + m.opts.host + " to any port");
  } else if (!m.svr.bind_to_port(m.opts.host, port)) {
    return io_error("cannot bind " + m.opts.host + ":" + std::to_string(port) + " (in use, or not an address here)");
  }
  m.port = port;
  raise_listen_backlog(port, 1024);
  m.sched->start();
  return port;
}

void HttpServer::serve() { impl_->svr.listen_after_bind(); }

void HttpServer::shutdown() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lk(m.shutdown_mu);
  if (m.shut_down) return;
  m.shut_down = true;
  m.draining.store(true);
  if (m.sched) {
    m.sched->begin_drain();
    m.sched->wait_idle(clock::now() + std::chrono::milliseconds(int64_t(m.opts.shutdown_timeout_s * 1000)));
    m.sched->stop();  // what is still running ends with an error event its stream reports
  }
  // Let every stream write its last event and [DONE] (bounded: a stuck client cannot hold us).
  const auto deadline = clock::now() + std::chrono::seconds(5);
  while (m.open_streams.load() > 0 && clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  m.svr.stop();
  // The HTTP library's stop() closes only the listening socket, and serve() returns once every
  // HTTP thread has: a thread waiting on an idle keep-alive connection holds the exit for the
  // keep-alive timeout (5 s), one reading a request its client stopped sending midway for the read
  // timeout (30 s), whatever --shutdown-timeout says. So the connections still open are ended here:
  // their reading side first, which wakes those threads (they read the end of the stream) and lets
  // a request already received be read and answered (503) and a reply being written go out whole;
  // after a grace second, their writing side too, for a thread blocked writing to a client that
  // stopped reading (it would wait out the write timeout).
  if (m.port > 0) {
    for (int fd : connection_sockets(m.port)) ::shutdown(fd, SHUT_RD);
    const auto grace = clock::now() + std::chrono::seconds(1);
    while (!connection_sockets(m.port).empty() && clock::now() < grace)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    for (int fd : connection_sockets(m.port)) ::shutdown(fd, SHUT_RDWR);
  }
}

}  // namespace anvil::server
