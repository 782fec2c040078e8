// Property: no byte string makes the safetensors (or .npy) parser crash, read out of bounds or hand
// out a view outside its buffer. Each input is copied into an exactly-sized heap buffer so that
// AddressSanitizer (the CI runs this label under ASan+UBSan) catches any over-read.
#include <gtest/gtest.h>

#include <random>

#include "format/npy.h"
#include "format/safetensors.h"
#include "format_test_util.h"

using namespace anvil;

namespace {

const std::string kData = std::string(ANVIL_TEST_DATA) + "/format/";

// One random edit, biased to the header where the parser's decisions are made.
std::vector<uint8_t> mutate(const std::vector<uint8_t>& base, size_t header_end, std::mt19937& rng) {
  static const uint8_t kInteresting[] = {0x00, 0xff, 0x7f, 0x80, '0', '9', '-', '{', '}', '[', ']', '"', ',', ':', 'e', ' '};
  std::vector<uint8_t> b = base;
  auto pick = [&](size_t n) { return size_t(std::uniform_int_distribution<size_t>(0, n - 1)(rng)); };
  auto pos = [&]() { return pick(2) ? pick(std::min(header_end, b.size())) : pick(b.size()); };
  switch (pick(6)) {
    case 0: {  // flip bits
      for (size_t k = 0, n = 1 + pick(8); k < n && !b.empty(); ++k) b[pos()] ^= uint8_t(1u << pick(8));
      break;
    }
    case 1: {  // interesting bytes
      for (size_t k = 0, n = 1 + pick(4); k < n && !b.empty(); ++k) b[pos()] = kInteresting[pick(sizeof kInteresting)];
      break;
    }
    case 2:  // truncate
      b.resize(pick(b.size() + 1));
      break;
    case 3: {  // delete a run inside the header (the length prefix then disagrees with the JSON)
      size_t p = pos(), n = std::min(b.size() - p, 1 + pick(16));
      b.erase(b.begin() + long(p), b.begin() + long(p + n));
      break;
    }
    case 4: {  // duplicate a run of the header
      size_t p = pos(), n = std::min(b.size() - p, 1 + pick(32));
      std::vector<uint8_t> run(b.begin() + long(p), b.begin() + long(p + n));
      b.insert(b.begin() + long(pos()), run.begin(), run.end());
      break;
    }
    case 5: {  // rewrite the length prefix
      uint64_t n = pick(3) == 0 ? (uint64_t(rng()) << 32 | rng()) : uint64_t(pick(b.size() + 16));
      for (int i = 0; i < 8 && size_t(i) < b.size(); ++i) b[size_t(i)] = uint8_t(n >> (8 * i));
      break;
    }
  }
  return b;
}

}  // namespace

TEST(SafetensorsFuzz, RandomMutationsNeverCrash) {
  const std::vector<uint8_t> base = anvil_test::read_bytes(kData + "reference.safetensors");
  ASSERT_GT(base.size(), 8u);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | base[size_t(i)];
  std::mt19937 rng(20261129);
  int loaded = 0, rejected = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<uint8_t> m = mutate(base, size_t(8 + hlen), rng);
    auto buf = std::make_unique<uint8_t[]>(m.size());  // exact size: ASan flags any over-read
    std::copy(m.begin(), m.end(), buf.get());
    auto r = SafetensorsFile::parse(buf.get(), m.size(), "fuzz.safetensors");
    if (!r.is_ok()) {
      ++rejected;
      EXPECT_TRUE(anvil_test::contains(r.status().message(), "fuzz.safetensors")) << r.status().message();
      continue;
    }
    ++loaded;
    uint64_t sum = 0;
    for (const auto& t : (*r)->tensors()) {
      ASSERT_GE(t.data, buf.get());
      ASSERT_LE(t.data + t.nbytes, buf.get() + m.size()) << "iteration " << iter << " tensor " << t.name;
      ASSERT_EQ(t.nbytes, size_t(t.numel()) * dtype_size(t.dtype));
      for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];  // touch every byte
    }
    (void)sum;
  }
  // Both outcomes occur, else the mutator is not exercising the parser.
  EXPECT_GT(loaded, 50);
  EXPECT_GT(rejected, 500);
}

TEST(SafetensorsFuzz, EveryTruncationThroughTheFileIsRejected) {
  // A valid file cut at any length is an error (never a crash), read through mmap like real files.
  const std::vector<uint8_t> base = anvil_test::read_bytes(kData + "writer_match.safetensors");
  anvil_test::TempDir dir;
  const std::string path = dir.file("cut.safetensors");
  for (size_t n = 0; n < base.size(); ++n) {
    anvil_test::write_bytes(path, std::vector<uint8_t>(base.begin(), base.begin() + long(n)));
    auto r = SafetensorsFile::open(path);
    EXPECT_FALSE(r.is_ok()) << "length " << n;
  }
  anvil_test::write_bytes(path, base);
  EXPECT_TRUE(SafetensorsFile::open(path).is_ok());
}

TEST(NpyFuzz, RandomMutationsNeverCrash) {
  const std::vector<uint8_t> base = anvil_test::read_bytes(kData + "npy_f32.npy");
  std::mt19937 rng(7);
  int loaded = 0;
  for (int iter = 0; iter < 1000; ++iter) {
    std::vector<uint8_t> m = mutate(base, 128, rng);
    auto buf = std::make_unique<uint8_t[]>(m.size());
    std::copy(m.begin(), m.end(), buf.get());
    auto r = parse_npy(buf.get(), m.size(), "fuzz.npy");
    if (r.is_ok()) {
      ++loaded;
      EXPECT_EQ(r->to_f32().size(), size_t(r->numel()));  // reads numel * itemsize bytes
    } else {
      EXPECT_TRUE(anvil_test::contains(r.status().message(), "fuzz.npy"));
    }
  }
  EXPECT_GT(loaded, 10);
}
