#include "cli/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace anvil::cli {
namespace {
std::atomic<bool> g_interrupted{false};
// A second Ctrl-C before the first was acted on (a prefill chunk or a forward can take seconds on a
// CPU) leaves at once, as a user pressing it twice means: nothing is lost that the store reported
// durable (it survives kill -9), and a session keeps its last committed state.
void on_sigint(int) {
  if (g_interrupted.exchange(true)) {
    static const char msg[] = "\n[anvil] interrupted again: exiting now\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(130);
  }
}
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
