#include "cli/interrupt.h"

#include <signal.h>

#include <atomic>
#include <cstring>

namespace anvil::cli {
namespace {
std::atomic<bool> g_interrupted{false};
void on_sigint(int) { g_interrupted = true; }
}  // namespace

void install_sigint_handler() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigaction(SIGINT, &sa, nullptr);
}

bool interrupted() { return g_interrupted; }
void clear_interrupted() { g_interrupted = false; }

}  // namespace anvil::cli
