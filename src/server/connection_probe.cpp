#include "server/connection_probe.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <filesystem>

namespace anvil::server {

namespace {
// The numeric host and port of an address, as httplib formats remote_addr (getnameinfo NUMERICHOST).
bool host_port(const sockaddr_storage& ss, socklen_t len, std::string* host, int* port) {
  char h[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&ss), len, h, sizeof h, nullptr, 0, NI_NUMERICHOST) != 0)
    return false;
  *host = h;
  *port = ss.ss_family == AF_INET    ? ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port)
          : ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port)
                                     : -1;
  return true;
}
}  // namespace

namespace {

// Calls f(fd, local port, peer host, peer port) for each connected socket of this process (the
// listener, not connected, is left out), until f returns true.
template <typename F>
void scan_connected_sockets(F&& f) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const int fd = std::atoi(e.path().filename().c_str());
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;  // not a socket
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;   // not connected
    std::string lh, ph;
    int lp, pp;
    if (!host_port(local, ll, &lh, &lp) || !host_port(peer, pl, &ph, &pp)) continue;
    if (f(fd, lp, ph, pp)) return;
  }
}

}  // namespace

int connection_socket(const std::string& remote_addr, int remote_port, int local_port) {
  int found = -1;
  scan_connected_sockets([&](int fd, int lp, const std::string& ph, int pp) {
    if (lp != local_port || pp != remote_port || ph != remote_addr) return false;
    found = fd;
    return true;
  });
  return found;
}

std::vector<int> connection_sockets(int local_port) {
  std::vector<int> fds;
  scan_connected_sockets([&](int fd, int lp, const std::string&, int) {
    if (lp == local_port) fds.push_back(fd);
    return false;
  });
  return fds;
}

bool connection_gone(int fd, const std::string& remote_addr, int remote_port, int local_port) {
  sockaddr_storage local{}, peer{};
  socklen_t ll = sizeof local, pl = sizeof peer;
  std::string lh, ph;
  int lp = -1, pp = -1;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 || !host_port(local, ll, &lh, &lp) ||
      lp != local_port)
    return false;  // not a socket, or another one
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) return errno == ENOTCONN;  // reset
  if (!host_port(peer, pl, &ph, &pp) || ph != remote_addr || pp != remote_port) return false;
  return peer_closed(fd);
}

bool peer_closed(int fd) {
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;  // a pipelined next request: still there
  if (n == 0) return true;  // EOF
  return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace anvil::server
