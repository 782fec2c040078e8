// Checkpoint::open: the three directory layouts (single file, index + shards, loose shards) and the
// errors a broken index must give (naming the shard file or the tensor).
#include <gtest/gtest.h>

#include "format_test_util.h"
#include "format/safetensors.h"

using namespace anvil;
using anvil_test::contains;
using anvil_test::TempDir;

namespace {

// Writes a shard holding F32 tensors `names`, each [2] = {i, -i}.
void write_shard(const std::string& path, const std::vector<std::string>& names) {
  SafetensorsWriter w;
  for (size_t i = 0; i < names.size(); ++i) {
    float v[2] = {float(i), -float(i)};
    ASSERT_TRUE(w.add(names[i], DType::kF32, {2}, v, sizeof v).is_ok());
  }
  ASSERT_TRUE(w.write_file(path).is_ok());
}

}  // namespace

TEST(Checkpoint, SingleModelSafetensors) {
  TempDir d;
  write_shard(d.file("model.safetensors"), {"a", "b"});
  write_shard(d.file("stray.safetensors"), {"c"});  // ignored: model.safetensors wins
  auto ck = Checkpoint::open(d.path());
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
  EXPECT_EQ((*ck)->names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ((*ck)->total_bytes(), 16u);
  ASSERT_NE((*ck)->find("b"), nullptr);
  EXPECT_EQ((*ck)->find("b")->file, d.file("model.safetensors"));
  EXPECT_EQ((*ck)->find("c"), nullptr);
}

TEST(Checkpoint, IndexWithShards) {
  TempDir d;
  write_shard(d.file("model-00001-of-00002.safetensors"), {"x.weight", "y.weight"});
  write_shard(d.file("model-00002-of-00002.safetensors"), {"z.weight"});
  anvil_test::write_text(d.file("model.safetensors.index.json"),
                         R"({"metadata": {"total_size": 24}, "weight_map": {
                              "x.weight": "model-00001-of-00002.safetensors",
                              "y.weight": "model-00001-of-00002.safetensors",
                              "z.weight": "model-00002-of-00002.safetensors"}})");
  auto ck = Checkpoint::open(d.path());
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
  EXPECT_EQ((*ck)->names(), (std::vector<std::string>{"x.weight", "y.weight", "z.weight"}));
  EXPECT_EQ((*ck)->find("z.weight")->file, d.file("model-00002-of-00002.safetensors"));
  EXPECT_EQ((*ck)->total_bytes(), 24u);
}

TEST(Checkpoint, IndexNamingMissingShard) {
  TempDir d;
  write_shard(d.file("model-00001-of-00002.safetensors"), {"x.weight"});
  anvil_test::write_text(d.file("model.safetensors.index.json"),
                         R"({"weight_map": {"x.weight": "model-00001-of-00002.safetensors",
                                            "z.weight": "model-00002-of-00002.safetensors"}})");
  auto ck = Checkpoint::open(d.path());
  ASSERT_FALSE(ck.is_ok());
  EXPECT_TRUE(contains(ck.status().message(), "model-00002-of-00002.safetensors")) << ck.status().message();
  EXPECT_TRUE(contains(ck.status().message(), "missing")) << ck.status().message();
}

TEST(Checkpoint, IndexTensorAbsentFromItsShard) {
  TempDir d;
  write_shard(d.file("model-00001-of-00002.safetensors"), {"x.weight"});
  write_shard(d.file("model-00002-of-00002.safetensors"), {"z.weight"});
  anvil_test::write_text(d.file("model.safetensors.index.json"),
                         R"({"weight_map": {"x.weight": "model-00001-of-00002.safetensors",
                                            "w.weight": "model-00002-of-00002.safetensors",
                                            "z.weight": "model-00002-of-00002.safetensors"}})");
  auto ck = Checkpoint::open(d.path());
  ASSERT_FALSE(ck.is_ok());
  EXPECT_TRUE(contains(ck.status().message(), "'w.weight'")) << ck.status().message();
  EXPECT_TRUE(contains(ck.status().message(), "model-00002-of-00002.safetensors")) << ck.status().message();
}

TEST(Checkpoint, IndexMalformed) {
  TempDir d;
  anvil_test::write_text(d.file("model.safetensors.index.json"), R"({"weight_map": [1, 2]})");
  auto ck = Checkpoint::open(d.path());
  ASSERT_FALSE(ck.is_ok());
  EXPECT_TRUE(contains(ck.status().message(), "weight_map")) << ck.status().message();
  anvil_test::write_text(d.file("model.safetensors.index.json"), R"({"weight_map": )");
  ck = Checkpoint::open(d.path());
  ASSERT_FALSE(ck.is_ok());
  EXPECT_TRUE(contains(ck.status().message(), "model.safetensors.index.json")) << ck.status().message();
}

TEST(Checkpoint, IndexShardOutsideDirectoryRejected) {
  TempDir d;
  anvil_test::write_text(d.file("model.safetensors.index.json"), R"({"weight_map": {"x": "../evil.safetensors"}})");
  auto ck = Checkpoint::open(d.path());
  ASSERT_FALSE(ck.is_ok());
  EXPECT_TRUE(contains(ck.status().message(), "../evil.safetensors")) << ck.status().message();
}

TEST(Checkpoint, LooseShardsSortedAndDuplicateNamesRejected) {
  TempDir d;
  write_shard(d.file("b.safetensors"), {"t2"});
  write_shard(d.file("a.safetensors"), {"t1"});
  anvil_test::write_text(d.file("notes.txt"), "not a shard");
  auto ck = Checkpoint::open(d.path());
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
  EXPECT_EQ((*ck)->names(), (std::vector<std::string>{"t1", "t2"}));

  write_shard(d.file("c.safetensors"), {"t1"});
  ck = Checkpoint::open(d.path());
  ASSERT_FALSE(ck.is_ok());
  EXPECT_TRUE(contains(ck.status().message(), "'t1'")) << ck.status().message();
  EXPECT_TRUE(contains(ck.status().message(), "a.safetensors")) << ck.status().message();
  EXPECT_TRUE(contains(ck.status().message(), "c.safetensors")) << ck.status().message();
}

TEST(Checkpoint, NoSafetensorsInDirectory) {
  TempDir d;
  auto ck = Checkpoint::open(d.path());
  ASSERT_FALSE(ck.is_ok());
  EXPECT_EQ(ck.status().message(), "no *.safetensors in " + d.path());
  ck = Checkpoint::open(d.file("does-not-exist"));
  ASSERT_FALSE(ck.is_ok());
  EXPECT_TRUE(contains(ck.status().message(), "does-not-exist"));
}

TEST(Checkpoint, CorruptShardErrorNamesTheFile) {
  TempDir d;
  anvil_test::write_bytes(d.file("model.safetensors"), anvil_test::raw_safetensors("{bad", 0));
  auto ck = Checkpoint::open(d.path());
  ASSERT_FALSE(ck.is_ok());
  EXPECT_TRUE(contains(ck.status().message(), d.file("model.safetensors"))) << ck.status().message();
}

TEST(Checkpoint, OpensTheSharedTinyModel) {
  const std::string dir = std::string(ANVIL_SHARED_DIR) + "/fixtures/anvil-tiny-code";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " not present";
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.is_ok()) << ck.status().message();
  const TensorView* emb = (*ck)->find("model.embed_tokens.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dtype, DType::kBF16);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{8192, 384}));
}
