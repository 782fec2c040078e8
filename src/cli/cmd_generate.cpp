// anvil generate: one prompt in, tokens streamed out.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/kv_options.h"
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
  std::string prompt, ids, dump_logits, system;
  std::vector<std::string> stops;
  int n = 128;
  bool json = false, ignore_eos = false, chat = false, show_reasoning = false;
  std::optional<bool> thinking;  // --thinking / --no-thinking; unset: the template's default
};

int run_generate(GenerateArgs& a) {
  const bool continuing = a.kv.resume || !a.kv.fork.empty();  // the prompt is optional: the session has one
  if (!a.prompt.empty() && !a.ids.empty()) return fail("give one of -p/--prompt TEXT and --ids 1,2,3, not both");
  if (a.prompt.empty() && a.ids.empty() && !continuing)
    return fail("give exactly one of -p/--prompt TEXT and --ids 1,2,3");
  if (a.n < 0) return fail("-n must be >= 0");
  if (a.chat && !a.ids.empty()) return fail("--chat needs a text prompt (-p)");
  auto stack = build_stack(a.model);
  if (!stack.is_ok()) return fail(stack.status().message());
  Stack& s = *stack;
  const std::string tok_dir = tokenizer_dir_of(s);
  auto attached = attach_kv_store(a.kv, s);
  if (!attached.is_ok()) return fail(attached.status().message());
  AttachedStore& store = *attached;
  SessionPlan plan;
  if (store) {
    auto p = plan_session(a.kv, store.get());
    if (!p.is_ok()) return fail(p.status().message());
    plan = std::move(p).value();
  }

  std::unique_ptr<TextOutput> text;
  std::vector<int32_t> prompt;
  if (!a.prompt.empty()) {
    auto t = TextOutput::open(tok_dir, a.chat, a.show_reasoning, a.stops);
    if (!t.is_ok()) return fail(t.status().message());
    text = std::move(t).value();
    auto p = a.chat ? text->encode_chat(a.system, a.prompt, a.thinking) : text->encode(a.prompt);
    if (!p.is_ok()) return fail(p.status().message());
    prompt = std::move(p).value();
  } else if (!a.ids.empty()) {
    auto p = parse_ids(a.ids);
    if (!p.is_ok()) return fail(p.status().message());
    prompt = std::move(p).value();
    if (!a.stops.empty() || a.show_reasoning) {
      auto t = TextOutput::open(tok_dir, false, a.show_reasoning, a.stops);
      if (t.is_ok()) text = std::move(t).value();
    }
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

  if (text == nullptr && (!a.stops.empty() || a.show_reasoning || continuing)) {
    auto t = TextOutput::open(tok_dir, false, a.show_reasoning, a.stops);
    if (t.is_ok()) text = std::move(t).value();
  }
  // A resumed or forked session continues from its tokens; the prompt (if any) is appended.
  if (!plan.history.empty()) prompt.insert(prompt.begin(), plan.history.begin(), plan.history.end());
  if (prompt.empty()) return fail("the session has no tokens and no prompt was given");

  GenerateRequest req;
  req.prompt = prompt;
  req.max_new_tokens = a.n;
  req.sampling = resolve_sampling(a.sampling, s.model->dir);
  req.eos_ids = s.model->config.eos_token_ids;
  req.ignore_eos = a.ignore_eos;
  auto seq = s.engine->seq_create();
  if (!seq.is_ok()) return fail(seq.status().message());
  if (!plan.name.empty()) {
    Status st = store->session_begin(plan.name, *seq, prompt, a.model.ctx + 1);
    if (!st.is_ok()) return fail(st.message());
  }
  std::string all_text, all_reasoning;
  auto on_token = [&](int32_t id) -> bool {
    if (!plan.name.empty())  // the sampled id has no KV yet: n_kv still ends before it
      store->session_note(std::span<const int32_t>(&id, 1), s.engine->seq_kv(*seq), s.engine->seq_tail_page(*seq),
                          s.engine->pool());
    if (text) {
      bool is_eos = !a.ignore_eos && std::find(req.eos_ids.begin(), req.eos_ids.end(), id) != req.eos_ids.end();
      TextOutput::Chunk c = is_eos ? TextOutput::Chunk{} : text->push(id);
      all_text += c.content;
      all_reasoning += c.reasoning;
      if (!a.json) {
        if (!c.reasoning.empty() && a.show_reasoning) std::fputs(c.reasoning.c_str(), stdout);
        std::fputs(c.content.c_str(), stdout);
        std::fflush(stdout);
      }
      return !text->stopped();
    }
    if (!a.json) {
      std::printf("%d ", id);
      std::fflush(stdout);
    }
    return true;
  };
  auto r = generate(*s.engine, *seq, req, on_token);
  int durable = -1;
  if (!plan.name.empty()) {  // even after an error: what was generated is recorded
    auto d = store->session_end(s.engine->seq_kv(*seq), s.engine->seq_tail_page(*seq), s.engine->pool());
    if (d.is_ok()) durable = *d;
  }
  if (!r.is_ok()) return fail(r.status().message());
  const int store_tokens = s.engine->seq_store_tokens(*seq);
  if (text) {
    TextOutput::Chunk c = text->flush();
    all_text += c.content;
    all_reasoning += c.reasoning;
    if (!a.json) {
      if (a.show_reasoning) std::fputs(c.reasoning.c_str(), stdout);
      std::fputs(c.content.c_str(), stdout);
    }
  }
  const double prefill_tps = r->prefill_s > 0 ? (r->prompt_tokens - r->reused_tokens) / r->prefill_s : 0;
  const double decode_tps = r->decode_s > 0 && r->ids.size() > 1 ? (r->ids.size() - 1) / r->decode_s : 0;
  std::string finish = r->finish_reason == "cancelled" && text && text->stopped() ? "stop" : r->finish_reason;
  if (a.json) {
    nlohmann::ordered_json j;
    j["ids"] = r->ids;
    if (text) {
      j["text"] = all_text;
      if (a.chat) j["reasoning"] = all_reasoning;
    }
    j["finish_reason"] = finish;
    j["prompt_tokens"] = r->prompt_tokens;
    j["cached_prompt_tokens"] = r->reused_tokens;
    if (store) j["store_prompt_tokens"] = store_tokens;
    if (!plan.name.empty()) {
      std::vector<int32_t> all = prompt;
      all.insert(all.end(), r->ids.begin(), r->ids.end());
      j["session"] = plan.name;
      j["session_ids"] = all;
      j["session_durable_tokens"] = durable;
    }
    if (store && a.kv.profile) j["kv_store"] = kv_profile_json(*store.get());
    j["timings"] = {{"prefill_s", r->prefill_s}, {"decode_s", r->decode_s},
                    {"prefill_tok_s", prefill_tps}, {"decode_tok_s", decode_tps}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("\n");
    std::fprintf(stderr, "[anvil] prompt %d tokens (%.1f tok/s), generated %zu tokens (%.1f tok/s), finish: %s\n",
                 r->prompt_tokens, prefill_tps, r->ids.size(), decode_tps, finish.c_str());
  }
  if (store && a.kv.profile) print_kv_profile(*store.get(), store_tokens, stderr);
  return 0;
}

Command reg("generate", "Generate text (or token ids) from a prompt, streaming as tokens are produced", 10,
            [](CLI::App& app) -> std::function<int()> {
              auto a = std::make_shared<GenerateArgs>();
              add_model_options(app, a->model);
              app.add_option("-p,--prompt", a->prompt, "Prompt text (needs tokenizer.json in the model directory)");
              app.add_option("--ids", a->ids, "Prompt as token ids: 1,2,3");
              app.add_option("-n,--max-tokens", a->n, "Maximum tokens to generate")->capture_default_str();
              add_sampling_options(app, a->sampling);
              add_kv_store_options(app, a->kv);
              app.add_flag("--ignore-eos", a->ignore_eos, "Never stop at EOS (EOS ids are suppressed)");
              app.add_option("--stop", a->stops, "Stop when this string is produced (repeatable)")
                  ->expected(1)
                  ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
              app.add_flag("--chat", a->chat, "Apply the model's chat template to the prompt (one user turn)");
              app.add_option("--system", a->system, "System message for --chat");
              add_thinking_flags(app, &a->thinking);
              app.add_flag("--show-reasoning", a->show_reasoning, "Print <think> reasoning too (hidden by default)");
              app.add_flag("--json", a->json,
                           "Print one JSON object at the end: ids, text, finish_reason, timings");
              app.add_option("--dump-logits", a->dump_logits,
                             "Write float32 logits [prompt positions, vocab] of one teacher-forced forward over "
                             "the prompt to this .npy file");
              return [a] { return run_generate(*a); };
            });

}  // namespace
}  // namespace anvil::cli
