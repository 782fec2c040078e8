#include "kvstore/page_record.h"

#include "kvstore/checksum.h"

#include <cctype>
#include <cstring>
#include <nlohmann/json.hpp>

#include "format/safetensors.h"

namespace anvil {

uint64_t record_checksum(const void* data, size_t n) { return XXH3_64bits(data, n); }

static std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

std::string tokens_to_string(std::span<const int32_t> ids) {
  std::string s;
  s.reserve(ids.size() * 7);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s;
}

bool tokens_from_string(const std::string& s, std::vector<int32_t>* out) {
  out->clear();
  if (s.empty()) return true;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    if (j == i) return false;
    char* end = nullptr;
    std::string tok = s.substr(i, j - i);
    long v = std::strtol(tok.c_str(), &end, 10);
    if (*end != 0 || v < 0 || v > INT32_MAX) return false;
    out->push_back(int32_t(v));
    i = j + 1;
  }
  return true;
}

std::string page_record_header(const PageLayout& L, const PageMeta& meta, const void* data, size_t data_bytes) {
  return page_record_header_for_sum(L, meta, XXH3_64bits(data, data_bytes));
}

// The header's tensor entries: "{" and every entry, without the closing brace. They are the same for
// every record of one layout and length, and building them is most of a header's cost (56 entries
// for qwen3-0.6b; the restore builds the expected header of every page it reads), so each thread
// keeps the last one.
static const std::string& tensor_section(const PageLayout& L, int n) {
  thread_local PageLayout last{};
  thread_local int last_n = -1;
  thread_local std::string s;
  if (n == last_n && last.dtype == L.dtype && last.n_layers == L.n_layers && last.n_kv_heads == L.n_kv_heads &&
      last.head_dim == L.head_dim)
    return s;
  const size_t blk = L.block_bytes(n);
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  size_t off = 0;
  const std::string dt(dtype_name(L.dtype));
  for (int l = 0; l < L.n_layers; ++l)
    for (int kv = 0; kv < 2; ++kv) {
      const size_t bytes = blk * L.n_kv_heads;
      h["layer." + std::to_string(l) + (kv ? ".v" : ".k")] = {
          {"dtype", dt}, {"shape", {L.n_kv_heads, n, L.head_dim}}, {"data_offsets", {off, off + bytes}}};
      off += bytes;
    }
  s = h.dump();
  s.pop_back();  // the closing brace: __metadata__ follows
  last = L;
  last_n = n;
  return s;
}

std::string page_record_header_for_sum(const PageLayout& L, const PageMeta& meta, uint64_t data_sum) {
  const std::string& tensors = tensor_section(L, int(meta.tokens.size()));
  const nlohmann::ordered_json md = {{"anvil.format", "kv-page"},
                                     {"anvil.format_version", std::to_string(kPageRecordVersion)},
                                     {"fingerprint", meta.fingerprint.hex()},
                                     {"key", meta.key.hex()},
                                     {"parent", meta.parent.hex()},
                                     {"first_pos", std::to_string(meta.first_pos)},
                                     {"page_size", std::to_string(L.page_size)},
                                     {"tokens", tokens_to_string(meta.tokens)},
                                     {"data_xxh3", hex64(data_sum)}};
  // The same bytes as dumping one ordered object {tensors..., "__metadata__": md}.
  std::string json;
  json.reserve(tensors.size() + 512 + meta.tokens.size() * 7);
  json += tensors;
  if (tensors.size() > 1) json += ',';
  json += "\"__metadata__\":";
  json += md.dump();
  json += '}';
  while ((8 + json.size()) % 8) json += ' ';
  std::string out(8, '\0');
  uint64_t len = json.size();
  std::memcpy(out.data(), &len, 8);
  out += json;
  return out;
}

Status page_record_parse(const uint8_t* rec, size_t n, const PageLayout& L, const Hash128& fingerprint, PageMeta* meta,
                         const uint8_t** data, const std::string& label, bool check_data_sum) {
  ANVIL_ASSIGN_OR_RETURN(auto st, SafetensorsFile::parse(rec, n, label));
  const auto& md = st->metadata();
  auto get = [&](const char* k) -> const std::string* {
    auto it = md.find(k);
    return it == md.end() ? nullptr : &it->second;
  };
  const std::string* fmt = get("anvil.format");
  const std::string* ver = get("anvil.format_version");
  if (!fmt || *fmt != "kv-page") return corrupt(label + ": not a KV page record (metadata anvil.format)");
  if (!ver || *ver != std::to_string(kPageRecordVersion))
    return corrupt(label + ": record format version " + (ver ? *ver : "(none)") + ", expected " +
                   std::to_string(kPageRecordVersion));
  const std::string *fp = get("fingerprint"), *key = get("key"), *parent = get("parent"), *toks = get("tokens"),
                    *first = get("first_pos"), *ps = get("page_size"), *sum = get("data_xxh3");
  if (!fp || !key || !parent || !toks || !first || !ps || !sum) return corrupt(label + ": metadata field missing");
  if (!Hash128::from_hex(*fp, &meta->fingerprint) || !Hash128::from_hex(*key, &meta->key) ||
      !Hash128::from_hex(*parent, &meta->parent))
    return corrupt(label + ": malformed fingerprint/key/parent");
  if (meta->fingerprint != fingerprint)
    return corrupt(label + ": recorded for model fingerprint " + *fp + ", expected " + fingerprint.hex());
  if (*ps != std::to_string(L.page_size)) return corrupt(label + ": page size " + *ps);
  if (!tokens_from_string(*toks, &meta->tokens) || meta->tokens.empty() || int(meta->tokens.size()) > L.page_size)
    return corrupt(label + ": malformed token ids");
  meta->first_pos = std::atoi(first->c_str());
  const int nt = int(meta->tokens.size());
  if (st->tensors().size() != L.n_blocks() / L.n_kv_heads)
    return corrupt(label + ": " + std::to_string(st->tensors().size()) + " tensors, expected " +
                   std::to_string(2 * L.n_layers));
  const uint8_t* base = nullptr;
  size_t expect_off = 0;
  for (int l = 0; l < L.n_layers; ++l)
    for (int kv = 0; kv < 2; ++kv) {
      std::string name = "layer." + std::to_string(l) + (kv ? ".v" : ".k");
      const TensorView* t = st->find(name);
      if (!t) return corrupt(label + ": tensor " + name + " missing");
      if (t->dtype != L.dtype || t->shape != std::vector<int64_t>{L.n_kv_heads, nt, L.head_dim})
        return corrupt(label + ": tensor " + name + " is " + std::string(dtype_name(t->dtype)) + " " + t->shape_string() +
                       ", expected " + std::string(dtype_name(L.dtype)) + " [" + std::to_string(L.n_kv_heads) + ", " +
                       std::to_string(nt) + ", " + std::to_string(L.head_dim) + "]");
      if (!base) base = t->data;
      if (size_t(t->data - base) != expect_off) return corrupt(label + ": tensor " + name + " out of order");
      expect_off += t->nbytes;
    }
  if (expect_off != L.data_bytes(nt) || size_t(base - rec) + expect_off != n)
    return corrupt(label + ": data section size does not match the layout");
  if (check_data_sum && hex64(XXH3_64bits(base, expect_off)) != *sum) return corrupt(label + ": data checksum mismatch");
  *data = base;
  return Status::ok();
}

bool page_record_header_matches(const uint8_t* hdr, size_t n, const PageLayout& L, const PageMeta& expected) {
  // The checksum field's value is the only part that depends on the data; mask it on both sides.
  static constexpr char kField[] = "\"data_xxh3\":\"";
  const std::string want = page_record_header_for_sum(L, expected, 0);
  if (want.size() != n) return false;
  const size_t at = want.rfind(kField);
  if (at == std::string::npos) return false;
  const size_t v = at + sizeof(kField) - 1;  // the 16 hex digits
  if (std::memcmp(hdr, want.data(), v) != 0 || std::memcmp(hdr + v + 16, want.data() + v + 16, n - v - 16) != 0)
    return false;
  for (size_t i = v; i < v + 16; ++i)
    if (!std::isxdigit(hdr[i])) return false;
  return true;
}

Status page_record_layout(const uint8_t* rec, size_t n, PageLayout* L, Hash128* fingerprint, const std::string& label) {
  ANVIL_ASSIGN_OR_RETURN(auto st, SafetensorsFile::parse(rec, n, label));
  const TensorView* k0 = st->find("layer.0.k");
  if (!k0 || k0->shape.size() != 3) return corrupt(label + ": no tensor layer.0.k of rank 3");
  auto md = st->metadata();
  if (!md.count("page_size") || !md.count("fingerprint") || !Hash128::from_hex(md["fingerprint"], fingerprint))
    return corrupt(label + ": metadata page_size/fingerprint missing");
  L->dtype = k0->dtype;
  L->n_layers = int(st->tensors().size() / 2);
  L->n_kv_heads = int(k0->shape[0]);
  L->head_dim = int(k0->shape[2]);
  L->page_size = std::atoi(md["page_size"].c_str());
  if (L->n_layers < 1 || L->page_size < 1) return corrupt(label + ": implausible layout");
  return Status::ok();
}

}  // namespace anvil
