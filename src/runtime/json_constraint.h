// JsonAutomaton: a byte-level pushdown automaton for JSON mode (OpenAI's response_format
// {"type": "json_object"}). It reads a text one byte at a time and says whether the bytes so far
// are still the beginning of an accepted text (push() returns false on the first byte that is not),
// and whether they are a whole one (complete()).
//
// The accepted texts: one RFC 8259 JSON text whose value is an object, in UTF-8, with
//  - strings: no raw control characters (< 0x20); escapes \" \\ \/ \b \f \n \r \t and \uXXXX
//    (4 hex digits); a \u escape of a high surrogate must be followed by one of a low surrogate,
//    and a low surrogate may not stand alone (I-JSON, RFC 7493: every parser reads the text as the
//    same characters); well-formed UTF-8 only (no overlong forms, no encoded surrogates, nothing
//    above U+10FFFF), a multi-byte character may arrive over several push() calls;
//  - numbers: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?; literals true, false, null;
//  - nesting at most kJsonMaxDepth containers deep (the stack is 64 bits);
//  - at most kJsonMaxWhitespace consecutive whitespace bytes (space, \t, \n, \r) between tokens, at
//    most kJsonMaxLeadingWhitespace before the object (the "\n\n" a reasoning model writes after
//    </think>), and none after it: a model cannot loop on whitespace, and the text ends exactly
//    where the object does.
// Every prefix push() accepts can be completed (a string closed, a number given a digit, the
// containers closed: each state has a next byte), so a decoder that only ever takes accepted bytes
// never reaches a dead end.
//
// The state is a few bytes, copied freely: the token mask (json_mask.h) walks a vocabulary trie by
// copying the state at every node.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace anvil {

inline constexpr int kJsonMaxDepth = 64;
inline constexpr int kJsonMaxWhitespace = 20;
inline constexpr int kJsonMaxLeadingWhitespace = 2;

class JsonAutomaton {
 public:
  // Reads one byte. Returns false when the text so far plus `b` is the beginning of no accepted
  // text; the state is then unspecified (push onto a copy to test a byte).
  bool push(uint8_t b);
  // push() of every byte; false at the first refused one (*at, if given, is its index).
  bool push(std::string_view bytes, size_t* at = nullptr);
  // The bytes so far are a whole accepted text: the object has been closed. Nothing may follow.
  bool complete() const { return mode_ == kDone; }
  int depth() const { return depth_; }

  bool operator==(const JsonAutomaton&) const = default;
  uint64_t hash() const;

 private:
  enum Mode : uint8_t {
    kStart,       // before the object: whitespace, '{'
    kObjOpen,     // after '{': whitespace, '"' (a key), '}'
    kObjKey,      // after ',' in an object: whitespace, '"'
    kColon,       // after a key: whitespace, ':'
    kValue,       // after ':' or ',' in an array: whitespace, a value
    kArrOpen,     // after '[': whitespace, a value, ']'
    kAfterValue,  // after a value in a container: whitespace, ',', the container's closer
    kString,      // inside a string (sub_: StrSub)
    kNumber,      // inside a number (sub_: NumSub)
    kLiteral,     // inside true / false / null (sub_: which, aux_: bytes read)
    kDone,        // the object is closed
  };
  enum StrSub : uint8_t {
    kStrChar,      // the next character, '"' or '\'
    kStrEscape,    // after '\'
    kStrHex,       // in \uXXXX: aux_ hex digits read, hex_ what the code unit is so far
    kStrUtf8,      // aux_ continuation bytes still due, the next in [lo_, hi_]
    kStrLowSlash,  // after a high surrogate's escape: '\' must follow
    kStrLowU,      // ... then 'u'
  };
  enum HexKind : uint8_t { kHexPlain, kHexD, kHexHigh, kHexLow };  // kHexD: first digit D, second not yet seen
  enum NumSub : uint8_t {
    kNumMinus,  // after '-': a digit
    kNumZero,   // a leading 0: '.', 'e', 'E' or the end
    kNumInt,    // in [1-9][0-9]*: a digit, '.', 'e', 'E' or the end
    kNumDot,    // after '.': a digit
    kNumFrac,   // in the fraction: a digit, 'e', 'E' or the end
    kNumE,      // after 'e': a sign or a digit
    kNumESign,  // after the exponent's sign: a digit
    kNumExp,    // in the exponent: a digit or the end
  };

  bool push_structural(uint8_t b);  // a byte outside strings, numbers and literals
  bool push_string(uint8_t b);
  bool push_number(uint8_t b);
  bool start_value(uint8_t b);      // the first byte of a value
  bool open(bool object);
  bool close(bool object);
  void value_done();                // a value ended: the object is closed, or its container goes on

  uint64_t stack_ = 0;  // bit d: the container at depth d + 1 is an object (else an array)
  Mode mode_ = kStart;
  uint8_t depth_ = 0;   // open containers
  uint8_t sub_ = 0;
  uint8_t aux_ = 0;
  uint8_t lo_ = 0, hi_ = 0;
  uint8_t ws_ = 0;      // consecutive whitespace bytes just read
  bool key_ = false;    // the string being read is an object key
  bool low_due_ = false;  // kStrHex: this escape must be a low surrogate
  uint8_t hex_ = kHexPlain;
};

}  // namespace anvil
