// anvil generate: one prompt in, tokens streamed out. A text prompt goes through the model's chat
// template when it has one (--raw sends it as is); --ids sends token ids as is.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/interrupt.h"
#include "cli/kv_options.h"
#include "cli/logit_bias_option.h"
#include "cli/output.h"
#include "cli/text_output.h"
#include "cli/thinking_flags.h"
#include "format/npy.h"
#include "runtime/generate.h"

namespace anvil::cli {
namespace {

struct GenerateArgs {
  ModelOptions model;
  SamplingOptions sampling;
  KVStoreFlags kv;
  PromptOptions prompt;
  std::string ids, dump_logits, system;
  std::vector<std::string> stops;
  int n = 128;
  bool json = false, ignore_eos = false, chat = false, raw = false, show_reasoning = false, no_special_tokens = false;
  std::optional<bool> thinking;  // --thinking / --no-thinking; unset: the template's default
};

int run_generate(GenerateArgs& a) {
  auto prompt_text = read_prompt(a.prompt);
  if (!prompt_text.is_ok()) return fail(prompt_text.status().message());
  if (prompt_text->has_value()) **prompt_text = valid_utf8_input(std::move(**prompt_text), "the prompt");
  a.system = valid_utf8_input(std::move(a.system), "--system");
  const bool have_text = prompt_text->has_value();
  const bool continuing = a.kv.resume || !a.kv.fork.empty();  // the session has a prompt; one given is appended
  if (have_text && !a.ids.empty())
    return fail("give the prompt once: -p/--prompt TEXT (or -f FILE) or --ids 1,2,3, not both");
  if (!have_text && a.ids.empty() && !continuing)
    return fail("no prompt: give -p/--prompt TEXT, -p - (stdin), -f/--file FILE, or --ids 1,2,3");
  if (a.n < 0) return fail("-n/--max-tokens must be >= 0, got " + std::to_string(a.n));
  if (a.chat && a.raw) return fail("--chat and --raw contradict each other: give one");
  if ((a.chat || !a.system.empty()) && !a.ids.empty()) return fail("--chat/--system need a text prompt (-p or -f)");
  if (a.raw && !a.system.empty()) return fail("--system needs the chat template: drop --raw");
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
  const std::string tok_dir = tokenizer_dir_of(s);
  // A session of generate's is a completion document (meta ""): another kind is refused, not overwritten.
  auto opened = open_store_session(a.kv, s, SessionKind::kCompletion);  // declared after the stack: detached
                                                                        // and flushed before it goes
  if (!opened.is_ok()) return fail(opened.status().message());
  AttachedStore& store = opened->store;
  const SessionPlan& plan = opened->plan;

  // The chat template by default for text (as mlx-lm does), when the model has one.
  bool has_template = false;
  if (have_text && !a.raw) {
    auto h = has_chat_template(tok_dir);
    if (!h.is_ok()) return fail(h.status().message());
    has_template = *h;
  }
  const bool chat = have_text && !a.raw && (a.chat || !a.system.empty() || has_template);
  if (chat && !a.chat && !a.system.empty() && !has_template)
    return fail("--system needs a chat template, and " + tok_dir +
                " has none: drop --system (the prompt is then sent as is)");
  if (have_text && !chat && a.thinking)
    std::fprintf(stderr, "[anvil] warning: --thinking/--no-thinking have no effect: %s\n",
                 a.raw ? "--raw sends the prompt without the chat template" : "the model has no chat template");
  std::unique_ptr<TextOutput> text;
  std::vector<int32_t> prompt;
  if (have_text) {
    auto t = TextOutput::open(tok_dir, chat, a.show_reasoning, a.stops);
    if (!t.is_ok()) return fail(t.status().message());
    text = std::move(t).value();
    // A raw prompt starts with the tokenizer's BOS (post-processor / add_bos_token), as
    // transformers and llama.cpp do; not when it is appended to a session's tokens.
    const bool add_special = !a.no_special_tokens && !continuing;
    auto p = chat ? text->encode_chat(a.system, **prompt_text, a.thinking) : text->encode(**prompt_text, add_special);
    if (!p.is_ok()) return fail(p.status().message());
    prompt = std::move(p).value();
    if (prompt.empty()) return fail("the prompt encodes to no tokens: nothing to generate from");
  } else {
    if (!a.ids.empty()) {
      auto p = parse_ids(a.ids);
      if (!p.is_ok()) return fail(p.status().message());
      prompt = std::move(p).value();
    }
    // Text for --json and --stop when a tokenizer is at hand; ids alone otherwise.
    auto t = TextOutput::open(tok_dir, false, a.show_reasoning, a.stops);
    if (t.is_ok()) text = std::move(t).value();
    else if (!a.stops.empty()) return fail("--stop: " + t.status().message());
  }

  if (!a.dump_logits.empty()) {
    auto seq = s.engine->seq_create();
    if (!seq.is_ok()) return fail(seq.status().message());
    std::vector<float> all;
    Status st = s.engine->extend(*seq, prompt, nullptr, &all);
    if (!st.is_ok()) return fail(st.message());
    st = write_npy(a.dump_logits, all.data(), {int64_t(prompt.size()), int64_t(s.model->config.vocab_size)});
    if (!st.is_ok()) return fail(st.message());
    s.engine->seq_release(*seq);
    if (a.n == 0) {
      if (a.json) std::printf("%s\n", nlohmann::json{{"ids", nlohmann::json::array()}, {"prompt_tokens", prompt.size()}}.dump().c_str());
      return 0;
    }
  }

  // A resumed or forked session continues from its tokens; the prompt (if any) is appended.
  if (!plan.history.empty()) prompt.insert(prompt.begin(), plan.history.begin(), plan.history.end());
  if (prompt.empty()) return fail("the session has no tokens and no prompt was given");
  // Refused before the session records anything: a first turn that cannot run leaves no session, a
  // continued one the session as it was (the engine would refuse it the same way, after the record).
  if (int64_t(prompt.size()) > s.ctx)
    return fail("sequence of " + std::to_string(prompt.size()) + " tokens exceeds the context limit of " +
                std::to_string(s.ctx) + " (raise --ctx)" +
                (plan.history.empty() ? "" : "; session '" + plan.name + "' is left as it was"));

  GenerateRequest req;
  req.prompt = prompt;
  req.max_new_tokens = a.n;
  req.sampling = *sampling;
  req.eos_ids = s.model->config.eos_token_ids;
  req.ignore_eos = a.ignore_eos;
  auto seq = s.engine->seq_create();
  if (!seq.is_ok()) return fail(seq.status().message());
  if (!plan.name.empty()) {
    Status st = store->session_begin(plan.name, *seq, prompt, s.ctx + 1);
    if (!st.is_ok()) return fail(st.message());
  }
  // Text for a text prompt, and for a session continued without one (--resume/--fork: the
  // session's document is text); ids for --ids, and where no tokenizer can decode them.
  const bool print_text = !a.json && text && a.ids.empty();
  const bool print_ids = !a.json && !print_text;
  std::string all_text, all_reasoning;
  // Prints a chunk: the reasoning with --show-reasoning, then a blank line (the newlines around the
  // reasoning are trimmed: TextOutput) before the answer's first text.
  auto print_chunk = [&](const TextOutput::Chunk& c) {
    if (a.show_reasoning) std::fputs(c.reasoning.c_str(), stdout);
    if (!c.content.empty() && a.show_reasoning && !all_reasoning.empty() && all_text.empty()) std::fputs("\n\n", stdout);
    std::fputs(c.content.c_str(), stdout);
  };
  install_sigint_handler();
  auto on_token = [&](int32_t id) -> bool {
    if (!plan.name.empty())  // the sampled id has no KV yet: n_kv still ends before it
      store->session_note(*seq, std::span<const int32_t>(&id, 1), s.engine->seq_kv(*seq), s.engine->seq_tail_page(*seq),
                          s.engine->pool());
    if (print_ids) std::printf("%d ", id);
    if (text) {
      bool is_eos = !a.ignore_eos && std::find(req.eos_ids.begin(), req.eos_ids.end(), id) != req.eos_ids.end();
      TextOutput::Chunk c = is_eos ? TextOutput::Chunk{} : text->push(id);
      all_reasoning += c.reasoning;
      if (print_text) print_chunk(c);
      all_text += c.content;
      if (text->stopped()) return false;
    }
    // Streamed as it comes (output_ok flushes). Ctrl-C, or nobody left to read the output (a closed
    // pipe: main() exits 141), stops here, and a session still records what was generated.
    return !interrupted() && output_ok();
  };
  req.keep_prefilling = [] { return !interrupted(); };  // Ctrl-C during a long prompt stops it between chunks
  auto r = generate(*s.engine, *seq, req, on_token);
  int durable = -1;
  std::string not_saved;  // why the session's last state could not be committed (a full disk)
  if (!plan.name.empty()) {  // even after an error: what was generated is recorded
    auto d = store->session_end(*seq, s.engine->seq_kv(*seq), s.engine->seq_tail_page(*seq), s.engine->pool());
    if (d.is_ok()) durable = *d;
    else not_saved = d.status().message();
  }
  if (!r.is_ok()) {
    if (!a.json) std::printf("\n");  // the error must not continue the streamed line
    return fail(r.status().message());
  }
  const bool still_thinking = text && text->in_reasoning();
  const int store_tokens = s.engine->seq_store_tokens(*seq);
  if (text) {
    TextOutput::Chunk c = text->flush();
    all_reasoning += c.reasoning;
    if (print_text) print_chunk(c);
    all_text += c.content;
  }
  std::string finish = r->finish_reason;
  // A stop string may complete in the text the flush released (the U+FFFD of a character -n cut short).
  if ((finish == "cancelled" || finish == "length") && text && text->stopped()) finish = "stop";
  else if (finish == "cancelled") finish = "interrupted";
  if (a.json) {
    const double prefill_tps = r->prefill_s > 0 ? (r->prompt_done - r->reused_tokens) / r->prefill_s : 0;
    const double decode_tps = r->decode_s > 0 && r->ids.size() > 1 ? (r->ids.size() - 1) / r->decode_s : 0;
    nlohmann::ordered_json j;
    j["ids"] = r->ids;
    if (text) {
      j["text"] = all_text;
      if (chat) j["reasoning"] = all_reasoning;
    }
    j["finish_reason"] = finish;
    j["prompt_tokens"] = r->prompt_tokens;
    j["cached_prompt_tokens"] = r->reused_tokens;
    if (r->prompt_done < r->prompt_tokens) j["prefilled_prompt_tokens"] = r->prompt_done;  // Ctrl-C in the prompt
    if (store) j["store_prompt_tokens"] = store_tokens;
    if (!plan.name.empty()) {
      std::vector<int32_t> all = prompt;
      all.insert(all.end(), r->ids.begin(), r->ids.end());
      j["session"] = plan.name;
      j["session_ids"] = all;
      j["session_durable_tokens"] = durable;
      j["session_saved"] = not_saved.empty();
    }
    if (store && a.kv.profile) j["kv_store"] = kv_profile_json(*store.get());
    j["chat_template"] = chat;
    j["seed"] = req.sampling.seed;
    j["timings"] = {{"prefill_s", r->prefill_s}, {"decode_s", r->decode_s},
                    {"prefill_tok_s", prefill_tps}, {"decode_tok_s", decode_tps}, {"peak_rss_mib", peak_rss_mib()}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("\n");
    output_ok();  // flushes: the text ends before the summary starts, also when both go to one pipe
    std::string seed = req.sampling.temperature > 0 ? ", seed " + std::to_string(req.sampling.seed) : "";
    std::fprintf(stderr, "[anvil] %s%s\n", generation_summary(*r, finish).c_str(), seed.c_str());
    // -n counts every generated token, hidden reasoning included: say so when it ran out there.
    if (finish == "length" && still_thinking && !a.show_reasoning)
      std::fprintf(stderr,
                   "[anvil] the model was still thinking when the limit was reached: all %zu tokens went to its "
                   "hidden reasoning (--show-reasoning prints it; raise -n, or --no-thinking)\n",
                   r->ids.size());
  }
  if (store && a.kv.profile) print_kv_profile(*store.get(), store_tokens, stderr);
  if (!not_saved.empty()) return fail(not_saved);  // the text is out, but --session did not do its job
  return finish == "interrupted" ? 130 : 0;
}

Command reg("generate", "Generate text (or token ids) from a prompt, streaming as tokens are produced", 10,
            [](CLI::App& app) -> std::function<int()> {
              auto a = std::make_shared<GenerateArgs>();
              add_model_options(app, a->model);
              add_prompt_options(app, a->prompt,
                                 "Prompt text, sent through the model's chat template when it has one (--raw: as is)");
              app.add_option("--ids", a->ids, "Prompt as token ids, sent as is: 1,2,3");
              add_int_option(app, "-n,--max-tokens", a->n,
                             "Maximum tokens to generate, >= 0; hidden <think> reasoning counts too", 0, INT32_MAX)
                  ->default_str(std::to_string(a->n));
              add_sampling_options(app, a->sampling);
              add_logit_bias_option(app, a->sampling.logit_bias);
              add_kv_store_options(app, a->kv);
              app.add_flag("--ignore-eos", a->ignore_eos, "Never stop at EOS (EOS ids are suppressed)");
              app.add_option("--stop", a->stops, "Stop when this string is produced (repeatable)")
                  ->check([](const std::string& v) {
                    return v.empty() ? std::string("an empty stop string (it would stop before the first token)")
                                     : std::string();
                  })
                  ->expected(1)
                  ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
              app.add_flag("--raw", a->raw, "Send the prompt as is, without the chat template");
              app.add_flag("--no-special-tokens", a->no_special_tokens,
                           "Encode a raw prompt without the tokenizer's special tokens (BOS/EOS of its post-processor "
                           "or add_bos_token): add_special_tokens=False");
              app.add_flag("--chat", a->chat, "Require the chat template (an error when the model has none)");
              app.add_option("--system", a->system, "System message (through the chat template)");
              add_thinking_flags(app, &a->thinking);
              app.add_flag("--show-reasoning", a->show_reasoning, "Print <think> reasoning too (hidden by default)");
              app.add_flag("--json", a->json,
                           "Print one JSON object at the end: ids, text, finish_reason, seed, timings");
              app.add_option("--dump-logits", a->dump_logits,
                             "Write float32 logits [prompt positions, vocab] of one teacher-forced forward over "
                             "the prompt to this .npy file");
              return [a] { return run_generate(*a); };
            });

}  // namespace
}  // namespace anvil::cli
