// Oniguruma patterns (what tokenizers compiles Split, Replace and ByteLevel regexes with: Ruby
// syntax, Unicode 16.0 tables) rewritten for PCRE2 10.42 (UTF + UCP, Unicode 14.0 tables), so that
// each matches the same characters. See onig_pattern.cpp for what is rewritten and why.
#pragma once
#include <string>

namespace anvil::tok {

// The PCRE2 spelling of an Oniguruma pattern. Everything it does not rewrite passes unchanged, so
// a pattern PCRE2 cannot compile still fails there, with PCRE2's message.
std::string onig_to_pcre2(const std::string& pattern);

}  // namespace anvil::tok
