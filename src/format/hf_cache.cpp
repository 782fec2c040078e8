// -m resolution: an existing directory, else a repo id looked up in the local Hugging Face hub cache
// the way huggingface_hub looks offline (snapshot_download(local_files_only=True)). Every path
// examined is recorded so a failure tells the user exactly where we looked.
#include "format/hf_cache.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "base/mmap_file.h"

namespace anvil {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A variable that is set, even to "", is used as is: huggingface_hub reads them with os.getenv(name, default).
std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::optional<std::string>(v) : std::nullopt;
}

// Python's os.path.join(a, b) for one component.
std::string py_join(const std::string& a, const std::string& b) {
  if (!b.empty() && b.front() == '/') return b;
  if (a.empty() || a.back() == '/') return a + b;
  return a + "/" + b;
}

// The home directory of the user (`name` empty: this process's user) from the password database.
std::optional<std::string> passwd_home(const std::string& name) {
  long size = sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(size > 0 ? size_t(size) : 16384);
  struct passwd pw, *found = nullptr;
  int rc = name.empty() ? getpwuid_r(getuid(), &pw, buf.data(), buf.size(), &found)
                        : getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &found);
  if (rc != 0 || !found || !found->pw_dir) return std::nullopt;
  return std::string(found->pw_dir);
}

// Python's os.path.expanduser: "~" and "~/x" from $HOME (the password database when HOME is unset),
// "~user/x" from that user's entry; left as is when the user is unknown.
std::string expand_user(const std::string& p) {
  if (p.empty() || p.front() != '~') return p;
  size_t end = p.find('/', 1);
  if (end == std::string::npos) end = p.size();
  std::optional<std::string> home;
  if (end == 1) home = env("HOME") ? env("HOME") : passwd_home("");
  else home = passwd_home(p.substr(1, end - 1));
  if (!home) return p;
  while (!home->empty() && home->back() == '/') home->pop_back();
  std::string out = *home + p.substr(end);
  return out.empty() ? "/" : out;
}

bool is_word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Python's posixpath.expandvars: $NAME (NAME of [A-Za-z0-9_]) and ${NAME} are replaced by the
// variable's value when it is set; anything else stays. A value is not expanded again.
std::string expand_vars(std::string p) {
  size_t i = 0;
  while ((i = p.find('$', i)) != std::string::npos) {
    size_t j = i + 1;
    std::string name;
    if (j < p.size() && p[j] == '{') {
      size_t close = p.find('}', j + 1);
      if (close == std::string::npos) { ++i; continue; }
      name = p.substr(j + 1, close - j - 1);
      j = close + 1;
    } else {
      while (j < p.size() && is_word_char(p[j])) ++j;
      name = p.substr(i + 1, j - i - 1);
    }
    const char* value = name.empty() || name.find('=') != std::string::npos ? nullptr : std::getenv(name.c_str());
    if (!value) {
      i = name.empty() ? i + 1 : j;
      continue;
    }
    p = p.substr(0, i) + value + p.substr(j);
    i += std::strlen(value);
  }
  return p;
}

std::string os_path_expand(const std::string& p) { return expand_vars(expand_user(p)); }

// "abc\n" -> "abc" (huggingface_hub writes refs without a newline; an editor may add one).
std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

bool is_hex(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}
bool is_full_commit(const std::string& s) { return s.size() == 40 && is_hex(s); }
// The shortest abbreviated commit accepted, as git's.
constexpr size_t kMinCommitPrefix = 4;

// A ref name may hold '/' (refs/pr/1 is stored as refs/refs/pr/1) but must stay inside refs/.
bool is_safe_ref_name(const std::string& s) {
  if (s.empty() || s.front() == '/' || s.find('\0') != std::string::npos) return false;
  for (const auto& part : fs::path(s))
    if (part.empty() || part == "." || part == "..") return false;
  return s.back() != '/';
}

// What a ref file names: one path component (a commit hash, as huggingface_hub writes it).
bool is_safe_commit_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos && s.find('\0') == std::string::npos;
}

// Every ref under refs/ ("main", "v1.0", "refs/pr/1") with the commit it names, sorted.
std::vector<std::pair<std::string, std::string>> cached_refs(const fs::path& refs) {
  std::vector<std::pair<std::string, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(refs, ec)) return out;
  for (auto it = fs::recursive_directory_iterator(refs, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    Result<std::string> text = read_file(it->path().string());
    out.emplace_back(fs::relative(it->path(), refs, ec).string(), text.is_ok() ? trim(*text) : "(unreadable)");
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> cached_snapshots(const fs::path& snapshots) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(snapshots, ec)) return out;
  for (const auto& e : fs::directory_iterator(snapshots, ec))
    if (e.is_directory(ec)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// "refs main -> abc..., v1 -> def...; snapshots abc..., def..." for an error that asks for --revision.
std::string cache_contents(const fs::path& repo) {
  std::string refs, snaps;
  for (const auto& [name, commit] : cached_refs(repo / "refs"))
    refs += (refs.empty() ? "" : ", ") + name + " -> " + commit;
  for (const auto& s : cached_snapshots(repo / "snapshots")) snaps += (snaps.empty() ? "" : ", ") + s;
  return "cached refs: " + (refs.empty() ? std::string("none") : refs) +
         "; cached snapshots: " + (snaps.empty() ? std::string("none") : snaps);
}

// Whether `needs` makes anvil read the top-level file `name` of a model directory.
bool reads_file(const std::string& name, ModelFiles needs) {
  static const std::set<std::string> kTokenizer = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                                   "chat_template.json"};
  static const std::set<std::string> kModel = {"config.json", "generation_config.json", "model.safetensors.index.json"};
  if (kTokenizer.count(name)) return true;
  if (needs != ModelFiles::kModel) return false;
  return kModel.count(name) || (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0);
}

std::string bytes_of(const fs::path& p) {
  std::error_code ec;
  auto n = fs::file_size(p, ec);
  return ec ? std::string("?") : std::to_string(n);
}

// What is missing from the snapshot `snap` (commit `commit`) of the cached repo `repo` among the files
// `needs` reads: one line per file, empty when nothing is.
std::vector<std::string> incomplete_files(const fs::path& repo, const fs::path& snap, const std::string& commit,
                                          ModelFiles needs) {
  std::vector<std::string> lines;
  std::set<std::string> reported;
  std::error_code ec;
  // A link to a blob that is not there: the blob was deleted, or the cache was copied in part.
  for (const auto& e : fs::directory_iterator(snap, ec)) {
    const std::string name = e.path().filename().string();
    std::error_code fe;
    if (!e.is_symlink(fe) || fs::exists(e.path(), fe) || !reads_file(name, needs)) continue;
    const fs::path target = fs::read_symlink(e.path(), fe);
    const fs::path blob = (target.is_absolute() ? target : (snap / target)).lexically_normal();
    std::string line = name + ": a link to " + target.string() + ", which does not exist";
    fs::path partial = blob;
    partial += ".incomplete";
    if (fs::exists(partial, fe))
      line += " (" + partial.string() + " holds " + bytes_of(partial) + " bytes of an interrupted download)";
    lines.push_back(line);
    reported.insert(name);
  }
  // What huggingface_hub wrote down about this commit: every file of the repo, with the blob it is stored as.
  json tree;
  const fs::path tree_path = repo / "trees" / (commit + ".json");
  if (fs::is_regular_file(tree_path, ec)) {
    Result<std::string> text = read_file(tree_path.string());
    if (text.is_ok()) {
      json t = json::parse(*text, nullptr, /*allow_exceptions=*/false);
      if (t.is_object() && t.contains("format_version") && t["format_version"].is_number_integer() &&
          t["format_version"].get<int64_t>() == 1 && t.contains("files") && t["files"].is_object())
        tree = t["files"];
    }
  }
  auto missing = [&](const std::string& name, const std::string& why) {
    std::error_code fe;
    if (reported.count(name) || fs::exists(snap / name, fe) || fs::is_symlink(snap / name, fe)) return;
    std::string line = name + ": " + why;
    // The blob a download writes is named by the file's LFS sha256, else its git blob id.
    if (tree.is_object() && tree.contains(name) && tree[name].is_object()) {
      const json& f = tree[name];
      std::string blob = f.contains("lfs_sha256") && f["lfs_sha256"].is_string() ? f["lfs_sha256"].get<std::string>()
                         : f.contains("blob_id") && f["blob_id"].is_string() ? f["blob_id"].get<std::string>()
                                                                             : "";
      if (is_safe_commit_name(blob)) {
        const fs::path partial = repo / "blobs" / (blob + ".incomplete");
        if (fs::exists(partial, fe)) {
          line += " (" + partial.string() + " holds " + bytes_of(partial) + " of its ";
          const bool sized = f.contains("size") && f["size"].is_number_unsigned();
          line += sized ? std::to_string(f["size"].get<uint64_t>()) : "?";
          line += " bytes: an interrupted download)";
        }
      }
    }
    lines.push_back(line);
    reported.insert(name);
  };
  if (needs == ModelFiles::kModel) {
    const fs::path index = snap / "model.safetensors.index.json";
    if (fs::is_regular_file(index, ec)) {
      Result<std::string> text = read_file(index.string());
      json j = text.is_ok() ? json::parse(*text, nullptr, false) : json();
      if (j.is_object() && j.contains("weight_map") && j["weight_map"].is_object()) {
        std::set<std::string> shards;
        for (const auto& v : j["weight_map"])
          if (v.is_string() && is_safe_commit_name(v.get<std::string>())) shards.insert(v.get<std::string>());
        for (const auto& s : shards) missing(s, "a shard model.safetensors.index.json names, not in the snapshot");
      }
    }
  }
  if (tree.is_object()) {
    for (auto it = tree.begin(); it != tree.end(); ++it) {
      const std::string& name = it.key();
      if (name.find('/') != std::string::npos || !reads_file(name, needs)) continue;
      // Weight shards beyond model.safetensors are judged by the index (a repo may also hold weights
      // in other layouts, e.g. consolidated.safetensors, that a download may leave out on purpose).
      if (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0 && name != "model.safetensors")
        continue;
      missing(name, "in the repo at this commit (" + tree_path.string() + ") but not in the snapshot");
    }
  }
  return lines;
}

}  // namespace

HubCacheDir hub_cache_dir() {
  // constants.py: HF_HOME, then HUGGINGFACE_HUB_CACHE (legacy) defaulting to HF_HOME/hub, then
  // HF_HUB_CACHE defaulting to that; both expanded with expanduser, then expandvars.
  HubCacheDir d;
  std::string home_source;
  std::string hf_home;
  if (auto v = env("HF_HOME")) {
    hf_home = *v;
    home_source = "$HF_HOME" + std::string(v->empty() ? " (set but empty)" : "") + "/hub";
  } else if (auto x = env("XDG_CACHE_HOME")) {
    hf_home = py_join(*x, "huggingface");
    home_source = "$XDG_CACHE_HOME" + std::string(x->empty() ? " (set but empty)" : "") + "/huggingface/hub";
  } else {
    hf_home = py_join(py_join(expand_user("~"), ".cache"), "huggingface");
    home_source = "~/.cache/huggingface/hub";
  }
  hf_home = os_path_expand(hf_home);
  std::string hub;
  if (auto v = env("HF_HUB_CACHE")) {
    hub = *v;
    d.source = "$HF_HUB_CACHE" + std::string(v->empty() ? " (set but empty)" : "");
  } else if (auto l = env("HUGGINGFACE_HUB_CACHE")) {
    hub = *l;
    d.source = "$HUGGINGFACE_HUB_CACHE" + std::string(l->empty() ? " (set but empty)" : "");
  } else {
    hub = py_join(hf_home, "hub");
    d.source = home_source;
  }
  d.path = os_path_expand(hub);
  if (d.path.empty() || d.path.front() != '/') d.source += ", relative to the current directory";
  return d;
}

std::string repo_id_problem(const std::string& id) {
  const std::string rule = "a Hugging Face repo id is NAME or NAMESPACE/NAME, each 1 to 96 of A-Z a-z 0-9 _ . -, "
                           "beginning and ending with a letter, digit or _";
  size_t slash = id.find('/');
  if (slash != std::string::npos && id.find('/', slash + 1) != std::string::npos) return "more than one '/': " + rule;
  std::vector<std::string> parts;
  if (slash == std::string::npos) parts = {id};
  else parts = {id.substr(0, slash), id.substr(slash + 1)};
  for (const auto& p : parts) {
    if (p.empty() || p.size() > 96) return (p.empty() ? "an empty part: " : "a part longer than 96 characters: ") + rule;
    for (char c : p)
      if (!is_word_char(c) && c != '-' && c != '.') return std::string("the character '") + c + "': " + rule;
    if (!is_word_char(p.front()) || !is_word_char(p.back())) return "a part begins or ends with '-' or '.': " + rule;
  }
  if (id.find("--") != std::string::npos || id.find("..") != std::string::npos)
    return "it holds \"--\" or \"..\", which huggingface_hub refuses (\"--\" separates the parts of the cache "
           "folder's name)";
  if (id.size() >= 4 && id.compare(id.size() - 4, 4, ".git") == 0) return "it ends in \".git\"";
  return "";
}

Result<std::string> resolve_model_path(const std::string& arg, const std::string& revision, ModelFiles needs) {
  std::vector<std::string> looked;
  std::error_code ec;
  const std::string rev_label = revision.empty() ? std::string("main") : revision;
  auto fail = [&](const std::string& why) {
    std::string msg = "model '" + arg + "'" + (revision.empty() ? "" : " at revision '" + revision + "'") +
                      " not found" + (why.empty() ? "" : " (" + why + ")") + "; looked at:";
    for (const auto& l : looked) msg += "\n  " + l;
    return not_found(msg);
  };

  if (arg.empty()) return invalid_argument("model path is empty");
  if (fs::is_directory(arg, ec)) {
    if (!revision.empty())
      return invalid_argument("--revision " + revision + " selects a revision of a Hugging Face repo id, but '" + arg +
                              "' is a directory, which is used as it is (to use the cached repo instead, run from a directory "
                              "where '" + arg + "' does not exist)");
    return arg;
  }
  looked.push_back(arg + " (" + (fs::exists(arg, ec) ? "not a directory" : "does not exist") + ")");
  if (std::string why = repo_id_problem(arg); !why.empty()) {
    // "org/name@rev" (llama.cpp's and some tools' spelling) is a repo id and a revision.
    if (size_t at = arg.rfind('@'); at != std::string::npos && repo_id_problem(arg.substr(0, at)).empty())
      return fail("not a directory, nor a repo id: '@' is not part of one; for a revision, write -m " +
                  arg.substr(0, at) + " --revision " + arg.substr(at + 1));
    // A path ("/x", "./x", "../x", "~/x", "x/") is no repo id: the user meant a directory.
    const bool path_like = arg.front() == '/' || arg.front() == '~' || arg.back() == '/' ||
                           arg.rfind("./", 0) == 0 || arg.rfind("../", 0) == 0;
    return fail(path_like ? "" : "not a directory, nor a Hugging Face repo id: " + why);
  }

  const HubCacheDir hub = hub_cache_dir();
  std::string repo_dir_name = "models--";  // "org/name" -> "models--org--name"
  for (char ch : arg) repo_dir_name += ch == '/' ? std::string("--") : std::string(1, ch);
  const fs::path repo = fs::path(py_join(hub.path, repo_dir_name));
  if (!fs::is_directory(repo, ec)) {
    looked.push_back(repo.string() + " (from " + hub.source + "; does not exist)");
    return fail("not in the Hugging Face cache; download it first, e.g. `hf download " + arg +
                (revision.empty() ? "" : " --revision " + revision) + "`");
  }

  const fs::path snapshots = repo / "snapshots";
  std::string commit;
  if (is_full_commit(rev_label)) {
    commit = rev_label;
  } else if (is_safe_ref_name(rev_label) && fs::is_regular_file(repo / "refs" / rev_label, ec)) {
    const fs::path ref = repo / "refs" / rev_label;
    Result<std::string> text = read_file(ref.string());
    if (!text.is_ok()) {
      looked.push_back(ref.string() + " (unreadable: " + text.status().message() + ")");
      return fail("the cache entry is damaged");
    }
    commit = trim(*text);
    if (!is_safe_commit_name(commit)) {
      looked.push_back(ref.string() + " (holds '" + commit + "', not a commit hash)");
      return fail("the cache entry is damaged");
    }
    looked.push_back(ref.string() + " (names commit " + commit + ")");
  } else {
    // A hex prefix of exactly one cached snapshot's commit, as git accepts an abbreviated hash.
    std::vector<std::string> matches;
    if (revision.size() >= kMinCommitPrefix && is_hex(revision))
      for (const auto& s : cached_snapshots(snapshots))
        if (s.compare(0, revision.size(), revision) == 0) matches.push_back(s);
    if (matches.size() == 1) {
      commit = matches[0];
    } else {
      looked.push_back((repo / "refs" / rev_label).string() + " (does not exist)");
      if (matches.size() > 1) {
        std::string list;
        for (const auto& m : matches) list += (list.empty() ? "" : ", ") + m;
        return fail("revision '" + revision + "' is the start of several cached commits (" + list +
                    "); give more of the hash");
      }
      if (revision.empty())
        return fail("the cache has no refs/main, so no default revision; choose one with --revision (a branch or "
                    "tag name from refs/, or a commit hash): " + cache_contents(repo));
      return fail("revision '" + revision + "' is not cached: it is no ref in refs/ and no cached commit begins "
                  "with it; " + cache_contents(repo) + "; download it, e.g. `hf download " + arg + " --revision " +
                  revision + "`");
    }
  }

  const fs::path snap = snapshots / commit;
  if (!fs::is_directory(snap, ec)) {
    looked.push_back(snap.string() + " (" + (fs::exists(snap, ec) ? "not a directory" : "does not exist") + ")");
    return fail("the snapshot of commit " + commit + " is not in the cache; " + cache_contents(repo) +
                "; download it, e.g. `hf download " + arg + (revision.empty() ? "" : " --revision " + revision) + "`");
  }

  std::vector<std::string> lines = incomplete_files(repo, snap, commit, needs);
  if (!lines.empty()) {
    std::string msg = "model '" + arg + "' (revision " + rev_label + ", commit " + commit +
                      ") is incompletely downloaded in the Hugging Face cache, " + snap.string() + ":";
    for (const auto& l : lines) msg += "\n  " + l;
    msg += "\nfinish the download, e.g. `hf download " + arg + (revision.empty() ? "" : " --revision " + revision) +
           "`";
    return not_found(msg);
  }
  return snap.string();
}

}  // namespace anvil
