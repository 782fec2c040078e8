#include "base/optional_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "base/mmap_file.h"

namespace anvil {

bool path_present(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

namespace {

std::string link_target(const std::string& path) {
  std::vector<char> buf(4096);
  const ssize_t n = ::readlink(path.c_str(), buf.data(), buf.size());
  return n < 0 ? std::string("?") : std::string(buf.data(), size_t(n));
}

}  // namespace

Result<std::optional<std::string>> read_optional_file(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::optional<std::string>();
    return io_error(path + ": cannot be examined: " + std::strerror(errno));
  }
  if (S_ISLNK(st.st_mode) && ::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT)
      return io_error(path + ": a symbolic link to '" + link_target(path) +
                      "', which does not exist (an interrupted download? fetch the file again, or remove the link)");
    return io_error(path + ": a symbolic link that cannot be followed: " + std::strerror(e));
  }
  if (S_ISDIR(st.st_mode)) return io_error(path + ": a directory, not a file");
  ANVIL_ASSIGN_OR_RETURN(std::string text, read_file(path));  // "PATH: cannot open: Permission denied"
  return std::optional<std::string>(std::move(text));
}

}  // namespace anvil
