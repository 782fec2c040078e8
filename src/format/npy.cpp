// .npy reader/writer. Layout: "\x93NUMPY", major, minor, header length (u16 LE for 1.0, u32 LE for
// 2.0/3.0), an ASCII Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and a final '\n' so the data starts 64-byte aligned, then the raw data.
#include "format/npy.h"

#include <cstring>

#include "base/dtype.h"
#include "base/mmap_file.h"

namespace anvil {

namespace {

constexpr uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

struct DescrInfo {
  const char* descr;
  size_t itemsize;
};
constexpr DescrInfo kDescrs[] = {{"<f4", 4}, {"<f2", 2}, {"<f8", 8}, {"<i4", 4}, {"<i8", 8}, {"<i2", 2},
                                 {"|i1", 1}, {"<u4", 4}, {"<u8", 8}, {"<u2", 2}, {"|u1", 1}, {"|b1", 1}};

size_t itemsize_of(const std::string& d) {
  for (const auto& x : kDescrs)
    if (d == x.descr) return x.itemsize;
  return 0;
}

// A cursor over the header dict literal. Only what numpy writes is accepted: string keys, values
// that are strings, True/False, or tuples of non-negative integers.
class DictParser {
 public:
  DictParser(const std::string& s) : s_(s) {}
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool peek(char c) {
    ws();
    return i_ < s_.size() && s_[i_] == c;
  }
  bool string(std::string* out) {
    ws();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) return false;
    char q = s_[i_++];
    size_t end = s_.find(q, i_);
    if (end == std::string::npos) return false;
    *out = s_.substr(i_, end - i_);
    i_ = end + 1;
    return true;
  }
  bool word(const char* w) {
    ws();
    size_t n = std::strlen(w);
    if (s_.compare(i_, n, w) != 0) return false;
    i_ += n;
    return true;
  }
  bool tuple(std::vector<int64_t>* out) {
    if (!eat('(')) return false;
    for (;;) {
      if (eat(')')) return true;
      ws();
      if (i_ >= s_.size() || s_[i_] < '0' || s_[i_] > '9') return false;
      int64_t v = 0;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
        if (__builtin_mul_overflow(v, int64_t(10), &v) || __builtin_add_overflow(v, int64_t(s_[i_] - '0'), &v))
          return false;
        ++i_;
      }
      if (i_ < s_.size() && s_[i_] == 'L') ++i_;  // Python 2 long suffix
      out->push_back(v);
      if (!eat(',') && !peek(')')) return false;
    }
  }
  bool at_end() {
    ws();
    return i_ == s_.size();
  }

 private:
  const std::string& s_;
  size_t i_ = 0;
};

std::string shape_tuple(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

Status write_npy_impl(const std::string& path, const char* descr, const void* data, std::vector<int64_t> shape) {
  for (int64_t d : shape)
    if (d < 0) return invalid_argument(path + ": negative dimension " + std::to_string(d) + " in shape " + shape_tuple(shape));
  std::vector<uint8_t> buf = npy_bytes(descr, data, shape);
  return write_file_atomic(path, buf.data(), buf.size());
}

}  // namespace

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const float* NpyArray::f32() const { return descr == "<f4" ? reinterpret_cast<const float*>(bytes.data()) : nullptr; }
const int32_t* NpyArray::i32() const {
  return descr == "<i4" ? reinterpret_cast<const int32_t*>(bytes.data()) : nullptr;
}
const int64_t* NpyArray::i64() const {
  return descr == "<i8" ? reinterpret_cast<const int64_t*>(bytes.data()) : nullptr;
}

std::vector<float> NpyArray::to_f32() const {
  size_t n = size_t(numel());
  std::vector<float> out(n);
  const uint8_t* p = bytes.data();
  for (size_t i = 0; i < n; ++i) {
    float v = 0;
    if (descr == "<f4") { std::memcpy(&v, p + 4 * i, 4); }
    else if (descr == "<f2") { uint16_t h; std::memcpy(&h, p + 2 * i, 2); v = f16_to_f32(h); }
    else if (descr == "<f8") { double d; std::memcpy(&d, p + 8 * i, 8); v = float(d); }
    else if (descr == "<i4") { int32_t x; std::memcpy(&x, p + 4 * i, 4); v = float(x); }
    else if (descr == "<i8") { int64_t x; std::memcpy(&x, p + 8 * i, 8); v = float(x); }
    else if (descr == "<i2") { int16_t x; std::memcpy(&x, p + 2 * i, 2); v = float(x); }
    else if (descr == "<u4") { uint32_t x; std::memcpy(&x, p + 4 * i, 4); v = float(x); }
    else if (descr == "<u8") { uint64_t x; std::memcpy(&x, p + 8 * i, 8); v = float(x); }
    else if (descr == "<u2") { uint16_t x; std::memcpy(&x, p + 2 * i, 2); v = float(x); }
    else if (descr == "|i1") { v = float(int8_t(p[i])); }
    else if (descr == "|u1" || descr == "|b1") { v = float(p[i]); }
    out[i] = v;
  }
  return out;
}

std::vector<uint8_t> npy_bytes(const std::string& descr, const void* data, const std::vector<int64_t>& shape) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape_tuple(shape) + ", }";
  // Pad so that magic(6) + version(2) + length(2) + header + '\n' is a multiple of 64, as numpy does.
  const size_t prefix = 10;
  size_t total = prefix + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  size_t nbytes = itemsize_of(descr);
  for (int64_t d : shape) nbytes *= size_t(d);

  std::vector<uint8_t> out(prefix + header.size() + nbytes);
  std::memcpy(out.data(), kMagic, 6);
  out[6] = 1;
  out[7] = 0;
  out[8] = uint8_t(header.size() & 0xff);
  out[9] = uint8_t(header.size() >> 8);
  std::memcpy(out.data() + prefix, header.data(), header.size());
  if (nbytes) std::memcpy(out.data() + prefix + header.size(), data, nbytes);
  return out;
}

Status write_npy(const std::string& path, const float* data, std::vector<int64_t> shape) {
  return write_npy_impl(path, "<f4", data, std::move(shape));
}
Status write_npy(const std::string& path, const int32_t* data, std::vector<int64_t> shape) {
  return write_npy_impl(path, "<i4", data, std::move(shape));
}

Result<NpyArray> parse_npy(const uint8_t* data, size_t size, const std::string& label) {
  if (size < 10 || std::memcmp(data, kMagic, 6) != 0) return corrupt(label + ": not a .npy file (bad magic)");
  const int major = data[6];
  size_t hlen, prefix;
  if (major == 1) {
    hlen = size_t(data[8]) | size_t(data[9]) << 8;
    prefix = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) return corrupt(label + ": truncated .npy header");
    hlen = size_t(data[8]) | size_t(data[9]) << 8 | size_t(data[10]) << 16 | size_t(data[11]) << 24;
    prefix = 12;
  } else {
    return unsupported(label + ": .npy format version " + std::to_string(major) + "." + std::to_string(data[7]) +
                       " (expected 1.0, 2.0 or 3.0)");
  }
  if (hlen > size - prefix)
    return corrupt(label + ": .npy header length " + std::to_string(hlen) + " runs past the end of the file");
  const std::string header(reinterpret_cast<const char*>(data + prefix), hlen);

  NpyArray a;
  bool fortran = true, have_descr = false, have_order = false, have_shape = false;
  DictParser p(header);
  if (!p.eat('{')) return corrupt(label + ": .npy header is not a dict: " + header);
  while (!p.eat('}')) {
    std::string key;
    if (!p.string(&key) || !p.eat(':')) return corrupt(label + ": malformed .npy header: " + header);
    bool ok;
    if (key == "descr") {
      ok = p.string(&a.descr);
      have_descr = true;
    } else if (key == "fortran_order") {
      ok = p.word("False") ? (fortran = false, true) : p.word("True");
      have_order = true;
    } else if (key == "shape") {
      ok = p.tuple(&a.shape);
      have_shape = true;
    } else {
      return corrupt(label + ": .npy header has an unknown key '" + key + "'");
    }
    if (!ok) return corrupt(label + ": .npy header: bad value for '" + key + "': " + header);
    if (!p.eat(',') && !p.peek('}')) return corrupt(label + ": malformed .npy header: " + header);
  }
  if (!p.at_end()) return corrupt(label + ": trailing bytes after the .npy header dict");
  if (!have_descr || !have_order || !have_shape)
    return corrupt(label + ": .npy header needs descr, fortran_order and shape: " + header);
  if (fortran) return unsupported(label + ": fortran_order True arrays are not supported (expected C order)");
  size_t itemsize = itemsize_of(a.descr);
  if (itemsize == 0)
    return unsupported(label + ": .npy dtype '" + a.descr + "' is not supported (expected <f4, <i4, <f2, <i8, ...)");

  uint64_t nbytes = itemsize;
  for (int64_t d : a.shape)
    if (__builtin_mul_overflow(nbytes, uint64_t(d), &nbytes))
      return corrupt(label + ": .npy shape is too large");
  const size_t have = size - prefix - hlen;
  if (nbytes != have)
    return corrupt(label + ": .npy data is " + std::to_string(have) + " bytes but dtype " + a.descr + " x shape " +
                   shape_tuple(a.shape) + " needs " + std::to_string(nbytes));
  a.bytes.assign(data + prefix + hlen, data + size);
  return a;
}

Result<NpyArray> read_npy(const std::string& path) {
  ANVIL_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return parse_npy(reinterpret_cast<const uint8_t*>(text.data()), text.size(), path);
}

}  // namespace anvil
