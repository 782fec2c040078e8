// JSON mode's token mask: which tokens of a vocabulary may come next so that the reply stays the
// beginning of an accepted JSON text (json_constraint.h), and only the end-of-sequence ids once the
// object is closed.
//
// JsonVocab holds the vocabulary's byte strings as a trie laid out in preorder: node i has its byte,
// its depth and the index just past its subtree. allowed() walks it once with the automaton, copying
// the automaton's state down the trie (a state per depth) and skipping a whole subtree at the first
// byte the automaton refuses, so a step costs the nodes whose prefix is still valid, not
// vocab x token length. Tokens that decode to no bytes (special and added tokens, ids the tokenizer
// lacks) are not in the trie: they are never allowed inside the JSON.
//
// A mask is a bitset over the model's vocabulary (bit id % 64 of word id / 64). JsonConstraint keeps
// the masks of the last few automaton states it saw (a reply spends most steps in few states: inside
// a string, after a value), so a repeated state costs a copy.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/json_constraint.h"

namespace anvil {

class JsonVocab {
 public:
  // token_bytes[id]: the bytes token id decodes to ("" for a token never allowed in JSON), for ids
  // below vocab (the model's; missing entries count as ""). eos_ids: the ids that end a reply, at
  // least one below vocab. Errors name what is wrong.
  static Result<std::shared_ptr<const JsonVocab>> create(const std::vector<std::string>& token_bytes, int vocab,
                                                         std::vector<int32_t> eos_ids);

  int vocab() const { return vocab_; }
  size_t words() const { return (size_t(vocab_) + 63) / 64; }
  size_t nodes() const { return nodes_.size(); }
  const std::vector<int32_t>& eos_ids() const { return eos_; }
  // The tokens allowed after a text in state `s`: *mask gets words() words. Returns how many.
  int64_t allowed(const JsonAutomaton& s, std::vector<uint64_t>* mask) const;
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  // Every token except the end-of-sequence ones (a reasoning section that must close before the
  // JSON begins may not end the reply).
  const std::vector<uint64_t>& all_but_eos() const { return all_but_eos_; }

 private:
  struct Node {
    uint8_t byte;
    uint16_t depth;    // 1 for a token's first byte
    int32_t end;       // index just past this node's subtree
    int32_t ids_begin;  // ids_[ids_begin .. ids_end): the tokens whose bytes end here
    int32_t ids_end;
  };
  int vocab_ = 0;
  int max_len_ = 0;
  std::vector<Node> nodes_;
  std::vector<int32_t> ids_;
  std::vector<std::string> bytes_;
  std::vector<int32_t> eos_;
  std::vector<uint64_t> all_but_eos_;
};

class JsonConstraint {
 public:
  explicit JsonConstraint(std::shared_ptr<const JsonVocab> vocab) : vocab_(std::move(vocab)) {}

  // The tokens allowed next ([words] bitset): those keeping the text a valid beginning, or, once
  // complete(), exactly the end-of-sequence ids. Never empty (json_constraint.h: every accepted
  // prefix has a next byte, and the byte-level vocabulary has every single byte).
  const std::vector<uint64_t>& allowed();
  // Appends token `id`'s bytes. False (the state unchanged) when the token is not allowed.
  bool accept(int32_t id);
  bool complete() const { return state_.complete(); }
  const JsonAutomaton& state() const { return state_; }
  const JsonVocab& vocab() const { return *vocab_; }

 private:
  struct Cached {
    JsonAutomaton state;
    std::vector<uint64_t> mask;
    uint64_t used = 0;
  };
  static constexpr size_t kCacheSize = 8;
  std::shared_ptr<const JsonVocab> vocab_;
  JsonAutomaton state_;
  std::vector<Cached> cache_;
  uint64_t clock_ = 0;
  std::vector<uint64_t> eos_mask_;
};

inline bool mask_has(const std::vector<uint64_t>& mask, int32_t id) {
  return id >= 0 && size_t(id) / 64 < mask.size() && ((mask[size_t(id) / 64] >> (id % 64)) & 1);
}

}  // namespace anvil
