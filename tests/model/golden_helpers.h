// Test helpers for the golden model tests: run the anvil CLI as a subprocess, read float32 .npy files,
// and the logit error metric shared with scripts/make_golden_fixtures.py.
#pragma once
#include "format/npy.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "base/status.h"

namespace anvil::golden {

struct ProcessResult {
  int exit_code = -1;   // the child's exit status; 128+N when killed by signal N; -1 when it never ran
  std::string out;      // everything it wrote to stdout
  std::string err;      // everything it wrote to stderr (for failure messages)
};

// Wraps an argument in single quotes for /bin/sh.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

inline std::string read_whole_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Runs argv (argv[0] = program) through /bin/sh, capturing stdout through a pipe and stderr through a
// temporary file (kept apart so stdout stays parseable JSON).
inline ProcessResult run_process(const std::vector<std::string>& argv) {
  ProcessResult r;
  char err_path[] = "/tmp/anvil_golden_stderr_XXXXXX";
  int fd = mkstemp(err_path);
  if (fd < 0) return r;
  close(fd);
  std::string cmd;
  for (const auto& a : argv) cmd += shell_quote(a) + " ";
  cmd += "2>" + shell_quote(err_path);
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    int st = pclose(p);
    r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
  }
  r.err = read_whole_file(err_path);
  std::remove(err_path);
  return r;
}

// A float32 array read from .npy: row-major, `shape` as stored.
struct NpyF32 {
  std::vector<size_t> shape;
  std::vector<float> data;
  size_t rows() const { return shape.empty() ? 0 : shape[0]; }
  size_t cols() const { return shape.size() < 2 ? 1 : shape[1]; }
  const float* row(size_t i) const { return data.data() + i * cols(); }
};

// Reads a float32 ('<f4') .npy file, 1-D or 2-D, through the project's validated reader.
inline Result<NpyF32> read_npy_f32(const std::string& path) {
  auto arr = read_npy(path);
  if (!arr.is_ok()) return arr.status();
  if (arr->descr != "<f4") return unsupported(path + ": dtype " + arr->descr + ", expected little-endian float32 ('<f4')");
  if (arr->shape.empty() || arr->shape.size() > 2) return unsupported(path + ": expected a 1-D or 2-D array");
  NpyF32 a;
  for (int64_t d : arr->shape) a.shape.push_back(size_t(d));
  a.data.assign(arr->f32(), arr->f32() + arr->numel());
  return a;
}

// ||ours - ref||_2 / ||ref||_2 over one logit row (double accumulation).
inline double rel_err(const float* ours, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(ours[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num) / std::sqrt(den);
}

// Root-mean-square of (ours - ref) over one row: the typical per-logit error.
inline double rms_diff(const float* ours, const float* ref, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(ours[i]) - ref[i];
    s += d * d;
  }
  return std::sqrt(s / static_cast<double>(n));
}

struct Top2 {
  size_t argmax = 0;
  double margin = 0;  // top1 - top2 logit
};

inline Top2 top2(const float* row, size_t n) {
  size_t best = 0;
  for (size_t i = 1; i < n; ++i)
    if (row[i] > row[best]) best = i;
  double second = -INFINITY;
  for (size_t i = 0; i < n; ++i)
    if (i != best) second = std::max(second, static_cast<double>(row[i]));
  return {best, static_cast<double>(row[best]) - second};
}

}  // namespace anvil::golden
