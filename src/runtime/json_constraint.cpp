#include "runtime/json_constraint.h"

#include <cstring>

namespace anvil {

namespace {
bool is_ws(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }
bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }
constexpr const char* kLiterals[3] = {"true", "false", "null"};
constexpr uint8_t kLiteralLen[3] = {4, 5, 4};
}  // namespace

uint64_t JsonAutomaton::hash() const {
  uint64_t h = stack_ * 0x9E3779B97F4A7C15ull;
  const uint8_t small[] = {uint8_t(mode_), depth_, sub_, aux_, lo_, hi_, ws_, uint8_t(key_), uint8_t(low_due_), hex_};
  for (uint8_t v : small) h = (h ^ v) * 0x100000001B3ull;
  return h ^ (h >> 29);
}

bool JsonAutomaton::push(std::string_view bytes, size_t* at) {
  for (size_t i = 0; i < bytes.size(); ++i)
    if (!push(uint8_t(bytes[i]))) {
      if (at) *at = i;
      return false;
    }
  if (at) *at = bytes.size();
  return true;
}

bool JsonAutomaton::open(bool object) {
  if (depth_ >= kJsonMaxDepth) return false;
  if (object)
    stack_ |= uint64_t(1) << depth_;
  else
    stack_ &= ~(uint64_t(1) << depth_);
  ++depth_;
  mode_ = object ? kObjOpen : kArrOpen;
  return true;
}

bool JsonAutomaton::close(bool object) {
  if (depth_ == 0 || bool((stack_ >> (depth_ - 1)) & 1) != object) return false;
  --depth_;
  stack_ &= ~(uint64_t(1) << depth_);  // the state stays canonical (equal states compare equal)
  value_done();
  return true;
}

void JsonAutomaton::value_done() {
  mode_ = depth_ == 0 ? kDone : kAfterValue;
  sub_ = aux_ = lo_ = hi_ = 0;
  key_ = low_due_ = false;
  hex_ = kHexPlain;
}

bool JsonAutomaton::start_value(uint8_t b) {
  sub_ = aux_ = 0;
  switch (b) {
    case '{': return open(true);
    case '[': return open(false);
    case '"':
      mode_ = kString, sub_ = kStrChar, key_ = false;
      return true;
    case '-': mode_ = kNumber, sub_ = kNumMinus; return true;
    case '0': mode_ = kNumber, sub_ = kNumZero; return true;
    case 't': mode_ = kLiteral, sub_ = 0, aux_ = 1; return true;
    case 'f': mode_ = kLiteral, sub_ = 1, aux_ = 1; return true;
    case 'n': mode_ = kLiteral, sub_ = 2, aux_ = 1; return true;
    default:
      if (b >= '1' && b <= '9') {
        mode_ = kNumber, sub_ = kNumInt;
        return true;
      }
      return false;
  }
}

bool JsonAutomaton::push_structural(uint8_t b) {
  if (is_ws(b)) {
    if (ws_ >= (mode_ == kStart ? kJsonMaxLeadingWhitespace : kJsonMaxWhitespace)) return false;
    ++ws_;
    return true;
  }
  ws_ = 0;
  const bool in_object = depth_ > 0 && ((stack_ >> (depth_ - 1)) & 1);
  switch (mode_) {
    case kStart: return b == '{' && open(true);
    case kObjOpen:
      if (b == '}') return close(true);
      [[fallthrough]];
    case kObjKey:
      if (b != '"') return false;
      mode_ = kString, sub_ = kStrChar, key_ = true;
      return true;
    case kColon:
      if (b != ':') return false;
      mode_ = kValue;
      return true;
    case kArrOpen:
      if (b == ']') return close(false);
      return start_value(b);
    case kValue: return start_value(b);
    case kAfterValue:
      if (b == ',') {
        mode_ = in_object ? kObjKey : kValue;
        return true;
      }
      if (b == '}' || b == ']') return close(b == '}');
      return false;
    default: return false;
  }
}

bool JsonAutomaton::push_string(uint8_t b) {
  switch (StrSub(sub_)) {
    case kStrChar:
      if (b == '"') {
        if (key_) {
          mode_ = kColon;
          sub_ = 0;
          key_ = false;
        } else {
          value_done();
        }
        return true;
      }
      if (b == '\\') {
        sub_ = kStrEscape;
        return true;
      }
      if (b < 0x20) return false;  // a raw control character
      if (b < 0x80) return true;
      // A UTF-8 lead byte: how many continuation bytes follow, and the range of the first one
      // (which excludes overlong forms, UTF-16 surrogates and code points above U+10FFFF).
      if (b >= 0xC2 && b <= 0xDF) aux_ = 1, lo_ = 0x80, hi_ = 0xBF;
      else if (b == 0xE0) aux_ = 2, lo_ = 0xA0, hi_ = 0xBF;
      else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) aux_ = 2, lo_ = 0x80, hi_ = 0xBF;
      else if (b == 0xED) aux_ = 2, lo_ = 0x80, hi_ = 0x9F;
      else if (b == 0xF0) aux_ = 3, lo_ = 0x90, hi_ = 0xBF;
      else if (b >= 0xF1 && b <= 0xF3) aux_ = 3, lo_ = 0x80, hi_ = 0xBF;
      else if (b == 0xF4) aux_ = 3, lo_ = 0x80, hi_ = 0x8F;
      else return false;  // a continuation byte, C0/C1 (overlong) or F5..FF
      sub_ = kStrUtf8;
      return true;
    case kStrUtf8:
      if (b < lo_ || b > hi_) return false;
      lo_ = 0x80, hi_ = 0xBF;
      if (--aux_ == 0) sub_ = kStrChar, lo_ = hi_ = 0;
      return true;
    case kStrEscape:
      if (b == 'u') {
        sub_ = kStrHex, aux_ = 0, hex_ = kHexPlain, low_due_ = false;
        return true;
      }
      if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' || b == 't') {
        sub_ = kStrChar;
        return true;
      }
      return false;
    case kStrLowSlash:
      if (b != '\\') return false;
      sub_ = kStrLowU;
      return true;
    case kStrLowU:
      if (b != 'u') return false;
      sub_ = kStrHex, aux_ = 0, hex_ = kHexPlain, low_due_ = true;
      return true;
    case kStrHex: {
      if (!is_hex(b)) return false;
      const bool d = b == 'd' || b == 'D';
      if (aux_ == 0) {
        if (d) hex_ = kHexD;
        else if (low_due_) return false;  // a high surrogate without its low one
      } else if (aux_ == 1 && hex_ == kHexD) {
        const bool high = (b >= '8' && b <= '9') || (b >= 'a' && b <= 'b') || (b >= 'A' && b <= 'B');
        const bool low = (b >= 'c' && b <= 'f') || (b >= 'C' && b <= 'F');
        if (low_due_ && !low) return false;
        if (!low_due_ && low) return false;  // a low surrogate alone
        hex_ = high ? kHexHigh : low ? kHexLow : kHexPlain;
      }
      if (++aux_ < 4) return true;
      sub_ = hex_ == kHexHigh ? kStrLowSlash : kStrChar;
      aux_ = 0, hex_ = kHexPlain, low_due_ = false;
      return true;
    }
  }
  return false;
}

bool JsonAutomaton::push_number(uint8_t b) {
  const bool digit = is_digit(b);
  switch (NumSub(sub_)) {
    case kNumMinus:
      if (!digit) return false;
      sub_ = b == '0' ? kNumZero : kNumInt;
      return true;
    case kNumDot:
      if (!digit) return false;
      sub_ = kNumFrac;
      return true;
    case kNumESign:
      if (!digit) return false;
      sub_ = kNumExp;
      return true;
    case kNumE:
      if (b == '+' || b == '-') {
        sub_ = kNumESign;
        return true;
      }
      if (!digit) return false;
      sub_ = kNumExp;
      return true;
    case kNumZero:
    case kNumInt:
    case kNumFrac:
    case kNumExp:
      if (digit && sub_ != kNumZero) return true;
      if (b == '.' && sub_ != kNumFrac && sub_ != kNumExp) {
        sub_ = kNumDot;
        return true;
      }
      if ((b == 'e' || b == 'E') && sub_ != kNumExp) {
        sub_ = kNumE;
        return true;
      }
      // The number ended (a number is never the whole text: its container follows); the byte is
      // the container's.
      value_done();
      return push_structural(b);
  }
  return false;
}

bool JsonAutomaton::push(uint8_t b) {
  switch (mode_) {
    case kString: return push_string(b);
    case kNumber: return push_number(b);
    case kLiteral: {
      if (b != uint8_t(kLiterals[sub_][aux_])) return false;
      if (++aux_ == kLiteralLen[sub_]) value_done();
      return true;
    }
    case kDone: return false;
    default: return push_structural(b);
  }
}

}  // namespace anvil
