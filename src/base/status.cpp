#include "base/status.h"

namespace anvil {

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return message_;
}

}  // namespace anvil
