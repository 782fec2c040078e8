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

int connection_socket(const std::string& remote_addr, int remote_port, int local_port) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const int fd = std::atoi(e.path().filename().c_str());
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;  // not a socket
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;   // not connected
    std::string lh, ph;
    int lp, pp;
    if (!host_port(local, ll, &lh, &lp) || lp != local_port) continue;
    if (!host_port(peer, pl, &ph, &pp) || pp != remote_port || ph != remote_addr) continue;
    return fd;
  }
  return -1;
}

std::vector<int> connection_sockets(int local_port) {
  std::vector<int> fds;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const int fd = std::atoi(e.path().filename().c_str());
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;  // not a socket
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;   // not connected (the listener)
    std::string lh;
    int lp;
    if (host_port(local, ll, &lh, &lp) && lp == local_port) fds.push_back(fd);
  }
  return fds;
}

bool peer_closed(int fd) {
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;  // a pipelined next request: still there
  if (n == 0) return true;  // EOF
  return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace anvil::server
