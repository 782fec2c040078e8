// Files a model directory may or may not have (tokenizer_config.json, chat_template.jinja,
// generation_config.json, ...). Absent is an ordinary case with its own meaning; a file that is
// there but cannot be read (a symbolic link to nothing, as an interrupted Hugging Face download
// leaves, a file without read permission, a directory in its place) is an error naming the path
// and why, never taken for absent: a model run without its chat template or stop ids would run
// silently as something else.
#pragma once
#include <optional>
#include <string>

#include "base/status.h"

namespace anvil {

// True when anything is at `path`: a file, a directory, or a symbolic link, even one to nothing
// (lstat). std::filesystem::exists follows the link and says false for a dangling one.
bool path_present(const std::string& path);

// nullopt when nothing is at `path`; the file's bytes when it is a readable file (or a link to
// one); otherwise an io_error naming the path: "PATH: a symbolic link to 'TARGET', which does not
// exist (...)", "PATH: cannot open: Permission denied", "PATH: a directory, not a file".
Result<std::optional<std::string>> read_optional_file(const std::string& path);

}  // namespace anvil
