// anvil's OpenAI-compatible HTTP server (cpp-httplib). HTTP threads parse, validate, tokenize and
// stream; the Scheduler thread owns the Engine. See docs/api.md for the endpoints.
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "runtime/engine.h"
#include "server/api_request.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_config.h"

namespace anvil::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;             // 0: any free port (bound_port() tells which)
  std::string api_key;         // non-empty: every endpoint except / and /health needs "Authorization: Bearer KEY"
  std::string cors_origin;     // non-empty: Access-Control-Allow-Origin value ("*" allowed); empty: no CORS
  size_t max_body_bytes = 8u << 20;
  int max_queue = 64;          // requests waiting for a sequence slot; more get 503
  int http_threads = 0;        // started at once; 0: enough for every running and queued stream, plus a few
  size_t max_http_threads = 1024;  // more are started as connections need them, up to this (HttpThreads)
  double shutdown_timeout_s = 30;  // SIGTERM: how long running requests may take to finish
  bool chat_page = true;
  RequestDefaults defaults;
  bool seed_fixed = false;     // requests without "seed" use defaults.sampling.seed (else a random one each)
  std::vector<int32_t> eos_ids;
  KVStore* store = nullptr;    // the durable KV store attached to the engine (sessions, metrics), or none
  int responses_keep = 200;    // /v1/responses stored in the store's directory (response_store.h); 0: none stored
};

class HttpServer {
 public:
  // `chat_cfg` may have no template (chat completions then answer 400).
  HttpServer(ServerOptions opts, Engine& engine, const Tokenizer& tok, TokenizerConfig chat_cfg);
  ~HttpServer();
  // Binds the listening socket and starts the scheduler; returns the port.
  Result<int> start();
  // Serves until shutdown() (blocking).
  void serve();
  // Graceful stop: refuse new work, let running requests finish up to the timeout, end the rest,
  // stop listening. Safe to call from another thread while serve() runs.
  void shutdown();

  Metrics& metrics() { return *metrics_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<Metrics> metrics_;
};

}  // namespace anvil::server
