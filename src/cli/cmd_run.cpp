// anvil run: an interactive multi-turn chat in the terminal (or one turn with -p).
// The conversation is kept as messages; each turn renders the whole conversation through the chat
// template and starts a new sequence, whose earlier pages come from the prefix cache, so only the
// new turn is prefilled. Ctrl-C stops the current answer; /reset clears the history; /quit or
// Ctrl-D leaves. A model without a chat template runs in completion mode: the text typed so far
// and the model's answers form one growing document.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/kv_options.h"
#include "cli/text_output.h"
#include "cli/thinking_flags.h"
#include "runtime/generate.h"
#include "tokenizer/tokenizer_config.h"

namespace anvil::cli {
namespace {

std::atomic<bool> g_interrupted{false};
void on_sigint(int) { g_interrupted = true; }

struct RunArgs {
  ModelOptions model;
  SamplingOptions sampling;
  KVStoreFlags kv;
  std::string prompt, system;
  int n = 1024;
  std::optional<bool> thinking;  // --thinking / --no-thinking; unset: the template's default
  bool show_reasoning = false;
};

// Reads one line from stdin; false on EOF. An interrupted read (Ctrl-C at the prompt) returns an
// empty line.
bool read_line(std::string* line) {
  line->clear();
  for (;;) {
    char buf[4096];
    errno = 0;
    if (!std::fgets(buf, sizeof buf, stdin)) {
      if (errno == EINTR || g_interrupted) {
        clearerr(stdin);
        g_interrupted = false;
        std::printf("\n");
        return true;
      }
      return !line->empty();
    }
    *line += buf;
    if (!line->empty() && line->back() == '\n') {
      line->pop_back();
      if (!line->empty() && line->back() == '\r') line->pop_back();
      return true;
    }
  }
}

int run_chat(RunArgs& a) {
  auto stack = build_stack(a.model);
  if (!stack.is_ok()) return fail(stack.status().message());
  Stack& s = *stack;
  const std::string dir = tokenizer_dir_of(s);
  bool chat = true;
  {
    auto cfg = load_tokenizer_config(dir);
    chat = cfg.is_ok() && !cfg->chat_template.empty();
  }
  auto text_r = TextOutput::open(dir, chat, a.show_reasoning, {});
  if (!text_r.is_ok()) return fail(text_r.status().message());
  TextOutput& text = **text_r;
  const bool interactive = a.prompt.empty();
  if (!chat)
    std::fprintf(stderr, "[anvil] %s has no chat template: completion mode (the model continues your text)\n",
                 dir.c_str());
  auto attached = attach_kv_store(a.kv, s);
  if (!attached.is_ok()) return fail(attached.status().message());
  AttachedStore& store = *attached;
  SessionPlan plan;
  if (store) {
    auto p = plan_session(a.kv, store.get());
    if (!p.is_ok()) return fail(p.status().message());
    plan = std::move(p).value();
  }

  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;  // no SA_RESTART: a blocking read returns EINTR
  sigaction(SIGINT, &sa, nullptr);

  GenerateRequest req;
  req.max_new_tokens = a.n;
  req.sampling = resolve_sampling(a.sampling, s.model->dir);
  req.eos_ids = s.model->config.eos_token_ids;
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
  std::vector<int32_t> document;  // completion mode
  if (plan.resumed) {  // a session keeps the conversation in its meta
    auto m = nlohmann::ordered_json::parse(plan.meta, nullptr, false);
    if (!m.is_object() || !m.contains("messages") || !m.contains("document"))
      return fail("session '" + a.kv.session + "' was not recorded by anvil run (use anvil generate --resume)");
    messages = m["messages"];
    document = m["document"].get<std::vector<int32_t>>();
    std::printf("(resumed session %s: %zu messages)\n", plan.name.c_str(), messages.size());
  }
  auto session_meta = [&] {
    return nlohmann::ordered_json{{"messages", messages}, {"document", document}}.dump();
  };
  int seq = -1;
  if (interactive)
    std::printf("anvil run: %s. Type a message; /reset clears the conversation, /quit leaves, Ctrl-C stops an "
                "answer.\n",
                s.model->source.c_str());
  for (;;) {
    std::string line;
    if (interactive) {
      std::printf("> ");
      std::fflush(stdout);
      if (!read_line(&line)) break;
      if (line == "/quit" || line == "/exit") break;
      if (line == "/reset") {
        messages = nlohmann::ordered_json::array();
        if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
        document.clear();
        std::printf("(conversation cleared)\n");
        continue;
      }
      if (line.empty()) continue;
    } else {
      line = a.prompt;
    }
    Result<std::vector<int32_t>> prompt = std::vector<int32_t>{};
    if (chat) {
      messages.push_back({{"role", "user"}, {"content", line}});
      prompt = text.encode_messages(messages, a.thinking);
    } else {
      auto ids = text.encode((document.empty() ? "" : "\n") + line);
      if (ids.is_ok()) {
        document.insert(document.end(), ids->begin(), ids->end());
        prompt = document;
      } else {
        prompt = ids.status();
      }
    }
    if (!prompt.is_ok()) return fail(prompt.status().message());
    // The previous turn's full pages stay in the prefix index, so releasing first loses nothing.
    if (seq >= 0) s.engine->seq_release(seq);
    auto new_seq = s.engine->seq_create();
    if (!new_seq.is_ok()) return fail(new_seq.status().message());
    seq = *new_seq;
    req.prompt = *prompt;
    if (!plan.name.empty()) {
      Status st = store->session_begin(plan.name, seq, req.prompt, a.model.ctx + 1, session_meta());
      if (!st.is_ok()) return fail(st.message());
    }
    text.begin_answer();
    g_interrupted = false;
    std::string answer;
    std::vector<int32_t> answer_ids;
    auto on_token = [&](int32_t id) -> bool {
      if (!plan.name.empty())
        store->session_note(std::span<const int32_t>(&id, 1), s.engine->seq_kv(seq), s.engine->seq_tail_page(seq),
                            s.engine->pool());
      if (std::find(req.eos_ids.begin(), req.eos_ids.end(), id) != req.eos_ids.end()) return false;
      answer_ids.push_back(id);
      auto c = text.push(id);
      if (a.show_reasoning) std::fputs(c.reasoning.c_str(), stdout);
      std::fputs(c.content.c_str(), stdout);
      std::fflush(stdout);
      answer += c.content;
      return !g_interrupted;
    };
    auto r = generate(*s.engine, seq, req, on_token);
    auto c = text.flush();
    if (a.show_reasoning) std::fputs(c.reasoning.c_str(), stdout);
    std::fputs(c.content.c_str(), stdout);
    answer += c.content;
    std::printf("\n");
    if (!r.is_ok()) {
      if (!plan.name.empty()) (void)store->session_end(s.engine->seq_kv(seq), s.engine->seq_tail_page(seq), s.engine->pool());
      std::fprintf(stderr, "anvil: error: %s\n", r.status().message().c_str());
      if (!interactive) return 1;
      if (chat) messages.erase(messages.end() - 1);
      continue;
    }
    if (g_interrupted) std::printf("(stopped)\n");
    g_interrupted = false;
    if (chat) messages.push_back({{"role", "assistant"}, {"content", answer}});
    else document.insert(document.end(), answer_ids.begin(), answer_ids.end());
    if (!plan.name.empty()) {
      auto d = store->session_end(s.engine->seq_kv(seq), s.engine->seq_tail_page(seq), s.engine->pool(),
                                  session_meta());
      if (!d.is_ok()) std::fprintf(stderr, "[anvil] session %s: %s\n", plan.name.c_str(), d.status().message().c_str());
    }
    if (store && a.kv.profile) print_kv_profile(*store.get(), s.engine->seq_store_tokens(seq), stderr);
    if (!interactive) break;
  }
  if (seq >= 0) s.engine->seq_release(seq);
  return 0;
}

Command reg("run", "Chat with a model in the terminal (multi-turn), or answer one prompt with -p", 5,
            [](CLI::App& app) -> std::function<int()> {
              auto a = std::make_shared<RunArgs>();
              add_model_options(app, a->model);
              app.add_option("-p,--prompt", a->prompt, "Answer this one message and exit");
              app.add_option("--system", a->system, "System message");
              app.add_option("-n,--max-tokens", a->n, "Maximum tokens per answer")->capture_default_str();
              add_sampling_options(app, a->sampling);
              add_kv_store_options(app, a->kv);
              add_thinking_flags(app, &a->thinking);
              app.add_flag("--show-reasoning", a->show_reasoning, "Print the <think> reasoning (hidden by default)");
              return [a] { return run_chat(*a); };
            });

}  // namespace
}  // namespace anvil::cli
