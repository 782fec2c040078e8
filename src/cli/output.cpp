#include "cli/output.h"

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace anvil::cli {
namespace {

int g_output_errno = 0;  // the first failed write's errno; 0 while none failed, -1: cause unknown

// The cause of a failure that stdio already flagged (an implicit flush inside printf) but whose
// errno is gone: a pipe or socket with no reader left polls as POLLERR; otherwise unknown (-1).
int probe_cause() {
  struct stat st;
  if (fstat(STDOUT_FILENO, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) {
    struct pollfd p = {STDOUT_FILENO, POLLOUT, 0};
    if (poll(&p, 1, 0) == 1 && (p.revents & POLLERR)) return EPIPE;
  }
  return -1;
}

}  // namespace

void watch_output() { ::signal(SIGPIPE, SIG_IGN); }

bool output_ok() {
  if (g_output_errno != 0) return false;
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  if (flushed && !std::ferror(stdout)) return true;
  g_output_errno = !flushed && errno != 0 ? errno : probe_cause();
  return false;
}

int finish_output(int code) {
  if (output_ok()) return code;
  const bool reported = code != 0 && code != 130;
  if (g_output_errno == EPIPE) return reported ? code : 141;
  std::fprintf(stderr, "anvil: error: cannot write the output: %s\n",
               g_output_errno > 0 ? std::strerror(g_output_errno) : "a write to standard output failed");
  return reported ? code : 1;
}

}  // namespace anvil::cli
