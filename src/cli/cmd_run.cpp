// anvil run: an interactive multi-turn chat in the terminal (or one turn with -p/-f).
// The conversation is kept as messages; each turn renders the whole conversation through the chat
// template and starts a new sequence, whose earlier pages come from the prefix cache, so only the
// new turn is prefilled. When the next turn would not fit in --ctx, the oldest turns are dropped
// (the system message stays) and the user is told. Ctrl-C stops the current answer; /reset clears
// the history; /quit or Ctrl-D leaves; a line is a command or text by run_line.h's rule. A model
// without a chat template runs in completion mode: the text typed so far and the model's answers
// form one growing document (the oldest tokens of the earlier text are dropped the same way, after
// the BOS it begins with; the new text never is). A message that does not fit in --ctx even alone
// is refused in both modes, and the history is left as it was.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/kv_options.h"
#include "cli/logit_bias_option.h"
#include "cli/interrupt.h"
#include "cli/output.h"
#include "cli/run_line.h"
#include "cli/text_output.h"
#include "cli/thinking_flags.h"
#include "runtime/generate.h"
#include "tokenizer/cut_turn.h"

namespace anvil::cli {
namespace {

struct RunArgs {
  ModelOptions model;
  SamplingOptions sampling;
  KVStoreFlags kv;
  PromptOptions prompt;
  std::string system;
  int n = 1024;
  std::optional<bool> thinking;  // --thinking / --no-thinking; unset: the template's default
  bool show_reasoning = false, hide_reasoning = false, no_special_tokens = false;
};

// Reads one line from stdin, every byte of it (a NUL too: fgets' C string lost the rest of the
// line and ran it into the next one); false on EOF. An interrupted read (Ctrl-C at the prompt)
// returns an empty line.
bool read_line(std::string* line) {
  line->clear();
  for (;;) {
    errno = 0;
    const int c = std::getc(stdin);
    if (c == EOF) {
      if (errno == EINTR || interrupted()) {
        clearerr(stdin);
        clear_interrupted();
        line->clear();
        std::printf("\n");
        return true;
      }
      return !line->empty();
    }
    if (c == '\n') break;
    line->push_back(char(c));
  }
  if (!line->empty() && line->back() == '\r') line->pop_back();
  return true;
}

// An answer as the conversation records it: its content, and its reasoning (when the model wrote
// any) as reasoning_content, as the server records a reply; the chat template decides whether a
// later prompt shows it.
nlohmann::ordered_json assistant_message(const TextOutput::Chunk& answer) {
  nlohmann::ordered_json m = {{"role", "assistant"}, {"content", answer.content}};
  if (!answer.reasoning.empty()) m["reasoning_content"] = answer.reasoning;
  return m;
}

int run_chat(RunArgs& a) {
  auto one_prompt = read_prompt(a.prompt);
  if (!one_prompt.is_ok()) return fail(one_prompt.status().message());
  if (one_prompt->has_value()) **one_prompt = valid_utf8_input(std::move(**one_prompt), "the prompt");
  a.system = valid_utf8_input(std::move(a.system), "--system");
  if (a.n < 1) return fail("-n/--max-tokens must be >= 1, got " + std::to_string(a.n));
  if (a.show_reasoning && a.hide_reasoning) return fail("--show-reasoning and --hide-reasoning contradict each other");
  auto model_dir = model_dir_of(a.model);
  if (!model_dir.is_ok()) return fail(model_dir.status().message());
  auto sampling = resolve_sampling(a.sampling, *model_dir);
  if (!sampling.is_ok()) return fail(sampling.status().message());
  auto stack = build_stack(a.model);
  if (!stack.is_ok()) return fail(stack.status().message());
  Stack& s = *stack;
  // -l/--logit-bias ids past the logits row are refused before anything runs (the sampler would skip them).
  if (Status st = check_logit_bias_vocab(sampling->logit_bias, s.model->config.vocab_size); !st.is_ok())
    return fail(st.message());
  const std::string dir = tokenizer_dir_of(s);
  auto has_template = has_chat_template(dir);
  if (!has_template.is_ok()) return fail(has_template.status().message());
  const bool chat = *has_template;
  auto text_r = TextOutput::open(dir, chat, a.show_reasoning, {});
  if (!text_r.is_ok()) return fail(text_r.status().message());
  TextOutput& text = **text_r;
  const bool interactive = !one_prompt->has_value();
  const bool tty = isatty(STDOUT_FILENO);
  // Reasoning is shown dimmed on a terminal (no blank screen while a thinking model thinks), hidden
  // when the output is piped, unless asked otherwise.
  const bool show_reasoning = a.show_reasoning || (tty && !a.hide_reasoning);
  const char* dim_on = tty ? "\x1b[2m" : "";
  const char* dim_off = tty ? "\x1b[0m" : "";
  if (!chat && !a.system.empty())  // as anvil generate: never dropped silently
    return fail("--system needs a chat template, and " + dir +
                " has none: drop --system (anvil run is then in completion mode: the model continues your text)");
  if (!chat)
    std::fprintf(stderr, "[anvil] %s has no chat template: completion mode (the model continues your text)%s\n",
                 dir.c_str(), a.thinking ? "; --thinking/--no-thinking have no effect" : "");
  // A session of run's is a conversation (a model without a chat template: its text); another kind is
  // refused (plan_session), never overwritten. Declared after the stack: detached and flushed before it goes.
  // A conversation that has begun keeps its system message: --system may repeat it, never change or
  // add one (it would be dropped silently), so another is refused before anything is written.
  SessionCheck same_system;
  if (chat && !a.system.empty())
    same_system = [&](const SessionInfo& info) -> Status {
      const auto m = nlohmann::ordered_json::parse(info.meta, nullptr, false);
      const auto msgs = m.is_object() ? m.value("messages", nlohmann::ordered_json::array()) : nlohmann::ordered_json();
      const bool has = msgs.is_array() && !msgs.empty() && msgs[0].is_object() && msgs[0].value("role", "") == "system";
      if (has && msgs[0].contains("content") && msgs[0]["content"] == a.system) return Status::ok();
      return invalid_argument("--system: session '" + info.name + "' " +
                              (has ? "began with another system message" : "has no system message") +
                              ", and a conversation keeps the one it began with: drop --system to continue it as "
                              "it is, or begin a new session with it (the session is left as it is)");
    };
  auto opened = open_store_session(a.kv, s, chat ? SessionKind::kChat : SessionKind::kRunText, same_system);
  if (!opened.is_ok()) return fail(opened.status().message());
  AttachedStore& store = opened->store;
  const SessionPlan& plan = opened->plan;

  install_sigint_handler();

  GenerateRequest req;
  req.max_new_tokens = a.n;
  req.sampling = *sampling;
  req.eos_ids = s.model->config.eos_token_ids;
  // Each turn draws from its own stream (seed + turn number), so asking the same thing again gives
  // a fresh answer while a given --seed still reproduces the whole session; a resumed session goes
  // on counting where it stopped (its meta's "turns").
  const uint64_t session_seed = sampling->seed;
  uint64_t turn_no = 0;
  // Room the prompt must leave for the answer, else the oldest turns go.
  const int answer_room = std::min(a.n, std::max(1, s.ctx / 4));
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
  std::vector<int32_t> document;  // completion mode
  // What the tokenizer puts before a text (its BOS, when add_bos_token asks for one): a document
  // that begins with it keeps it when its oldest tokens are dropped, as the model saw it at the
  // start (dropping it changed every later answer). Found by encoding a probe with and without.
  std::vector<int32_t> lead;
  if (!chat) {
    auto with = text.encode("x", true), without = text.encode("x", false);
    if (with.is_ok() && without.is_ok() && !without->empty()) {
      auto at = std::search(with->begin(), with->end(), without->begin(), without->end());
      if (at != with->end()) lead.assign(with->begin(), at);
    }
  }
  if (plan.resumed) {  // a session keeps the conversation in its meta
    // Of this command's kind (plan_session, session_kind.h): "messages" is an array of messages,
    // "document" (absent: empty) an array of token ids.
    auto m = nlohmann::ordered_json::parse(plan.meta, nullptr, false);
    messages = m["messages"];
    if (m.contains("document")) document = m["document"].get<std::vector<int32_t>>();
    // A turn cut short (the process died mid-answer): the conversation was recorded when the turn
    // began, its token ids at every flush since. What was answered is kept; a question that got
    // no answer at all is dropped, so that the roles still alternate.
    std::string cut;
    auto is_eos = [&](int32_t id) {
      return std::find(req.eos_ids.begin(), req.eos_ids.end(), id) != req.eos_ids.end();
    };
    if (chat) {
      CutAnswer answer;  // (cut_turn.h: the server takes such a turn up alike)
      if (take_up_cut_turn(text.config(), text.tokenizer(), &messages, plan.history, req.eos_ids, a.thinking,
                           &answer))
        cut = answer.tokens > 0 ? "the last answer was cut short after " + std::to_string(answer.tokens) +
                                      " tokens; it is kept as it was"
                                : "the last message was never answered; it is dropped";
    } else if (plan.history.size() > document.size() &&
               std::equal(document.begin(), document.end(), plan.history.begin())) {
      size_t n = 0;
      for (size_t i = document.size(); i < plan.history.size(); ++i)
        if (!is_eos(plan.history[i])) document.push_back(plan.history[i]), ++n;
      if (n > 0) cut = "the last answer was cut short after " + std::to_string(n) + " tokens; it is kept as it was";
    }
    // The turns begun so far (the next answer's seed is seed + turns). A meta without the count (a
    // session last continued over HTTP: the server records only the messages) counts its answers.
    if (m.contains("turns") && m["turns"].is_number_unsigned()) {
      turn_no = m["turns"].get<uint64_t>();
    } else {
      for (const auto& msg : messages)
        if (msg.is_object() && msg.value("role", "") == "assistant") ++turn_no;
    }
    if (chat)
      std::printf("(resumed session %s: %zu messages%s)\n", plan.name.c_str(), messages.size(),
                  cut.empty() ? "" : ("; " + cut).c_str());
    else
      std::printf("(resumed session %s: %zu tokens of text%s)\n", plan.name.c_str(), document.size(),
                  cut.empty() ? "" : ("; " + cut).c_str());
  }
  // The first message a dropped turn or /reset may take: the system message stays, the --system of
  // this run or the one a resumed conversation begins with (it was this run's --system when the
  // session began, and a resumed run without --system keeps it as an uninterrupted run would).
  const size_t first_turn =
      !messages.empty() && messages[0].is_object() && messages[0].value("role", "") == "system" ? 1 : 0;
  // The conversation as a session records it: anvil run's format (the server's too), plus the
  // number of turns begun (the next answer's seed).
  auto session_meta = [&](const nlohmann::ordered_json& msgs, const std::vector<int32_t>& doc) {
    return nlohmann::ordered_json{{"messages", msgs}, {"document", doc}, {"turns", turn_no}}.dump(
        -1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  };
  int seq = -1;
  int exit_code = 0;  // a one-turn run (-p/-f) that Ctrl-C stopped: 130, as anvil generate
  if (interactive)
    std::printf("anvil run: %s. Type a message; /reset clears the conversation, /quit leaves, /help lists the "
                "commands, Ctrl-C stops an answer.\n",
                s.model->source.c_str());
  if (sampling->temperature > 0)
    std::fprintf(stderr, "[anvil] sampling at temperature %g with seed %llu (--seed %llu repeats this session)\n",
                 sampling->temperature, static_cast<unsigned long long>(session_seed),
                 static_cast<unsigned long long>(session_seed));
  for (;;) {
    std::string line;
    if (interactive) {
      std::printf("> ");
      if (!output_ok()) break;  // nobody reads the answers any more
      if (!read_line(&line)) {  // end of input: on a terminal (Ctrl-D), the shell's prompt goes on a line of its own
        if (isatty(STDIN_FILENO)) std::printf("\n");
        break;
      }
      const TypedLine typed = classify_typed_line(valid_utf8_input(std::move(line), "the message"));
      if (typed.kind == TypedLine::kNothing) continue;
      if (typed.kind == TypedLine::kRefused) {
        std::fprintf(stderr, "anvil: error: %s\n", typed.text.c_str());
        continue;
      }
      if (typed.kind == TypedLine::kCommand) {
        if (typed.text == "/quit" || typed.text == "/exit") break;
        if (typed.text == "/help") std::fputs(run_help(!chat).c_str(), stdout);
        if (typed.text == "/reset") {
          messages.erase(messages.begin() + first_turn, messages.end());
          document.clear();
          // A session records the cleared conversation now, as a turn records its own: a run that
          // ends here (Ctrl-D, /quit) leaves it cleared, and --resume begins afresh.
          if (!plan.name.empty()) {
            if (seq >= 0) s.engine->seq_release(seq);
            auto new_seq = s.engine->seq_create();
            if (!new_seq.is_ok()) return fail(new_seq.status().message());
            seq = *new_seq;
            Status st = store->session_begin(plan.name, seq, {}, s.ctx + 1, session_meta(messages, document));
            if (st.is_ok())
              if (auto d = store->session_end(seq, s.engine->seq_kv(seq), s.engine->seq_tail_page(seq),
                                              s.engine->pool(), session_meta(messages, document));
                  !d.is_ok())
                st = d.status();
            if (!st.is_ok())
              std::fprintf(stderr, "anvil: error: session '%s' still holds the conversation before /reset: %s\n",
                           plan.name.c_str(), st.message().c_str());
          }
          std::printf("(conversation cleared)\n");
        }
        continue;
      }
      line = typed.text;
    } else {
      line = **one_prompt;
    }
    // This turn's conversation (or document): the history plus the new message, its oldest turns
    // dropped when it does not fit. The history itself changes only once the turn is answered, so
    // a message that is refused (too long) or fails leaves it as it was.
    Result<std::vector<int32_t>> prompt = std::vector<int32_t>{};
    int dropped_turns = 0, dropped_tokens = 0;
    bool kept_lead = false;  // completion mode: the dropped tokens came after the document's BOS
    nlohmann::ordered_json turn_messages = messages;
    std::vector<int32_t> turn_document = document;
    if (chat) {
      turn_messages.push_back({{"role", "user"}, {"content", line}});
      for (;;) {
        prompt = text.encode_messages(turn_messages, a.thinking);
        if (!prompt.is_ok() || int(prompt->size()) + answer_room <= s.ctx) break;
        // Drop the oldest exchange: everything up to the next user message after the first one.
        auto next_user = std::find_if(turn_messages.begin() + first_turn + 1, turn_messages.end(),
                                      [](const auto& m) { return m["role"] == "user"; });
        if (next_user == turn_messages.end()) break;  // only this turn is left
        dropped_turns++;
        turn_messages.erase(turn_messages.begin() + first_turn, next_user);
      }
    } else {
      // The document starts with the tokenizer's BOS (if it has one); later lines continue it.
      auto ids = turn_document.empty() ? text.encode(line, !a.no_special_tokens) : text.encode("\n" + line, false);
      if (ids.is_ok()) {
        // Only the earlier text gives way: the new text is never cut (too long even alone, it is
        // refused below, as a chat message is, and as generate refuses a prompt over --ctx).
        kept_lead = !lead.empty() && turn_document.size() > lead.size() &&
                    std::equal(lead.begin(), lead.end(), turn_document.begin());
        const int keep = kept_lead ? int(lead.size()) : 0;
        const int earlier = int(turn_document.size()) - keep;
        turn_document.insert(turn_document.end(), ids->begin(), ids->end());
        if (int(turn_document.size()) + answer_room > s.ctx) {
          dropped_tokens = std::min(earlier, int(turn_document.size()) + answer_room - s.ctx);
          turn_document.erase(turn_document.begin() + keep, turn_document.begin() + keep + dropped_tokens);
        }
        prompt = turn_document;
      } else {
        prompt = ids.status();
      }
    }
    if (!prompt.is_ok()) return fail(prompt.status().message());
    if (int(prompt->size()) > s.ctx) {
      // Even alone (every earlier turn dropped) the message does not fit: refused, nothing dropped.
      std::fprintf(stderr,
                   "anvil: error: the message is too long: %s %zu tokens, more than --ctx %d (raise --ctx); the "
                   "%s unchanged\n",
                   !a.system.empty() ? "with the system message and the chat template it is"
                   : chat            ? "through the chat template it is"
                                     : "it is",
                   prompt->size(), s.ctx, chat ? "conversation is" : "text so far is");
      if (!interactive) return 1;
      continue;
    }
    if (dropped_turns > 0)
      std::fprintf(stderr, "[anvil] the conversation no longer fits in --ctx %d: dropped the %d oldest turn%s\n", s.ctx,
                   dropped_turns, dropped_turns == 1 ? "" : "s");
    if (dropped_tokens > 0)
      std::fprintf(stderr, "[anvil] the text no longer fits in --ctx %d: dropped its first %d tokens%s\n", s.ctx,
                   dropped_tokens, kept_lead ? " after the BOS it begins with (which stays)" : "");
    // The previous turn's full pages stay in the prefix index, so releasing first loses nothing.
    if (seq >= 0) s.engine->seq_release(seq);
    auto new_seq = s.engine->seq_create();
    if (!new_seq.is_ok()) return fail(new_seq.status().message());
    seq = *new_seq;
    req.prompt = *prompt;
    req.sampling.seed = session_seed + turn_no++;
    if (!plan.name.empty()) {
      Status st = store->session_begin(plan.name, seq, req.prompt, s.ctx + 1, session_meta(turn_messages, turn_document));
      if (!st.is_ok()) return fail(st.message());
    }
    text.begin_answer();
    clear_interrupted();
    TextOutput::Chunk answer;
    std::vector<int32_t> answer_ids;
    bool dimmed = false, reasoning_shown = false;
    auto emit = [&](const TextOutput::Chunk& c) {
      if (show_reasoning && !c.reasoning.empty()) {
        if (!dimmed) std::fputs(dim_on, stdout);
        dimmed = reasoning_shown = true;
        std::fputs(c.reasoning.c_str(), stdout);
      }
      if (!c.content.empty()) {
        if (dimmed) std::fputs(dim_off, stdout);
        dimmed = false;
        // The newlines around the reasoning are trimmed (TextOutput): a blank line parts it from
        // the answer.
        if (reasoning_shown && answer.content.empty()) std::fputs("\n\n", stdout);
        std::fputs(c.content.c_str(), stdout);
      }
      output_ok();  // flushes: the answer streams (a failed write is noticed by on_token)
      answer.reasoning += c.reasoning;
      answer.content += c.content;
    };
    auto on_token = [&](int32_t id) -> bool {
      if (!plan.name.empty())
        store->session_note(seq, std::span<const int32_t>(&id, 1), s.engine->seq_kv(seq), s.engine->seq_tail_page(seq),
                            s.engine->pool());
      if (std::find(req.eos_ids.begin(), req.eos_ids.end(), id) != req.eos_ids.end()) return false;
      answer_ids.push_back(id);
      emit(text.push(id));
      return !interrupted() && output_ok();  // Ctrl-C, or the output is gone (a closed pipe)
    };
    req.keep_prefilling = [] { return !interrupted(); };  // Ctrl-C during a long prompt stops it between chunks
    auto r = generate(*s.engine, seq, req, on_token);
    const bool still_thinking = text.in_reasoning();
    emit(text.flush());
    if (dimmed) std::fputs(dim_off, stdout);
    std::printf("\n");
    if (!r.is_ok()) {
      if (!plan.name.empty())
        if (auto d = store->session_end(seq, s.engine->seq_kv(seq), s.engine->seq_tail_page(seq), s.engine->pool());
            !d.is_ok())
          std::fprintf(stderr, "anvil: error: %s\n", d.status().message().c_str());
      std::fprintf(stderr, "anvil: error: %s\n", r.status().message().c_str());
      if (!interactive) return 1;
      continue;  // the history is as it was before this message
    }
    std::string finish = r->finish_reason;
    if (finish == "cancelled") finish = interrupted() || !output_ok() ? "interrupted" : "stop";
    if (finish == "interrupted") std::printf("(stopped)\n");
    output_ok();  // flushes (the summary goes to stderr after the answer)
    std::fprintf(stderr, "[anvil] %s\n", generation_summary(*r, finish).c_str());
    // -n counts the reasoning too: say so when the answer never got past it.
    if (finish == "length" && still_thinking)
      std::fprintf(stderr, "[anvil] the answer ended inside the model's reasoning (-n %d counts it too): raise -n, "
                           "or --no-thinking\n", a.n);
    clear_interrupted();
    // Stopped inside its prompt (Ctrl-C during a long prefill): the message got no answer, so the
    // conversation stays as it was before it (the prompt's computed pages stay cached for a retry).
    const bool unanswered = r->prompt_done < r->prompt_tokens;
    if (unanswered) std::fprintf(stderr, "[anvil] stopped before the answer began: the message is not kept\n");
    if (!unanswered) {
      messages = std::move(turn_messages);
      document = std::move(turn_document);
      if (chat) messages.push_back(assistant_message(answer));
      else document.insert(document.end(), answer_ids.begin(), answer_ids.end());
    }
    if (!plan.name.empty()) {
      auto d = store->session_end(seq, s.engine->seq_kv(seq), s.engine->seq_tail_page(seq), s.engine->pool(),
                                  session_meta(messages, document));
      if (!d.is_ok()) {
        std::fprintf(stderr, "anvil: error: %s\n", d.status().message().c_str());
        if (!interactive) return 1;
      }
    }
    if (store && a.kv.profile) print_kv_profile(*store.get(), s.engine->seq_store_tokens(seq), stderr);
    if (!interactive) {
      if (finish == "interrupted") exit_code = 130;
      break;
    }
    if (!output_ok()) break;  // the answer was cut short because nobody reads it: main() says how
  }
  if (seq >= 0) s.engine->seq_release(seq);
  return exit_code;
}

Command reg("run", "Chat with a model in the terminal (multi-turn), or answer one prompt with -p/-f", 5,
            [](CLI::App& app) -> std::function<int()> {
              auto a = std::make_shared<RunArgs>();
              add_model_options(app, a->model);
              add_prompt_options(app, a->prompt, "Answer this one message and exit");
              app.add_option("--system", a->system, "System message");
              add_int_option(app, "-n,--max-tokens", a->n,
                             "Maximum tokens per answer, >= 1; the <think> reasoning counts too", 1, INT32_MAX)
                  ->default_str(std::to_string(a->n));
              add_sampling_options(app, a->sampling);
              add_logit_bias_option(app, a->sampling.logit_bias);
              add_kv_store_options(app, a->kv);
              add_thinking_flags(app, &a->thinking);
              app.add_flag("--show-reasoning", a->show_reasoning,
                           "Print the <think> reasoning even when the output is not a terminal (on a terminal it is "
                           "shown dimmed by default)");
              app.add_flag("--hide-reasoning", a->hide_reasoning, "Do not print the <think> reasoning");
              app.add_flag("--no-special-tokens", a->no_special_tokens,
                           "Completion mode: do not start the text with the tokenizer's BOS (add_special_tokens=False)");
              return [a] { return run_chat(*a); };
            });

}  // namespace
}  // namespace anvil::cli
