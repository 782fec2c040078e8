// Finds out whether the client of a non-streaming request is still there. cpp-httplib 0.11 (the
// Debian package) does not give a handler its socket, so connection_socket() finds it among this
// process's descriptors by the request's addresses (local port + peer address and port identify a
// TCP connection); peer_closed() then peeks at it without consuming anything. Nor does it close its
// connections when it stops: connection_sockets() finds them all, for the server's shutdown.
#pragma once
#include <string>
#include <vector>

namespace anvil::server {

// The socket of the connection from remote_addr:remote_port to local_port, or -1. The descriptor
// stays valid while the request's handler runs (httplib closes it after the handler returns).
int connection_socket(const std::string& remote_addr, int remote_port, int local_port);
// True when the peer has closed the connection (EOF or an error). A client that half-closes its
// side after sending the request counts as gone: HTTP clients do not do that.
bool peer_closed(int fd);
// True when `fd`, found by connection_socket() for the same addresses while the connection was up,
// is that connection and its peer has gone: closed it, or reset it (a client that closes with a
// reply's bytes unread resets; the socket is then no longer connected, and connection_socket()
// cannot find it any more). False when `fd` is now another socket or the peer is still there.
bool connection_gone(int fd, const std::string& remote_addr, int remote_port, int local_port);
// Every connected socket of this process whose local port is local_port: the server's accepted
// connections (a client of the server in this process has another local port). The descriptors
// are only a snapshot: the HTTP threads close theirs at any time (shutdown() on a number that has
// gone, or now names a file, fails harmlessly).
std::vector<int> connection_sockets(int local_port);

}  // namespace anvil::server
