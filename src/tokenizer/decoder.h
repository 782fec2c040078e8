// The tokenizer.json "decoder": turns the tokens of an id sequence back into text, as tokenizers'
// Decoder::decode does (decode_chain of each step, in order, then the pieces joined). Supported
// steps: ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, and a Sequence of those; a null
// decoder joins the tokens with spaces, as tokenizers does. Anything else is refused by name.
//
// Decoding is written once, as a stream (DecodeStream), and Tokenizer::decode is a stream pushed
// every token and finished; so streamed text equals decoded text byte for byte by construction.
// The stream model: each step receives a token as one or more fragments, the last one flagged; a
// step that fuses tokens (ByteLevel, Fuse) passes on one open token in fragments. A step emits
// text as soon as no later token can change it, and holds back only what can still change:
//  - ByteLevel: a trailing partial UTF-8 scalar (it may complete; tokenizers decodes lossily);
//  - ByteFallback: the current run of "<0xNN>" tokens, until a non-byte token or the end (one
//    invalid byte turns every byte of its run into U+FFFD, so no part of a run is final earlier);
//  - Strip: up to `stop` trailing `content` characters of the current token;
//  - after a fusing step only (where a token arrives in fragments): a Replace with a pattern longer
//    than one character, or a ByteFallback, holds the whole fused token (a match may span fragments).
// Every emitted chunk is valid UTF-8: tokens are valid UTF-8 strings, and byte-level bytes are
// emitted only as complete scalars or U+FFFD.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace anvil::tok {

class Regex;

class Decoder {
 public:
  static Result<Decoder> from_json(const nlohmann::json& j, const std::string& path = "decoder");
  // Exactly tokenizers' ByteLevel decoder: text = lossy UTF-8 of the tokens' bytes.
  bool is_byte_level_only() const { return steps_.size() == 1 && steps_[0].kind == Step::kByteLevel; }

  // Per-token bytes (Tokenizer::token_raw_bytes states the invariant they keep with decode).
  // The steps split in two: per-token steps (ByteLevel's byte table, ByteFallback's "<0xNN>" -> the
  // byte NN, Replace, Metaspace, a Strip before any fusing step, the null decoder's separator),
  // and whole-text ones, which only touch the text's edges: a Strip after a fusing step (Fuse,
  // ByteLevel) cuts the text's first `start` and last `stop` `content` characters; Metaspace
  // (prepend_scheme first/always) drops the replacement characters of the text's first token where
  // it writes a space elsewhere; the null decoder puts no separator before the first token.
  //
  // token_bytes: the bytes `token` (a vocab entry or added token's content) adds to a decoded text,
  // before any UTF-8 repair: every per-token step applied to it alone, as the text's first token
  // when `first`, else as one in its middle. A byte of a longer character stays that byte.
  std::string token_bytes(std::string_view token, bool first = false) const;
  // The whole-text Strip steps applied to joined token bytes (their start and stop cuts).
  void strip_text_edges(std::string& bytes) const;
  // The characters the whole-text Strip steps may cut from the text's ends.
  std::vector<std::string> edge_strip_contents() const;
  // OK when token_bytes() is exact for every token: joined and edge-stripped, the tokens' bytes are
  // decode's text before UTF-8 repair, for any id sequence (Tokenizer::token_raw_bytes). Otherwise
  // an error naming the step that makes a token's bytes depend on its neighbours: a ByteFallback,
  // ByteLevel, or a Replace whose pattern is longer than one character, after a fusing step (they
  // then act on the whole text); a Replace or Metaspace after ByteLevel (they would read bytes
  // that are not yet characters); any step but Strip after a whole-text Strip; a Strip before any
  // fusing step that follows a ByteFallback (it strips a run of byte tokens as one token).
  Status check_exact_token_bytes() const;

 private:
  friend class DecodeStream;
  struct Step {
    enum Kind { kByteLevel, kByteFallback, kFuse, kStrip, kReplace, kMetaspace } kind = kByteLevel;
    std::string content;                 // kStrip: the character; kReplace: the replacement
    uint32_t ch = 0;                     // kStrip content / kMetaspace replacement, as a code point
    size_t start = 0, stop = 0;          // kStrip
    std::shared_ptr<const Regex> regex;  // kReplace (null: matches nothing)
    bool single_char_pattern = false;    // kReplace: a match never spans fragments
    bool drop_first = false;             // kMetaspace: prepend_scheme != never
  };
  static Status parse_into(const nlohmann::json& j, const std::string& path, std::vector<Step>& steps);
  std::vector<Step> steps_;
  std::string separator_;  // between output tokens: " " for a null decoder, else ""
};

// One decoding in progress. push() each token's text (as written in the vocab or added tokens);
// the text that became final is appended to `out`. finish() appends the rest and resets.
class DecodeStream {
 public:
  explicit DecodeStream(const Decoder& d);
  void push(std::string_view token, std::string& out);
  void finish(std::string& out);

 private:
  struct State {
    std::string buf;         // fragments of a token not yet complete (steps that need whole tokens)
    std::string held;        // ByteLevel: partial scalar; ByteFallback: the byte run; Strip: trailing chars
    size_t held_count = 0;   // Strip: characters in `held`
    size_t strip_left = 0;   // Strip: leading characters that may still be stripped
    bool in_prefix = true;   // Strip: still at the token's start
    bool open = false;       // a token has started and not ended
    size_t tokens = 0;       // Metaspace, sink: tokens started
  };
  void feed(size_t step, std::string_view frag, bool last, std::string& out);
  void end(size_t step, std::string& out);
  void sink(std::string_view frag, bool last, std::string& out);

  const Decoder& d_;
  std::vector<State> st_;  // one per step, then the sink
};

}  // namespace anvil::tok
