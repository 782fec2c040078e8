// safetensors reader and writer. The reader trusts nothing in the file: every header field is
// checked before a TensorView pointing into the mapping is handed out, so a view's
// [data, data + nbytes) always lies inside the buffer it was parsed from.
#include "format/safetensors.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

namespace anvil {

namespace fs = std::filesystem;
using nlohmann::json;

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

namespace {

std::string sq(const std::string& s) { return "'" + s + "'"; }

// Parses the header JSON. nlohmann silently keeps the last of two equal keys, so duplicate
// top-level names are caught in the parser callback (depth 1 = keys of the top-level object).
Status parse_header_json(const char* begin, const char* end, const std::string& label, json* out) {
  std::set<std::string> seen;
  std::string duplicate;
  auto cb = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  try {
    *out = json::parse(begin, end, cb, /*allow_exceptions=*/true);
  } catch (const json::exception& e) {
    return corrupt(label + ": header is not valid JSON: " + e.what());
  }
  if (!duplicate.empty()) return corrupt(label + ": tensor " + sq(duplicate) + " appears twice in the header");
  if (!out->is_object()) return corrupt(label + ": header must be a JSON object, got " + std::string(out->type_name()));
  return Status::ok();
}

// A JSON value as a non-negative integer that fits in uint64.
bool as_u64(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    int64_t x = v.get<int64_t>();
    if (x < 0) return false;
    *out = uint64_t(x);
    return true;
  }
  return false;
}

struct ParsedTensor {
  TensorView view;
  uint64_t begin = 0, end = 0;
};

Status parse_tensor_entry(const std::string& name, const json& e, const std::string& label, uint64_t data_size,
                          ParsedTensor* out) {
  std::string where = label + ": tensor " + sq(name);
  if (!e.is_object()) return corrupt(where + ": expected an object with dtype, shape, data_offsets");

  auto dt = e.find("dtype");
  if (dt == e.end() || !dt->is_string()) return corrupt(where + ": field 'dtype': expected a string");
  const std::string& dname = dt->get_ref<const std::string&>();
  if (!dtype_from_name(dname, &out->view.dtype))
    return unsupported(where + ": unknown dtype " + sq(dname) +
                       " (expected F32, F16, BF16, F64, I8, U8, I16, U16, I32, U32, I64, U64 or BOOL)");

  auto sh = e.find("shape");
  if (sh == e.end() || !sh->is_array()) return corrupt(where + ": field 'shape': expected an array of integers");
  // numel * dtype_size must not overflow: every intermediate product is checked.
  uint64_t nbytes = dtype_size(out->view.dtype);
  for (const json& d : *sh) {
    uint64_t dim;
    if (!as_u64(d, &dim) || dim > uint64_t(INT64_MAX))
      return corrupt(where + ": field 'shape': expected non-negative integers, got " + d.dump());
    out->view.shape.push_back(int64_t(dim));
    if (__builtin_mul_overflow(nbytes, dim, &nbytes))
      return corrupt(where + ": shape " + sh->dump() + " is too large (byte size overflows 64 bits)");
  }

  auto off = e.find("data_offsets");
  if (off == e.end() || !off->is_array() || off->size() != 2 || !as_u64((*off)[0], &out->begin) ||
      !as_u64((*off)[1], &out->end))
    return corrupt(where + ": field 'data_offsets': expected [begin, end] with non-negative integers");
  if (out->begin > out->end)
    return corrupt(where + ": data_offsets " + off->dump() + ": begin is after end");
  if (out->end - out->begin != nbytes)
    return corrupt(where + ": data_offsets " + off->dump() + " span " + std::to_string(out->end - out->begin) +
                   " bytes but dtype " + dname + " x shape " + sh->dump() + " needs " + std::to_string(nbytes));
  if (out->end > data_size)
    return corrupt(where + ": data_offsets " + off->dump() + " run past the end of the data section (" +
                   std::to_string(data_size) + " bytes; file truncated?)");
  out->view.name = name;
  out->view.nbytes = size_t(nbytes);
  out->view.file = label;
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::parse(const uint8_t* data, size_t size,
                                                                 const std::string& label) {
  if (size < 8)
    return corrupt(label + ": file is " + std::to_string(size) + " bytes, too short for the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];  // little-endian regardless of host
  if (n > kMaxSafetensorsHeaderBytes)
    return corrupt(label + ": header length " + std::to_string(n) + " exceeds the limit of " +
                   std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  if (n > size - 8)
    return corrupt(label + ": header length " + std::to_string(n) + " is larger than the rest of the file (" +
                   std::to_string(size - 8) + " bytes; file truncated?)");

  json header;
  const char* hbegin = reinterpret_cast<const char*>(data + 8);
  ANVIL_RETURN_IF_ERROR(parse_header_json(hbegin, hbegin + n, label, &header));

  const uint8_t* data_section = data + 8 + n;
  const uint64_t data_size = size - 8 - n;

  auto f = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  f->path_ = label;
  std::vector<ParsedTensor> parsed;
  parsed.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (it->is_null()) continue;
      if (!it->is_object()) return corrupt(label + ": __metadata__ must be an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          return corrupt(label + ": __metadata__ key " + sq(m.key()) + ": expected a string value, got " +
                         m->type_name());
        f->metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    ParsedTensor t;
    ANVIL_RETURN_IF_ERROR(parse_tensor_entry(it.key(), *it, label, data_size, &t));
    parsed.push_back(std::move(t));
  }

  // No two tensors may share a byte. Empty tensors own no bytes and cannot overlap anything.
  std::vector<const ParsedTensor*> order;
  for (const auto& t : parsed)
    if (t.end > t.begin) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const ParsedTensor* a, const ParsedTensor* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    if (order[i]->begin < order[i - 1]->end)
      return corrupt(label + ": tensors " + sq(order[i - 1]->view.name) + " [" +
                     std::to_string(order[i - 1]->begin) + ", " + std::to_string(order[i - 1]->end) + ") and " +
                     sq(order[i]->view.name) + " [" + std::to_string(order[i]->begin) + ", " +
                     std::to_string(order[i]->end) + ") overlap");
  }

  // Keep tensors in data order: a reader walking them touches the file front to back.
  std::stable_sort(parsed.begin(), parsed.end(),
                   [](const ParsedTensor& a, const ParsedTensor& b) { return a.begin < b.begin; });
  f->tensors_.reserve(parsed.size());
  for (auto& t : parsed) {
    t.view.data = data_section + t.begin;
    f->index_[t.view.name] = f->tensors_.size();
    f->tensors_.push_back(std::move(t.view));
  }
  return f;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  ANVIL_ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> mapped, MappedFile::open(path));
  ANVIL_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f, parse(mapped->data(), mapped->size(), path));
  f->file_ = std::move(mapped);
  return f;
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

namespace {

// Shard names come from a file we do not trust: they must stay inside the model directory.
bool is_safe_relative(const std::string& name) {
  if (name.empty() || name[0] == '/') return false;
  for (const auto& part : fs::path(name))
    if (part == "..") return false;
  return true;
}

}  // namespace

Result<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return not_found(dir + ": not a directory");

  auto ck = std::unique_ptr<Checkpoint>(new Checkpoint());
  ck->dir_ = dir;
  const fs::path root(dir);

  std::vector<std::string> files;
  json weight_map;  // only for the index layout
  std::string index_path = (root / "model.safetensors.index.json").string();
  if (fs::is_regular_file(root / "model.safetensors", ec)) {
    files.push_back("model.safetensors");
  } else if (fs::is_regular_file(index_path, ec)) {
    ANVIL_ASSIGN_OR_RETURN(std::string text, read_file(index_path));
    json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded()) return corrupt(index_path + ": not valid JSON");
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      return corrupt(index_path + ": field 'weight_map': expected an object {tensor: shard file}");
    weight_map = index["weight_map"];
    std::set<std::string> seen;
    for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
      if (!it->is_string())
        return corrupt(index_path + ": weight_map entry " + sq(it.key()) + ": expected a shard file name");
      const std::string& shard = it->get_ref<const std::string&>();
      if (!is_safe_relative(shard))
        return corrupt(index_path + ": weight_map entry " + sq(it.key()) + ": shard " + sq(shard) +
                       " is not a file inside the model directory");
      if (seen.insert(shard).second) files.push_back(shard);
    }
    std::sort(files.begin(), files.end());
    for (const auto& shard : files) {
      if (!fs::is_regular_file(root / shard, ec))
        return not_found(index_path + ": shard " + sq(shard) + " is missing: " + (root / shard).string() +
                         " does not exist");
    }
  } else {
    for (const auto& e : fs::directory_iterator(root, ec)) {
      if (e.path().extension() != ".safetensors") continue;
      std::error_code fe;
      if (e.is_regular_file(fe)) {
        files.push_back(e.path().filename());
        continue;
      }
      // A link to nothing: what an interrupted Hugging Face cache download leaves behind.
      if (e.is_symlink(fe) && !fs::exists(e.path(), fe))
        return not_found(e.path().string() + " is a link to " + fs::read_symlink(e.path(), fe).string() +
                         ", which does not exist (an incomplete download?)");
    }
    if (ec) return io_error(dir + ": cannot list directory: " + ec.message());
    std::sort(files.begin(), files.end());
    if (files.empty()) return not_found("no *.safetensors in " + dir);
  }

  std::map<std::string, const SafetensorsFile*> by_file;
  for (const auto& name : files) {
    ANVIL_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f, SafetensorsFile::open((root / name).string()));
    for (const auto& t : f->tensors()) {
      auto [it, inserted] = ck->by_name_.emplace(t.name, &t);
      if (!inserted)
        return corrupt(dir + ": tensor " + sq(t.name) + " appears in both " + it->second->file + " and " +
                       t.file);
    }
    by_file[name] = f.get();
    ck->files_.push_back(std::move(f));
  }

  for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
    const std::string& shard = it->get_ref<const std::string&>();
    if (!by_file.at(shard)->find(it.key()))
      return not_found(index_path + ": tensor " + sq(it.key()) + " is mapped to shard " + sq(shard) +
                       " but that file does not contain it");
  }
  return ck;
}

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, _] : by_name_) out.push_back(name);
  return out;
}

size_t Checkpoint::total_bytes() const {
  size_t n = 0;
  for (const auto& [_, t] : by_name_) n += t->nbytes;
  return n;
}

// ---------------------------------------------------------------------------------------------
// Writer

Status SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data,
                              size_t nbytes) {
  if (name.empty()) return invalid_argument("safetensors writer: tensor name is empty");
  if (name == "__metadata__") return invalid_argument("safetensors writer: '__metadata__' is not a tensor name");
  try {
    (void)json(name).dump();
  } catch (const json::exception&) {
    return invalid_argument("safetensors writer: tensor name is not valid UTF-8");
  }
  for (const auto& e : entries_)
    if (e.name == name) return invalid_argument("safetensors writer: tensor " + sq(name) + " added twice");
  uint64_t expect = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0) return invalid_argument("safetensors writer: tensor " + sq(name) + ": negative dimension " +
                                       std::to_string(d));
    if (__builtin_mul_overflow(expect, uint64_t(d), &expect))
      return invalid_argument("safetensors writer: tensor " + sq(name) + ": shape too large");
  }
  if (expect != nbytes)
    return invalid_argument("safetensors writer: tensor " + sq(name) + ": got " + std::to_string(nbytes) +
                            " bytes, dtype " + std::string(dtype_name(dtype)) + " x shape needs " +
                            std::to_string(expect));
  if (nbytes > 0 && data == nullptr)
    return invalid_argument("safetensors writer: tensor " + sq(name) + ": data is null");
  Entry e{name, dtype, std::move(shape), {}};
  if (nbytes) e.bytes.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + nbytes);
  entries_.push_back(std::move(e));
  return Status::ok();
}

std::vector<uint8_t> SafetensorsWriter::to_buffer() const {
  // Like the reference writer: wider dtypes first, then by name, so every tensor's offset is a
  // multiple of its element size; the header is space-padded to a multiple of 8 bytes so the data
  // section starts 8-aligned. Header keys: "__metadata__" first, then tensors in data order.
  std::vector<const Entry*> order;
  for (const auto& e : entries_) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    size_t sa = dtype_size(a->dtype), sb = dtype_size(b->dtype);
    return sa != sb ? sa > sb : a->name < b->name;
  });

  std::string h = "{";
  if (!metadata_.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata_) {
      if (!first) h += ",";
      first = false;
      // Metadata is set without a Status; invalid UTF-8 is replaced rather than thrown.
      h += json(k).dump(-1, ' ', false, json::error_handler_t::replace) + ":" +
           json(v).dump(-1, ' ', false, json::error_handler_t::replace);
    }
    h += "}";
  }
  uint64_t offset = 0;
  for (const Entry* e : order) {
    if (h.size() > 1) h += ",";
    h += json(e->name).dump() + ":{\"dtype\":\"" + std::string(dtype_name(e->dtype)) + "\",\"shape\":[";
    for (size_t i = 0; i < e->shape.size(); ++i) {
      if (i) h += ',';
      h += std::to_string(e->shape[i]);
    }
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + e->bytes.size()) + "]}";
    offset += e->bytes.size();
  }
  h += "}";
  while (h.size() % 8) h += ' ';

  std::vector<uint8_t> out(8 + h.size() + offset);
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = uint8_t(n >> (8 * i));
  std::copy(h.begin(), h.end(), out.begin() + 8);
  size_t pos = 8 + h.size();
  for (const Entry* e : order) {
    std::copy(e->bytes.begin(), e->bytes.end(), out.begin() + pos);
    pos += e->bytes.size();
  }
  return out;
}

Status SafetensorsWriter::write_file(const std::string& path) const {
  std::vector<uint8_t> buf = to_buffer();
  return write_file_atomic(path, buf.data(), buf.size());
}

}  // namespace anvil
