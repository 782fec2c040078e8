// .npy: files written by numpy.save read back with exact values, and our writer produces the very
// bytes numpy.save writes for the same array.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "base/mmap_file.h"
#include "format/npy.h"
#include "format_test_util.h"

using namespace anvil;
using anvil_test::contains;
using nlohmann::json;

namespace {

const std::string kData = std::string(ANVIL_TEST_DATA) + "/format/";

json npy_reference() {
  Result<std::string> text = read_file(kData + "npy.json");
  EXPECT_TRUE(text.is_ok());
  return json::parse(*text);
}

}  // namespace

TEST(Npy, ReadsFilesWrittenByNumpy) {
  json ref = npy_reference();
  ASSERT_EQ(ref.size(), 6u);
  for (auto it = ref.begin(); it != ref.end(); ++it) {
    SCOPED_TRACE(it.key());
    auto a = read_npy(kData + it.key() + ".npy");
    ASSERT_TRUE(a.is_ok()) << a.status().message();
    EXPECT_EQ(a->descr, (*it)["descr"].get<std::string>());
    EXPECT_EQ(a->shape, (*it)["shape"].get<std::vector<int64_t>>());
    const json& vals = (*it)["values"];
    ASSERT_EQ(size_t(a->numel()), vals.size());
    std::vector<float> f = a->to_f32();
    for (size_t i = 0; i < vals.size(); ++i) {
      if (a->descr == "<f4") EXPECT_EQ(a->f32()[i], float(vals[i].get<double>()));
      if (a->descr == "<i4") EXPECT_EQ(a->i32()[i], vals[i].get<int64_t>());
      if (a->descr == "<i8") EXPECT_EQ(a->i64()[i], vals[i].get<int64_t>());
      if (a->descr == "<f2") EXPECT_EQ(f[i], float(vals[i].get<double>()));  // f16 -> f32 is exact
    }
  }
  auto a = read_npy(kData + "npy_i32.npy");
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(a->f32(), nullptr);  // typed views only for their own dtype
  EXPECT_NE(a->i32(), nullptr);
}

TEST(Npy, WriterMatchesNumpyBytes) {
  json ref = npy_reference();
  anvil_test::TempDir dir;
  for (const char* name : {"npy_f32", "npy_i32", "npy_scalar", "npy_empty"}) {
    SCOPED_TRACE(name);
    const json& r = ref[name];
    std::vector<int64_t> shape = r["shape"].get<std::vector<int64_t>>();
    std::string path = dir.file(std::string(name) + ".npy");
    if (r["descr"] == "<f4") {
      std::vector<float> v;
      for (const auto& x : r["values"]) v.push_back(float(x.get<double>()));
      ASSERT_TRUE(write_npy(path, v.data(), shape).is_ok());
    } else {
      std::vector<int32_t> v;
      for (const auto& x : r["values"]) v.push_back(int32_t(x.get<int64_t>()));
      ASSERT_TRUE(write_npy(path, v.data(), shape).is_ok());
    }
    EXPECT_EQ(anvil_test::read_bytes(path), anvil_test::read_bytes(kData + name + ".npy"));
  }
}

TEST(Npy, RoundTrip) {
  anvil_test::TempDir dir;
  std::vector<float> v = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  ASSERT_TRUE(write_npy(dir.file("a.npy"), v.data(), {3, 2}).is_ok());
  auto a = read_npy(dir.file("a.npy"));
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  EXPECT_EQ(a->shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(std::vector<float>(a->f32(), a->f32() + 6), v);
  EXPECT_FALSE(write_npy(dir.file("b.npy"), v.data(), {-1, 2}).is_ok());
}

TEST(Npy, RejectsBadFiles) {
  anvil_test::TempDir dir;
  auto bytes = anvil_test::read_bytes(kData + "npy_f32.npy");
  auto check = [&](std::vector<uint8_t> b, const std::string& needle) {
    std::string path = dir.file("bad.npy");
    anvil_test::write_bytes(path, b);
    auto r = read_npy(path);
    ASSERT_FALSE(r.is_ok()) << needle;
    EXPECT_TRUE(contains(r.status().message(), path)) << r.status().message();
    EXPECT_TRUE(contains(r.status().message(), needle)) << r.status().message();
  };
  auto with_header = [&](const std::string& from, const std::string& to) {
    std::string s(bytes.begin(), bytes.end());
    size_t p = s.find(from);
    EXPECT_NE(p, std::string::npos);
    s.replace(p, from.size(), to);
    return std::vector<uint8_t>(s.begin(), s.end());
  };
  std::vector<uint8_t> b = bytes;
  b[1] = 'X';
  check(b, "bad magic");
  b = bytes;
  b.pop_back();
  check(b, "needs 96");
  check(with_header("'fortran_order': False", "'fortran_order': True "), "fortran_order");
  check(with_header("'<f4'", "'>f4'"), "'>f4'");
  check(with_header("'descr'", "'dxscr'"), "unknown key");
  check(with_header("(2, 3, 4)", "(2, x, 4)"), "bad value for 'shape'");
  b = bytes;
  b[6] = 9;
  check(b, "version 9");
}
