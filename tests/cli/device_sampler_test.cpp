// ANVIL_CUDA_DEVICE_SAMPLER=1 on the CLI: `anvil generate` samples through Engine::decode_sample and
// the backend's sample_rows (on the CPU backend: the reference op) and prints the same seeded ids as
// the host Sampler path. The CUDA twin of this test is tests/cuda/cuda_sample_model_test.cpp.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"

namespace anvil::test {
namespace {

std::vector<int32_t> ids(bool on, const std::vector<std::string>& sampling) {
  std::vector<std::string> args = {"generate", "--device", "cpu", "--synthetic", "tiny:q4g64", "--ids", "1,2,3",
                                   "-n", "12", "--ignore-eos", "--json"};
  args.insert(args.end(), sampling.begin(), sampling.end());
  auto r = run_shell(std::string("ANVIL_CUDA_DEVICE_SAMPLER=") + (on ? "1 " : "0 ") + anvil_command(args) +
                     " 2>/dev/null");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  if (j.is_discarded() || !j.contains("ids")) return {};
  return j["ids"].get<std::vector<int32_t>>();
}

TEST(DeviceSampler, SeededCliOutputUnchangedBySwitch) {
  for (const auto& s : std::vector<std::vector<std::string>>{
           {"--temp", "0.8", "--top-k", "40", "--top-p", "0.9", "--repeat-penalty", "1.3", "--seed", "7"},
           {"--temp", "1.1", "--min-p", "0.05", "--seed", "9"}}) {
    const auto off = ids(false, s), on = ids(true, s);
    EXPECT_EQ(off.size(), 12u);
    EXPECT_EQ(on, off) << s[1];
  }
}

}  // namespace
}  // namespace anvil::test
