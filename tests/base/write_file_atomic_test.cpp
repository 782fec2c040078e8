// write_file_atomic: concurrent writers of one path each use their own temporary, so every call
// succeeds and the file is always one writer's whole content, with no temporary left behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>
#include <vector>

#include <unistd.h>

#include "base/mmap_file.h"

namespace fs = std::filesystem;

TEST(WriteFileAtomic, ConcurrentWritersNeverMix) {
  const fs::path dir = fs::temp_directory_path() / ("anvil_wfa_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "f.bin").string();
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int w = 0; w < 4; ++w)
    ts.emplace_back([&, w] {
      std::vector<uint8_t> buf(size_t(1) << 18, uint8_t('a' + w));
      for (int i = 0; i < 10; ++i)
        if (!anvil::write_file_atomic(path, buf.data(), buf.size()).is_ok()) ++failures;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto text = anvil::read_file(path);
  ASSERT_TRUE(text.is_ok());
  ASSERT_EQ(text->size(), size_t(1) << 18);
  EXPECT_EQ(text->find_first_not_of((*text)[0]), std::string::npos) << "content of several writers mixed";
  int entries = 0;
  for (auto& e : fs::directory_iterator(dir)) entries += e.is_regular_file();
  EXPECT_EQ(entries, 1) << "a temporary was left behind";
  fs::remove_all(dir);
}
