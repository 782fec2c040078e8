// The model fingerprint covers every weight byte and the config: a byte changed anywhere in any
// tensor (not only near its start), or in config.json, gives another fingerprint; the same model
// loaded twice, from memory or from disk, gives the same one.
#include <gtest/gtest.h>

#include <filesystem>

#include "model/fingerprint.h"
#include "model/loader.h"
#include "model/synth.h"

using namespace anvil;
namespace fs = std::filesystem;

namespace {

std::unique_ptr<SynthModel> tiny() {
  auto m = synth_build(*synth_shape("tiny"), *parse_synth_quant("q4g64"), 1);
  EXPECT_TRUE(m.is_ok());
  return std::move(m).value();
}

Hash128 fp_of(const SynthModel& m, int threads) {
  std::vector<const TensorView*> ts;
  for (auto& t : m.tensors) ts.push_back(&t);
  ThreadPool pool(threads, 0);
  return model_fingerprint(m.config_json, ts, pool);
}

}  // namespace

TEST(Fingerprint, EveryByteCounts) {
  auto m = tiny();
  const Hash128 base = fp_of(*m, 2);
  EXPECT_EQ(base, fp_of(*m, 1));
  EXPECT_EQ(base, fp_of(*m, 16));  // independent of the thread count
  // The largest tensor (the embedding, several chunks): its first byte, one in the middle of a later
  // chunk, and its last byte.
  TensorView* big = &m->tensors[0];
  for (auto& t : m->tensors)
    if (t.nbytes > big->nbytes) big = &t;
  ASSERT_GT(big->nbytes, kFingerprintChunkBytes) << "want a tensor spanning several chunks";
  uint8_t* bytes = const_cast<uint8_t*>(big->data);
  for (size_t at : {size_t(0), kFingerprintChunkBytes + 12345, big->nbytes - 1}) {
    bytes[at] ^= 1;
    EXPECT_NE(fp_of(*m, 2), base) << "byte " << at << " of " << big->name;
    bytes[at] ^= 1;
  }
  // Every tensor's last byte (the old fingerprint sampled 64 bytes per tensor).
  for (auto& t : m->tensors) {
    uint8_t* p = const_cast<uint8_t*>(t.data) + t.nbytes - 1;
    *p ^= 0x80;
    EXPECT_NE(fp_of(*m, 2), base) << t.name;
    *p ^= 0x80;
  }
  EXPECT_EQ(fp_of(*m, 2), base);
  m->config_json += " ";
  EXPECT_NE(fp_of(*m, 2), base);
}

TEST(Fingerprint, SameOnDiskAndInMemoryAndChangesWithTheFile) {
  fs::path dir = fs::temp_directory_path() / ("anvil_fp_" + std::to_string(getpid()));
  fs::remove_all(dir);
  auto m = tiny();
  ASSERT_TRUE(synth_write(*m, dir.string(), "").is_ok());
  auto a = load_model(dir.string());
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  auto b = load_model(dir.string());
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ((*a)->fingerprint, (*b)->fingerprint);
  EXPECT_EQ((*a)->fingerprint, fp_of(*m, 2));
  EXPECT_FALSE((*a)->fingerprint.is_zero());
  fs::remove_all(dir);
}
