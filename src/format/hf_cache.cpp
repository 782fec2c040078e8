// -m resolution: an existing directory, else a repo id looked up in the local Hugging Face hub cache.
// Every path examined is recorded so a failure tells the user exactly where we looked.
#include "format/hf_cache.h"

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "base/mmap_file.h"

namespace anvil {

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// The one hub cache directory the Hugging Face libraries would use, with the variable it came from.
std::string hub_cache_dir(std::string* source) {
  if (std::string v = env("HF_HUB_CACHE"); !v.empty()) {
    *source = "$HF_HUB_CACHE";
    return v;
  }
  if (std::string v = env("HF_HOME"); !v.empty()) {
    *source = "$HF_HOME/hub";
    return (fs::path(v) / "hub").string();
  }
  if (std::string v = env("XDG_CACHE_HOME"); !v.empty()) {
    *source = "$XDG_CACHE_HOME/huggingface/hub";
    return (fs::path(v) / "huggingface" / "hub").string();
  }
  *source = "~/.cache/huggingface/hub";
  std::string home = env("HOME");
  if (home.empty()) return "";
  return (fs::path(home) / ".cache" / "huggingface" / "hub").string();
}

// "org/name" or "name": no empty parts, no "." / ".." parts, at most one slash.
bool looks_like_repo_id(const std::string& s) {
  if (s.empty() || s.front() == '/' || s.back() == '/') return false;
  size_t slash = s.find('/');
  if (slash != std::string::npos && s.find('/', slash + 1) != std::string::npos) return false;
  for (const auto& part : fs::path(s))
    if (part == "." || part == ".." || part.empty()) return false;
  return true;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  return s.substr(i);
}

}  // namespace

Result<std::string> resolve_model_path(const std::string& arg) {
  std::vector<std::string> looked;
  std::error_code ec;
  auto fail = [&](const std::string& why) {
    std::string msg = "model '" + arg + "' not found" + (why.empty() ? "" : " (" + why + ")") + "; looked at:";
    for (const auto& l : looked) msg += "\n  " + l;
    return not_found(msg);
  };

  if (arg.empty()) return invalid_argument("model path is empty");
  if (fs::is_directory(arg, ec)) return arg;
  looked.push_back(arg + " (" + (fs::exists(arg, ec) ? "not a directory" : "does not exist") + ")");
  if (!looks_like_repo_id(arg)) return fail("");

  std::string source;
  const std::string hub = hub_cache_dir(&source);
  if (hub.empty()) {
    looked.push_back(source + " ($HOME is not set)");
    return fail("");
  }
  std::string repo_dir_name = "models--";  // "org/name" -> "models--org--name"
  for (char ch : arg) repo_dir_name += ch == '/' ? std::string("--") : std::string(1, ch);
  const fs::path repo = fs::path(hub) / repo_dir_name;
  if (!fs::is_directory(repo, ec)) {
    looked.push_back(repo.string() + " (from " + source + "; does not exist)");
    return fail("not in the Hugging Face cache; download it first, e.g. `hf download " + arg + "`");
  }

  const fs::path snapshots = repo / "snapshots";
  const fs::path ref = repo / "refs" / "main";
  if (fs::is_regular_file(ref, ec)) {
    Result<std::string> hash = read_file(ref.string());
    if (!hash.is_ok()) {
      looked.push_back(ref.string() + " (unreadable)");
      return fail("");
    }
    const fs::path snap = snapshots / trim(*hash);
    if (trim(*hash).empty() || !fs::is_directory(snap, ec)) {
      looked.push_back(ref.string() + " (names commit '" + trim(*hash) + "')");
      looked.push_back(snap.string() + " (does not exist)");
      return fail("the cache entry is incomplete");
    }
    return snap.string();
  }
  looked.push_back(ref.string() + " (does not exist; using the newest snapshot)");

  // No refs/main (e.g. only a revision was downloaded): the most recently written snapshot.
  fs::path best;
  fs::file_time_type best_time{};
  if (fs::is_directory(snapshots, ec)) {
    for (const auto& e : fs::directory_iterator(snapshots, ec)) {
      if (!e.is_directory(ec)) continue;
      auto t = fs::last_write_time(e.path(), ec);
      if (ec) continue;
      if (best.empty() || t > best_time || (t == best_time && e.path().filename() > best.filename())) {
        best = e.path();
        best_time = t;
      }
    }
  }
  if (best.empty()) {
    looked.push_back(snapshots.string() + " (no snapshot directories)");
    return fail("the cache entry is incomplete");
  }
  return best.string();
}

}  // namespace anvil
