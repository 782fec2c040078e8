// The chat page served at "/": one static HTML file with inline script, embedded in the binary.
#pragma once
#include <string>

namespace anvil::server {
const std::string& chat_page_html();
}
