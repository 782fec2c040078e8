// The chat-template engine's built-in library: globals (range, namespace, dict, raise_exception,
// strftime_now), filters, tests, Python str/dict methods, and attribute/item access.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "tokenizer/chat_template_internal.h"

namespace anvil::chat_template_detail {

void install_globals(std::map<std::string, Value>& frame);
void check_namespace_name(const std::string& name, int line);  // transformers refuses "_x" names
std::vector<Value> iterate(const Value& v, int line);           // Python iter(): dict -> keys, str -> chars
bool contains(const Value& container, const Value& item, int line);  // Python "item in container"
Value get_attr(const Value& obj, const std::string& name, int line);  // obj.name (jinja2: attribute, then item)
Value get_item(const Value& obj, const Value& key, int line);         // obj[key] (jinja2: item, then attribute)
// obj.name for a Python method of a str/list/dict (chat_template_methods.cpp): a callable, an
// undefined that fails when used (a mutating method the sandbox refuses, or no such method; for a
// dict with an empty hint, meaning "not a method: look up the key").
Value method_of(const Value& obj, const std::string& name, int line);
Value apply_filter(const std::string& name, const Value& v, Args& args, int line);
bool apply_test(const std::string& name, const Value& v, Args& args, int line);

}  // namespace anvil::chat_template_detail
