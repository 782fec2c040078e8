#include "server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

namespace anvil::test {

ServerProcess::ServerProcess(const std::vector<std::string>& args) {
  // A client writing to a connection the server closed (a refused body) must get EPIPE, not die.
  ::signal(SIGPIPE, SIG_IGN);
  int p[2];
  if (pipe(p) != 0) return;
  pid_ = fork();
  if (pid_ == 0) {
    // The server goes when the test process does, even if that one dies: left running, it would
    // hold ctest's output pipe open and hang the whole run.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(p[1], 1);
    ::close(p[0]);
    ::close(p[1]);
    // The CPU backend: these tests assert its numerical contract (a stream equals the same request
    // served alone, bit for bit), which the CUDA backend does not promise yet.
    std::vector<std::string> all = {ANVIL_BINARY, "serve", "--device", "cpu"};
    all.insert(all.end(), args.begin(), args.end());
    all.push_back("--port");
    all.push_back("0");
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  ::close(p[1]);
  out_fd_ = p[0];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd pf{out_fd_, POLLIN, 0};
    if (poll(&pf, 1, 200) > 0) {
      char b[512];
      ssize_t n = read(out_fd_, b, sizeof b);
      if (n <= 0) break;
      out_.append(b, size_t(n));
      auto at = out_.find("listening on http://");
      auto nl = at == std::string::npos ? std::string::npos : out_.find('\n', at);
      if (nl != std::string::npos) {
        port_ = std::atoi(out_.c_str() + out_.rfind(':', nl) + 1);
        return;
      }
    }
    int st;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      break;
    }
  }
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int st;
    waitpid(pid_, &st, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
}

int ServerProcess::terminate(double timeout_s) {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    int st;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

RawConnection::RawConnection(int port) {
  fd_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) close();
}

RawConnection::~RawConnection() { close(); }

bool RawConnection::send_all(const std::string& d) {
  size_t off = 0;
  while (fd_ >= 0 && off < d.size()) {
    ssize_t n = ::send(fd_, d.data() + off, d.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += size_t(n);
  }
  return fd_ >= 0;
}

std::string RawConnection::read_until(const std::string& needle, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (fd_ >= 0 && buf_.find(needle) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    pollfd pf{fd_, POLLIN, 0};
    if (poll(&pf, 1, 50) <= 0) continue;
    char b[4096];
    ssize_t n = recv(fd_, b, sizeof b, 0);
    if (n <= 0) break;
    buf_.append(b, size_t(n));
  }
  return buf_;
}

bool RawConnection::wait_closed(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (fd_ >= 0 && std::chrono::steady_clock::now() < deadline) {
    pollfd pf{fd_, POLLIN, 0};
    if (poll(&pf, 1, 50) <= 0) continue;
    char b[4096];
    ssize_t n = recv(fd_, b, sizeof b, 0);
    if (n <= 0) return true;  // EOF (or a reset): closed
    buf_.append(b, size_t(n));
  }
  return false;
}

void RawConnection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void RawConnection::reset() {
  if (fd_ < 0) return;
  const linger l{1, 0};
  setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  close();
}

std::pair<int, std::string> run_python_check(const std::string& script, int port, const std::vector<std::string>& args) {
  std::string cmd = "python3 " + std::string(ANVIL_SOURCE_DIR) + "/tests/server/" + script + " http://127.0.0.1:" +
                    std::to_string(port);
  for (auto& a : args) cmd += " " + a;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  char b[4096];
  size_t n;
  while ((n = fread(b, 1, sizeof b, p)) > 0) out.append(b, n);
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

std::string tiny_with_template(const std::string& tag) {
  namespace fs = std::filesystem;
  const std::string src = std::string(ANVIL_SHARED_DIR) + "/fixtures/anvil-tiny-code";
  if (!fs::exists(src + "/model.safetensors")) return "";
  const std::string dir = (fs::temp_directory_path() / ("anvil_" + tag + "_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"})
    fs::create_symlink(src + "/" + f, dir + "/" + f);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src + "/tokenizer_config.json"));
  cfg["chat_template"] =
      "{% for m in messages %}# {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
      "{% if add_generation_prompt %}answer = {% endif %}";
  std::ofstream(dir + "/tokenizer_config.json") << cfg.dump();
  return dir;
}

}  // namespace anvil::test
