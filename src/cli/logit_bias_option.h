// -l/--logit-bias TOKEN_ID(+/-)BIAS of anvil generate and anvil run, spelled as llama.cpp spells it
// (`-l 15043+1.5`, `-l 15043-1`), or TOKEN_ID=BIAS (`-l 15043=-1`): BIAS is added to the token's
// logit before any other sampling step (SamplingParams::logit_bias, OpenAI's logit_bias). Not on
// serve: there a request carries its own logit_bias (cmd_serve.cpp's add_flag_hint says so).
//
// Repeatable, one token per flag. Each value is checked while the command line is parsed, the
// message naming the flag and the value: the id a decimal integer >= 0, the bias a finite number in
// [-100, 100]. llama.cpp's `-inf` ("never") is taken as -100, the lowest bias there is (the API's:
// OpenAI says -100 should ban the token); +inf and NaN are refused. The same token twice is an
// error (no silent choice between the two values). The ids are stored ascending, as SamplingParams
// needs them. An id at or above the model's vocabulary can only be known once the model loads:
// check_logit_bias_vocab() refuses it then, before anything is generated.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/sampler.h"

namespace anvil::cli {

// One value of the flag: "15043+1.5", "15043-1", "15043=-0.5", "15043-inf". An error names
// -l/--logit-bias, the value as typed and what it takes.
Result<LogitBias> parse_logit_bias_value(const std::string& text);

// Declares -l/--logit-bias on `app`; `out` gets every entry given, by ascending id.
CLI::Option* add_logit_bias_option(CLI::App& app, std::vector<LogitBias>& out);

// An error naming -l/--logit-bias when an id is >= vocab (the model's logits row).
Status check_logit_bias_vocab(const std::vector<LogitBias>& bias, int64_t vocab);

}  // namespace anvil::cli
