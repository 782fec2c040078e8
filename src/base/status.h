// Status and Result<T>: how errors cross module boundaries (no exceptions across modules).
// A message names the file, tensor, field or parameter that was wrong and what was expected.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace anvil {

// kBusy: something is in use by another request or process (a KV store session another process
// records); trying again later may succeed.
enum class StatusCode { kOk = 0, kInvalidArgument, kNotFound, kIoError, kCorrupt, kUnsupported, kOutOfMemory, kInternal, kBusy };

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return Status(); }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // Prefix context, e.g. the file being loaded: "model.safetensors: <message>".
  Status with_context(const std::string& ctx) const {
    if (is_ok()) return *this;
    return Status(code_, ctx + ": " + message_);
  }
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
inline Status not_found(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
inline Status io_error(std::string m) { return Status(StatusCode::kIoError, std::move(m)); }
inline Status corrupt(std::string m) { return Status(StatusCode::kCorrupt, std::move(m)); }
inline Status unsupported(std::string m) { return Status(StatusCode::kUnsupported, std::move(m)); }
inline Status internal_error(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }
inline Status busy(std::string m) { return Status(StatusCode::kBusy, std::move(m)); }

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Status status) : v_(std::move(status)) {
    if (std::get<Status>(v_).is_ok()) v_ = Status(StatusCode::kInternal, "Result constructed from an ok Status");
  }
  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { check(); return std::get<T>(v_); }
  const T& value() const& { check(); return std::get<T>(v_); }
  T&& value() && { check(); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void check() const {
    if (!is_ok()) {
      std::fprintf(stderr, "anvil: fatal: value() on an error Result: %s\n", std::get<Status>(v_).message().c_str());
      std::abort();
    }
  }
  std::variant<T, Status> v_;
};

}  // namespace anvil

#define ANVIL_CONCAT_INNER(a, b) a##b
#define ANVIL_CONCAT(a, b) ANVIL_CONCAT_INNER(a, b)

// Return the Status if it is an error.
#define ANVIL_RETURN_IF_ERROR(expr)                 \
  do {                                              \
    ::anvil::Status _anvil_st = (expr);             \
    if (!_anvil_st.is_ok()) return _anvil_st;       \
  } while (0)

// ANVIL_ASSIGN_OR_RETURN(auto x, f()); declares x from a Result or returns its Status.
#define ANVIL_ASSIGN_OR_RETURN(lhs, expr) ANVIL_ASSIGN_OR_RETURN_IMPL(ANVIL_CONCAT(_anvil_r_, __LINE__), lhs, expr)
#define ANVIL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.is_ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
