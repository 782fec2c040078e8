// safetensors reader/writer: files written by the Python reference read back exactly, our writer
// matches the reference byte for byte, and every malformed header is rejected with a message that
// names the file and the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/mmap_file.h"
#include "format_test_util.h"
#include "format/safetensors.h"

using namespace anvil;
using anvil_test::contains;
using anvil_test::raw_safetensors;
using anvil_test::TempDir;
using nlohmann::json;

namespace {

const std::string kData = std::string(ANVIL_TEST_DATA) + "/format/";

json load_json(const std::string& path) {
  Result<std::string> text = read_file(path);
  EXPECT_TRUE(text.is_ok()) << text.status().message();
  return json::parse(*text);
}

// Checks a TensorView against the reference description {dtype, shape, values}.
void expect_matches(const TensorView& t, const json& ref) {
  SCOPED_TRACE(t.name);
  EXPECT_EQ(std::string(dtype_name(t.dtype)), ref["dtype"].get<std::string>());
  EXPECT_EQ(t.shape, ref["shape"].get<std::vector<int64_t>>());
  const json& vals = ref["values"];
  ASSERT_EQ(size_t(t.numel()), vals.size());
  ASSERT_EQ(t.nbytes, size_t(t.numel()) * dtype_size(t.dtype));
  for (size_t i = 0; i < vals.size(); ++i) {
    const uint8_t* p = t.data + i * dtype_size(t.dtype);
    switch (t.dtype) {
      case DType::kF32: case DType::kF16: case DType::kBF16: {
        // memcpy: tensor data in a file need not be aligned for its type.
        float v = 0;
        if (t.dtype == DType::kF32) std::memcpy(&v, p, 4);
        else { uint16_t h; std::memcpy(&h, p, 2); v = t.dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h); }
        EXPECT_EQ(v, vals[i].get<double>()) << "element " << i;  // exact: the reference value is this float
        break;
      }
      case DType::kF64: { double v; std::memcpy(&v, p, 8); EXPECT_EQ(v, vals[i].get<double>()); break; }
      case DType::kI8: EXPECT_EQ(int8_t(*p), vals[i].get<int64_t>()); break;
      case DType::kU8: EXPECT_EQ(*p, vals[i].get<int64_t>()); break;
      case DType::kBool: EXPECT_EQ(*p != 0, vals[i].get<bool>()); break;
      case DType::kI16: { int16_t v; std::memcpy(&v, p, 2); EXPECT_EQ(v, vals[i].get<int64_t>()); break; }
      case DType::kU16: { uint16_t v; std::memcpy(&v, p, 2); EXPECT_EQ(v, vals[i].get<int64_t>()); break; }
      case DType::kI32: { int32_t v; std::memcpy(&v, p, 4); EXPECT_EQ(v, vals[i].get<int64_t>()); break; }
      case DType::kU32: { uint32_t v; std::memcpy(&v, p, 4); EXPECT_EQ(v, vals[i].get<int64_t>()); break; }
      case DType::kI64: { int64_t v; std::memcpy(&v, p, 8); EXPECT_EQ(v, vals[i].get<int64_t>()); break; }
      case DType::kU64: { uint64_t v; std::memcpy(&v, p, 8); EXPECT_EQ(v, vals[i].get<uint64_t>()); break; }
    }
  }
}

// Raw bytes of reference values in the given dtype, for feeding our writer.
std::vector<uint8_t> bytes_of(const json& ref) {
  DType dt;
  EXPECT_TRUE(dtype_from_name(ref["dtype"].get<std::string>(), &dt));
  const json& vals = ref["values"];
  std::vector<uint8_t> out(vals.size() * dtype_size(dt));
  for (size_t i = 0; i < vals.size(); ++i) {
    uint8_t* p = out.data() + i * dtype_size(dt);
    if (is_float_dtype(dt)) {
      float f = float(vals[i].get<double>());
      if (dt == DType::kF32) std::memcpy(p, &f, 4);
      else { uint16_t h = dt == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f); std::memcpy(p, &h, 2); }
    } else if (dt == DType::kF64) {
      double d = vals[i].get<double>();
      std::memcpy(p, &d, 8);
    } else if (dt == DType::kBool) {
      *p = vals[i].get<bool>() ? 1 : 0;
    } else {
      int64_t v = vals[i].get<int64_t>();  // little-endian host: the low bytes are the value
      std::memcpy(p, &v, dtype_size(dt));
    }
  }
  return out;
}

Result<std::unique_ptr<SafetensorsFile>> parse_bytes(const std::vector<uint8_t>& b, const std::string& label) {
  return SafetensorsFile::parse(b.data(), b.size(), label);
}

// A header parse must fail with a message containing every one of `needles`.
void expect_error(const std::vector<uint8_t>& file, const std::vector<std::string>& needles) {
  TempDir dir;
  std::string path = dir.file("bad.safetensors");
  anvil_test::write_bytes(path, file);
  auto r = SafetensorsFile::open(path);
  ASSERT_FALSE(r.is_ok());
  EXPECT_TRUE(contains(r.status().message(), path)) << r.status().message();
  for (const auto& n : needles) EXPECT_TRUE(contains(r.status().message(), n)) << r.status().message();
}

}  // namespace

TEST(Safetensors, ReadsFileWrittenByPythonReference) {
  json ref = load_json(kData + "reference.json");
  auto f = SafetensorsFile::open(kData + "reference.safetensors");
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ((*f)->tensors().size(), ref.size() - 1);  // minus __metadata__
  for (auto it = ref.begin(); it != ref.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const TensorView* t = (*f)->find(it.key());
    ASSERT_NE(t, nullptr) << it.key();
    EXPECT_EQ(t->file, kData + "reference.safetensors");
    expect_matches(*t, *it);
  }
  auto want_meta = ref["__metadata__"].get<std::map<std::string, std::string>>();
  EXPECT_EQ((*f)->metadata(), want_meta);
  EXPECT_EQ((*f)->find("no.such.tensor"), nullptr);
}

TEST(Safetensors, TensorViewsPointIntoTheMapping) {
  auto f = SafetensorsFile::open(kData + "reference.safetensors");
  ASSERT_TRUE(f.is_ok());
  auto mapped = MappedFile::open(kData + "reference.safetensors");
  ASSERT_TRUE(mapped.is_ok());
  // Zero-copy: the same bytes as in the file at header + offset, and no two views share a byte.
  std::vector<std::pair<const uint8_t*, size_t>> spans;
  for (const auto& t : (*f)->tensors()) {
    if (t.nbytes == 0) continue;
    spans.push_back({t.data, t.nbytes});
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].first + spans[i - 1].second, spans[i].first);
  const TensorView* t = (*f)->find("layers.0.f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape_string(), "[3, 5]");
  EXPECT_EQ(t->numel(), 15);
  uint64_t n = 0;
  std::memcpy(&n, (*mapped)->data(), 8);
  bool found = false;
  for (size_t off = 8 + n; off + t->nbytes <= (*mapped)->size(); ++off)
    found |= std::memcmp((*mapped)->data() + off, t->data, t->nbytes) == 0;
  EXPECT_TRUE(found);
}

TEST(Safetensors, WriterMatchesPythonReferenceByteForByte) {
  json ref = load_json(kData + "writer_match.json");
  SafetensorsWriter w;
  // Added in reverse order: the writer, like the reference, orders tensors itself.
  std::vector<std::string> names;
  for (auto it = ref.begin(); it != ref.end(); ++it)
    if (it.key() != "__metadata__") names.push_back(it.key());
  for (auto n = names.rbegin(); n != names.rend(); ++n) {
    std::vector<uint8_t> b = bytes_of(ref[*n]);
    DType dt;
    ASSERT_TRUE(dtype_from_name(ref[*n]["dtype"].get<std::string>(), &dt));
    ASSERT_TRUE(w.add(*n, dt, ref[*n]["shape"].get<std::vector<int64_t>>(), b.data(), b.size()).is_ok());
  }
  for (auto& [k, v] : ref["__metadata__"].items()) w.set_metadata(k, v.get<std::string>());
  std::vector<uint8_t> ours = w.to_buffer();
  std::vector<uint8_t> theirs = anvil_test::read_bytes(kData + "writer_match.safetensors");
  EXPECT_EQ(std::string(ours.begin(), ours.end()), std::string(theirs.begin(), theirs.end()));
}

TEST(Safetensors, RoundTripsEveryDtype) {
  // Every dtype, written by our writer and read back through a file: same dtype, shape and bytes.
  json ref = load_json(kData + "reference.json");
  TempDir dir;
  SafetensorsWriter w;
  std::map<std::string, std::vector<uint8_t>> expected;
  std::set<DType> dtypes;
  for (auto it = ref.begin(); it != ref.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    DType dt;
    ASSERT_TRUE(dtype_from_name((*it)["dtype"].get<std::string>(), &dt));
    dtypes.insert(dt);
    expected[it.key()] = bytes_of(*it);
    ASSERT_TRUE(w.add(it.key(), dt, (*it)["shape"].get<std::vector<int64_t>>(), expected[it.key()].data(),
                      expected[it.key()].size())
                    .is_ok());
  }
  EXPECT_EQ(dtypes.size(), 13u);  // the fixture covers every DType
  w.set_metadata("format", "pt");
  w.set_metadata("quote\"and\\slash", "line\nbreak");
  std::string path = dir.file("rt.safetensors");
  ASSERT_TRUE(w.write_file(path).is_ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ((*f)->tensors().size(), expected.size());
  for (auto it = ref.begin(); it != ref.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const TensorView* t = (*f)->find(it.key());
    ASSERT_NE(t, nullptr);
    expect_matches(*t, *it);
    EXPECT_EQ(std::vector<uint8_t>(t->data, t->data + t->nbytes), expected[it.key()]);
    // Wider types first: every tensor's offset in the data section is a multiple of its size.
    auto mapped_base = t->data - (*f)->tensors().front().data;
    EXPECT_EQ(size_t(mapped_base) % dtype_size(t->dtype), 0u) << it.key();
  }
  EXPECT_EQ((*f)->metadata().at("quote\"and\\slash"), "line\nbreak");
  // The header is space-padded so the data section starts 8-byte aligned.
  std::vector<uint8_t> b = anvil_test::read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, WriterRejectsBadTensors) {
  SafetensorsWriter w;
  float x[4] = {1, 2, 3, 4};
  Status s = w.add("w", DType::kF32, {2, 3}, x, sizeof x);
  EXPECT_FALSE(s.is_ok());
  EXPECT_TRUE(contains(s.message(), "'w'")) << s.message();
  EXPECT_TRUE(contains(s.message(), "24")) << s.message();
  EXPECT_FALSE(w.add("neg", DType::kF32, {-1, -4}, x, 16).is_ok());
  EXPECT_FALSE(w.add("__metadata__", DType::kF32, {4}, x, 16).is_ok());
  EXPECT_FALSE(w.add("", DType::kF32, {4}, x, 16).is_ok());
  EXPECT_FALSE(w.add("huge", DType::kF32, {int64_t(1) << 62, 8}, x, 16).is_ok());
  ASSERT_TRUE(w.add("ok", DType::kF32, {2, 2}, x, sizeof x).is_ok());
  s = w.add("ok", DType::kF32, {4}, x, sizeof x);
  EXPECT_FALSE(s.is_ok());
  EXPECT_TRUE(contains(s.message(), "'ok'")) << s.message();
}

TEST(Safetensors, EmptyHeaderAndZeroSizeTensorsAreValid) {
  auto f = parse_bytes(raw_safetensors("{}", 0), "empty");
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_TRUE((*f)->tensors().empty());
  f = parse_bytes(raw_safetensors(R"({"a":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},)"
                                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4),
                  "zero");
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ((*f)->find("a")->nbytes, 0u);
}

// ----- malformed files: one test each, the message names the file (and the tensor/field).

TEST(SafetensorsBad, FileShorterThanHeaderLength) {
  expect_error({1, 2, 3}, {"too short"});
}

TEST(SafetensorsBad, HeaderLengthLargerThanFile) {
  std::string h = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  expect_error(raw_safetensors(h, 4, h.size() + 100), {"header length", "larger than the rest of the file"});
}

TEST(SafetensorsBad, HeaderLengthOverTheCap) {
  expect_error(raw_safetensors("{}", 0, kMaxSafetensorsHeaderBytes + 1), {"exceeds the limit"});
}

TEST(SafetensorsBad, DataSectionShorterThanOffsets) {
  // A file cut short: the header promises 16 bytes, 10 are there.
  expect_error(raw_safetensors(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 10),
               {"'w'", "past the end of the data section"});
}

TEST(SafetensorsBad, HeaderNotJson) {
  expect_error(raw_safetensors(R"({"w":{"dtype":"F32",)", 0), {"not valid JSON"});
}

TEST(SafetensorsBad, HeaderNotAnObject) {
  expect_error(raw_safetensors("[1,2,3]", 0), {"must be a JSON object"});
}

TEST(SafetensorsBad, OffsetsOutOfBounds) {
  expect_error(raw_safetensors(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[100,104]}})", 8),
               {"'w'", "past the end"});
}

TEST(SafetensorsBad, OffsetsReversed) {
  expect_error(raw_safetensors(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 8),
               {"'w'", "begin is after end"});
}

TEST(SafetensorsBad, OverlappingTensors) {
  expect_error(raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
               {"'a'", "'b'", "overlap"});
}

TEST(SafetensorsBad, SizeDoesNotMatchDtypeTimesShape) {
  expect_error(raw_safetensors(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", 8),
               {"'w'", "needs 12"});
}

TEST(SafetensorsBad, UnknownDtype) {
  expect_error(raw_safetensors(R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16),
               {"'w'", "unknown dtype 'F128'"});
}

TEST(SafetensorsBad, NegativeShape) {
  expect_error(raw_safetensors(R"({"w":{"dtype":"F32","shape":[-1,4],"data_offsets":[0,0]}})", 0),
               {"'w'", "non-negative"});
}

TEST(SafetensorsBad, ShapeProductOverflows) {
  expect_error(raw_safetensors(
                   R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})", 0),
               {"'w'", "overflows"});
}

TEST(SafetensorsBad, MissingField) {
  expect_error(raw_safetensors(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4), {"'w'", "'shape'"});
  expect_error(raw_safetensors(R"({"w":{"dtype":"F32","shape":[1]}})", 4), {"'w'", "'data_offsets'"});
  expect_error(raw_safetensors(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4), {"'w'", "'dtype'"});
}

TEST(SafetensorsBad, DuplicateTensor) {
  expect_error(raw_safetensors(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                               R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2),
               {"'w'", "appears twice"});
}

TEST(SafetensorsBad, MetadataNotStrings) {
  expect_error(raw_safetensors(R"({"__metadata__":{"n":3}})", 0), {"__metadata__", "'n'"});
}

TEST(SafetensorsBad, OpenMissingFileNamesIt) {
  auto r = SafetensorsFile::open("/nonexistent/dir/x.safetensors");
  ASSERT_FALSE(r.is_ok());
  EXPECT_TRUE(contains(r.status().message(), "/nonexistent/dir/x.safetensors"));
}
