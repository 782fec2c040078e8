// Runs `anvil serve` as a child process on a loopback port for the HTTP tests.
#pragma once
#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace anvil::test {

class ServerProcess {
 public:
  // Starts ANVIL_BINARY serve ARGS --port 0 and waits (up to 60 s) for its "listening on" line.
  explicit ServerProcess(const std::vector<std::string>& args);
  ~ServerProcess();  // SIGKILL if still running
  bool ok() const { return port_ > 0; }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& startup_output() const { return out_; }
  // Sends SIGTERM and waits up to timeout_s; returns the exit status (or -1 on timeout/signal).
  int terminate(double timeout_s);

 private:
  pid_t pid_ = -1;
  int port_ = -1;
  int out_fd_ = -1;
  std::string out_;
};

// A raw loopback connection: send bytes, read what arrives, close early (a client that goes away).
class RawConnection {
 public:
  explicit RawConnection(int port);
  ~RawConnection();
  bool send_all(const std::string& data);
  // Reads until `needle` has been seen or timeout; returns everything read.
  std::string read_until(const std::string& needle, double timeout_s);
  // Reads (keeping what arrives) until the peer closes the connection: true, or false when it is
  // still open after timeout_s.
  bool wait_closed(double timeout_s);
  void close();
  // Closes as a client does that leaves unread data behind (SO_LINGER 0): the peer gets a reset,
  // not an end of stream, and its socket is no longer connected.
  void reset();

 private:
  int fd_ = -1;
  std::string buf_;
};

// Runs python3 tests/server/SCRIPT http://127.0.0.1:PORT ARGS... against a running server: its exit
// status (77: "cannot run here") and its output, stdout and stderr together.
std::pair<int, std::string> run_python_check(const std::string& script, int port, const std::vector<std::string>& args);

// The shared tiny trained model in a temporary directory named after `tag`, its files linked, with
// a plain chat template beside it (its own tokenizer_config.json has none); "" without
// ANVIL_SHARED_DIR's fixture. The caller removes the directory.
std::string tiny_with_template(const std::string& tag);

}  // namespace anvil::test
