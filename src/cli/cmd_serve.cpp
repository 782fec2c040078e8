// anvil serve: the OpenAI-compatible HTTP server (src/server/). Flags follow llama-server where
// they mean the same thing: --host, --port, -c/--ctx-size, -np/--parallel, --api-key, -m.
// SIGTERM or SIGINT: stop taking requests, let running ones finish (up to --shutdown-timeout),
// end the rest cleanly, exit 0.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "base/optional_file.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/kv_options.h"
#include "cli/unexpected_flag.h"
#include "runtime/warmup.h"
#include "server/http_server.h"
#include "tokenizer/tokenizer_config.h"

namespace anvil::cli {
namespace {

struct ServeArgs {
  ModelOptions model;
  SamplingOptions sampling;
  KVStoreFlags kv;
  server::ServerOptions server;
  int parallel = 8;
  std::string alias;
  bool api_key_given = false;
  int64_t max_body_mb = 8;
  bool no_chat_page = false;
  bool no_warmup = false;
  std::string kv_warm = "2G";
};

int run_serve(ServeArgs& a) {
  if (a.parallel < 1) return fail("--parallel must be >= 1");
  if (a.server.port < 0 || a.server.port > 65535) return fail("--port must be in [0, 65535]");
  if (a.server.host.empty()) return fail("--host is empty (127.0.0.1: this machine only; 0.0.0.0: every interface)");
  if (a.server.max_queue < 0) return fail("--max-queue must be >= 0");
  if (a.max_body_mb < 1 || a.max_body_mb > (1 << 20)) return fail("--max-body must be in [1, 1048576] (MiB)");
  // An empty key would turn authentication off without a word (an unset shell variable, usually).
  if (a.api_key_given && a.server.api_key.empty())
    return fail("--api-key is empty (leave the flag out to serve without a key)");
  auto warm = parse_size(a.kv_warm);  // checked before the model loads
  if (!warm.is_ok()) return fail("--kv-warm: " + warm.status().message());
  if (a.model.batch > 0 && a.model.batch < a.parallel)
    return fail("--batch (" + std::to_string(a.model.batch) + ") must be at least --parallel (" +
                std::to_string(a.parallel) + "): one step decodes every running sequence");
  // Block the stop signals in every thread; this one waits for them (no work in a signal handler).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto stack = build_stack(a.model, a.parallel);
  if (!stack.is_ok()) return fail(stack.status().message());
  Stack& s = *stack;
  // On a GPU, one prefill chunk and one decode step before listening (runtime/warmup.h), before the
  // store is attached so that nothing of it is persisted. The CPU loads nothing lazily: no warm-up.
  if (!a.no_warmup && !s.backend->device_memory_is_host()) {
    const auto t0 = std::chrono::steady_clock::now();
    // One full step's chunk (the scheduler's prefill chunks have that shape), within the context.
    const int chunk = std::min(s.transformer->max_tokens(), s.ctx - 1);
    if (Status st = warm_up(*s.engine, chunk); !st.is_ok()) return fail(st.message());
    std::fprintf(stderr, "[anvil] warm-up: %.0f ms\n",
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  // The durable KV store, as for generate/run: every sequence's full pages are persisted and a
  // prompt's known prefix is restored from it, across restarts; sessions live in it.
  auto attached = attach_kv_store(a.kv, s);
  if (!attached.is_ok()) return fail(attached.status().message());
  AttachedStore& store = *attached;  // declared after the stack, before the server: flushed after it stops
  // The store's most recently used prefixes into the prefix cache before listening, so that the
  // first requests after a restart that repeat them find them in memory (Engine::warm_from_store).
  if (store) {
    const size_t page_bytes = s.engine->pool().view().page_bytes();
    // At most half the pool: the rest stays free for the requests themselves.
    const size_t max_pages = std::min<size_t>(size_t(*warm / std::max<size_t>(page_bytes, 1)),
                                              size_t(s.engine->pool().n_pages() / 2));
    if (max_pages > 0) {
      const auto t0 = std::chrono::steady_clock::now();
      const Engine::Warmed w = s.engine->warm_from_store(max_pages);
      if (w.pages > 0)
        std::fprintf(stderr, "[anvil] kv store: %zu pages (%.0f MiB) of %zu prefixes loaded into the prefix cache in %.0f ms\n",
                     w.pages, double(w.pages * page_bytes) / double(1 << 20), w.prefixes,
                     std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  const std::string dir = tokenizer_dir_of(s);
  if (dir.empty() || !path_present(dir + "/tokenizer.json"))  // a link to nothing: Tokenizer::load names it
    return fail("the server needs a tokenizer: no tokenizer.json in " + (dir.empty() ? s.model->source : dir));
  auto tok = Tokenizer::load(dir + "/tokenizer.json");
  if (!tok.is_ok()) return fail(tok.status().message());
  TokenizerConfig cfg;
  if (auto c = load_tokenizer_config(dir); c.is_ok()) {
    cfg = *c;
    // add_bos_token/add_eos_token decide a text completion prompt's BOS/EOS.
    if (Status st = apply_special_token_flags(cfg, tok->get()); !st.is_ok()) return fail(st.message());
  } else if (c.status().code() == StatusCode::kNotFound) {
    std::fprintf(stderr, "[anvil] no tokenizer_config.json (%s): chat completions are off\n",
                 c.status().message().c_str());
  } else {  // there but unreadable (a link to nothing, no permission, not JSON): never served without it
    return fail(c.status().message());
  }

  server::ServerOptions& so = a.server;
  so.max_body_bytes = size_t(a.max_body_mb) << 20;
  so.chat_page = !a.no_chat_page;
  so.eos_ids = s.model->config.eos_token_ids;
  so.store = store.get();
  auto sampling = resolve_sampling(a.sampling, s.model->dir);
  if (!sampling.is_ok()) return fail(sampling.status().message());
  so.defaults.sampling = *sampling;
  // A request without "seed" gets a fresh random one, unless --seed fixed the server's default.
  so.seed_fixed = a.sampling.seed.has_value() && *a.sampling.seed != "-1";
  so.defaults.max_context = s.ctx;
  so.defaults.model_alt = a.model.model.empty() ? a.model.synthetic : a.model.model;
  if (!a.alias.empty()) {
    so.defaults.model_id = a.alias;
  } else if (!a.model.model.empty()) {
    std::string m = a.model.model;
    while (m.size() > 1 && m.back() == '/') m.pop_back();
    so.defaults.model_id = std::filesystem::exists(m) ? std::filesystem::path(m).filename().string() : m;
  } else {
    so.defaults.model_id = "synthetic-" + a.model.synthetic;
  }

  server::HttpServer srv(so, *s.engine, **tok, cfg);
  auto port = srv.start();
  if (!port.is_ok()) return fail(port.status().message());
  std::thread http([&] { srv.serve(); });
  // An IPv6 address goes in brackets in a URL.
  const std::string url_host = so.host.find(':') != std::string::npos ? "[" + so.host + "]" : so.host;
  std::fprintf(stderr, "[anvil] serving %s as '%s' on http://%s:%d (%d parallel, context %d, KV store %s)\n",
               s.model->source.c_str(), so.defaults.model_id.c_str(), url_host.c_str(), *port, a.parallel, s.ctx,
               store ? store->dir().c_str() : "off");
  std::printf("listening on http://%s:%d\n", url_host.c_str(), *port);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "[anvil] %s: finishing running requests (up to %.0f s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
               so.shutdown_timeout_s);
  srv.shutdown();
  http.join();
  if (store) {  // every session turn has finished; what the writer still holds is committed now, with
    store.finish();  // the pages it dropped under load that the prefix cache still holds
    std::fprintf(stderr, "[anvil] kv store flushed (%lld pages written)\n",
                 static_cast<long long>(store->counters().pages_written.load()));
    if (a.kv.profile) print_kv_profile(*store.get(), 0, stderr);
  }
  std::fprintf(stderr, "[anvil] stopped\n");
  return 0;
}

Command reg("serve", "Serve the model over an OpenAI-compatible HTTP API (chat, completions, streaming)", 15,
            [](CLI::App& app) -> std::function<int()> {
              auto a = std::make_shared<ServeArgs>();
              add_model_options(app, a->model);
              add_int_option(app, "--ctx-size", a->model.ctx, "Same as -c/--ctx: the context length", 1, INT32_MAX, "",
                             [a] { a->model.ctx_given = true; });
              add_sampling_options(app, a->sampling);
              // The flags of run and generate that a request carries here: named, with the body's field.
              add_flag_hint(app, {"--prompt", "--file", "--ids"},
                            "each request carries its own prompt, the \"messages\" of POST /v1/chat/completions "
                            "or the \"prompt\" of POST /v1/completions (docs/api.md)");
              add_flag_hint(app, {"--system"},
                            "a request's system prompt is a message of its \"messages\", {\"role\": \"system\", "
                            "\"content\": ...} (docs/api.md)");
              add_flag_hint(app, {"--session", "--resume"},
                            "a request names its session in the \"session\" field of its body, which continues "
                            "that session or starts it (docs/api.md, Sessions)");
              add_flag_hint(app, {"--logit-bias"},
                            "each request carries its own bias, the logit_bias field of its body ({\"logit_bias\": "
                            "{\"15043\": 1.5}}: token id -> bias in [-100, 100]; docs/api.md)");
              add_flag_hint(app, {"--max-tokens"},
                            "each request sets its own \"max_tokens\" (default: the rest of the context; docs/api.md)");
              add_flag_hint(app, {"--stop"}, "each request gives its own \"stop\" strings (docs/api.md)");
              add_flag_hint(app, {"--ignore-eos"}, "a request sets \"ignore_eos\": true (docs/api.md)");
              add_flag_hint(app, {"--thinking", "--no-thinking"},
                            "a chat request sets it in its \"chat_template_kwargs\", e.g. {\"enable_thinking\": "
                            "false} (docs/api.md)");
              add_kv_store_options(app, a->kv, /*session_flags=*/false);  // sessions are per request
              app.add_option("--host", a->server.host, "Address to listen on")->capture_default_str();
              add_int_option(app, "--port", a->server.port, "Port to listen on (0: any free port)", 0, 65535,
                             "0 = any free port")
                  ->default_str(std::to_string(a->server.port));
              add_int_option(app, "--parallel", a->parallel, "Sequences decoded together (-np)", 1, INT32_MAX)
                  ->default_str(std::to_string(a->parallel));
              app.add_option("--api-key", a->server.api_key, "Require the key on every endpoint but / and /health: 'Authorization: Bearer KEY' or 'X-Api-Key: KEY'")
                  ->each([a](const std::string&) { a->api_key_given = true; });
              app.add_option("--alias", a->alias, "Model name in the API (default: the model directory's name)");
              app.add_option("--cors", a->server.cors_origin,
                             "Allow browser pages from this origin (e.g. http://localhost:3000, or *); default: none");
              add_int_option(app, "--max-queue", a->server.max_queue, "Requests that may wait for a slot; more get 503", 0,
                             INT32_MAX)
                  ->default_str(std::to_string(a->server.max_queue));
              add_int_option(app, "--responses-keep", a->server.responses_keep,
                             "Stored /v1/responses kept for previous_response_id and GET (in the KV store's "
                             "directory), the oldest dropped first; 0: none stored",
                             0, INT32_MAX)
                  ->default_str(std::to_string(a->server.responses_keep));
              add_int_option(app, "--max-body", a->max_body_mb, "Largest request body, in MiB", int64_t(1),
                             int64_t(1) << 20, "MiB")
                  ->default_str(std::to_string(a->max_body_mb));
              app.add_option("--shutdown-timeout", a->server.shutdown_timeout_s,
                             "Seconds running requests get to finish after SIGTERM")
                  ->capture_default_str()
                  ->check([](const std::string& v) {
                    char* end = nullptr;
                    const double d = std::strtod(v.c_str(), &end);
                    return end && *end == '\0' && std::isfinite(d) && d >= 0 ? std::string()
                                                                             : "must be a number of seconds >= 0, got '" + v + "'";
                  });
              app.add_flag("--no-chat-page", a->no_chat_page, "Do not serve the chat page at /");
              app.add_option("--kv-warm", a->kv_warm,
                             "Before listening, load the store's most recently used prompt prefixes into the prefix "
                             "cache, up to this size (and half the KV cache); 0: none")
                  ->capture_default_str();
              app.add_flag("--no-warmup", a->no_warmup,
                           "On a GPU, skip the warm-up pass (one prefill chunk and one decode step) before listening");
              return [a] { return run_serve(*a); };
            });

}  // namespace
}  // namespace anvil::cli
