// KVStore maintenance (anvil kv): gc, verify, export.
#include <cstring>
#include <map>

#include "format/safetensors.h"
#include "kvstore/catalog.h"
#include "kvstore/kvstore.h"
#include "runtime/kv_pool.h"

namespace anvil {

Result<int64_t> KVStore::gc_once(std::optional<uint64_t> target) {
  auto pinned = [this](const Hash128& k) {
    std::lock_guard<std::mutex> lk(pin_mu_);
    return pinned_.count(k) > 0;
  };
  ANVIL_ASSIGN_OR_RETURN(int64_t n, evict_lru(db_, target.value_or(opts_.max_bytes), pinned));
  counters_.pages_evicted += n;
  std::set<int64_t> own;
  // A segment this process is appending to is not compacted (its writer owns it).
  {
    SqliteStmt q;
    ANVIL_RETURN_IF_ERROR(q.prepare(db_, "SELECT id FROM segments WHERE sealed = 0"));
    while (true) {
      ANVIL_ASSIGN_OR_RETURN(bool row, q.step());
      if (!row) break;
      own.insert(q.col_int(0));  // unsealed: some live writer's (recovery sealed the dead ones)
    }
  }
  return compact_segments(db_, env_, opts_.dir, own);
}

namespace {

// Reads one record and checks it against its catalog row; "" when it is sound.
std::string check_record(Env* env, const std::string& dir, int64_t seg, int64_t off, int64_t len, uint64_t sum,
                         const Hash128* key, const Hash128& parent, int first_pos, const int32_t* toks, size_t n_toks,
                         std::vector<uint8_t>& buf, PageLayout* layout_out = nullptr,
                         const uint8_t** data_out = nullptr) {
  const std::string path = segment_file(dir, seg), label = path + "@" + std::to_string(off);
  auto f = env->open_read(path);
  if (!f.is_ok()) return f.status().message();
  if (len <= 0 || len > (1ll << 31)) return label + ": implausible record length " + std::to_string(len);
  buf.resize(size_t(len));
  Status st = (*f)->read_at(uint64_t(off), buf.data(), buf.size());
  if (!st.is_ok()) return st.message();
  if (record_checksum(buf.data(), buf.size()) != sum) return label + ": record checksum mismatch";
  PageLayout L;
  Hash128 fp;
  st = page_record_layout(buf.data(), buf.size(), &L, &fp, label);
  if (!st.is_ok()) return st.message();
  PageMeta meta;
  const uint8_t* data = nullptr;
  st = page_record_parse(buf.data(), buf.size(), L, fp, &meta, &data, label);
  if (!st.is_ok()) return st.message();
  if ((key && meta.key != *key) || meta.parent != parent || meta.first_pos != first_pos ||
      meta.tokens.size() != n_toks || std::memcmp(meta.tokens.data(), toks, n_toks * 4) != 0)
    return label + ": record identity differs from its catalog row";
  if (key && kv_page_key(fp, parent, meta.tokens) != *key) return label + ": chain key does not match its contents";
  if (layout_out) *layout_out = L;
  if (data_out) *data_out = data;
  return "";
}

}  // namespace

Status KVStore::verify(std::vector<std::string>* problems, int64_t* checked) {
  *checked = 0;
  {
    SqliteStmt q;
    ANVIL_RETURN_IF_ERROR(q.prepare(db_, "PRAGMA integrity_check"));
    while (true) {
      auto r = q.step();
      if (!r.is_ok()) {
        problems->push_back("catalog: " + r.status().message());
        break;
      }
      if (!*r) break;
      std::string line = q.col_text(0);
      if (line != "ok") problems->push_back("catalog integrity_check: " + line);
    }
  }
  std::map<int64_t, int64_t> seg_end;
  {
    SqliteStmt q;
    ANVIL_RETURN_IF_ERROR(q.prepare(db_, "SELECT id, committed_end FROM segments"));
    while (true) {
      ANVIL_ASSIGN_OR_RETURN(bool row, q.step());
      if (!row) break;
      seg_end[q.col_int(0)] = q.col_int(1);
    }
  }
  for (auto [id, end] : seg_end) {
    const std::string path = segment_file(opts_.dir, id);
    auto size = env_->file_size(path);
    if (!size.is_ok()) {
      ANVIL_ASSIGN_OR_RETURN(int64_t refs, catalog_int(db_, "SELECT COUNT(*) FROM pages WHERE segment = " + std::to_string(id)));
      if (refs > 0) problems->push_back(path + ": missing, " + std::to_string(refs) + " pages reference it");
    } else if (int64_t(*size) < end) {
      problems->push_back(path + ": " + std::to_string(*size) + " bytes, shorter than its committed " +
                          std::to_string(end));
    }
  }
  // Segment files the catalog does not know: their rows are gone (a lost or damaged catalog WAL
  // rolls the catalog back silently) or a gc was interrupted between its commit and the unlink.
  if (auto names = env_->list_dir(opts_.dir); names.is_ok())
    for (const std::string& n : *names) {
      int64_t id;
      if (!parse_segment_file(n, &id) || seg_end.count(id)) continue;
      auto size = env_->file_size(opts_.dir + "/" + n);
      if (size.is_ok() && *size > 0)
        problems->push_back(opts_.dir + "/" + n + ": " + std::to_string(*size) +
                            " bytes that no catalog row knows (lost catalog rows, or an interrupted gc; `anvil kv gc` "
                            "removes the file)");
    }
  std::vector<uint8_t> buf;
  SqliteStmt q;
  ANVIL_RETURN_IF_ERROR(q.prepare(db_, "SELECT key, parent, first_pos, tokens, segment, offset, length, checksum FROM pages"));
  while (true) {
    ANVIL_ASSIGN_OR_RETURN(bool row, q.step());
    if (!row) break;
    const Hash128 key = q.col_hash(0);
    std::string p = check_record(env_, opts_.dir, q.col_int(4), q.col_int(5), q.col_int(6), uint64_t(q.col_int(7)), &key,
                                 q.col_hash(1), int(q.col_int(2)), static_cast<const int32_t*>(q.col_blob(3)),
                                 q.col_bytes(3) / 4, buf);
    ++*checked;
    if (!p.empty()) problems->push_back("page " + key.hex() + ": " + p);
  }
  SqliteStmt t;
  ANVIL_RETURN_IF_ERROR(t.prepare(db_,
      "SELECT name, tokens, tail_segment, tail_offset, tail_length, tail_checksum, tail_first, tail_n, tail_parent, "
      "durable_pos, meta, sum FROM sessions"));
  while (true) {
    ANVIL_ASSIGN_OR_RETURN(bool row, t.step());
    if (!row) break;
    const std::string name = t.col_text(0);
    const size_t n_tok = t.col_bytes(1) / 4;
    const int32_t* toks = static_cast<const int32_t*>(t.col_blob(1));
    ++*checked;
    if (t.col_bytes(1) % 4 != 0 ||
        (!t.col_null(11) && uint64_t(t.col_int(11)) != session_sum(toks, n_tok, t.col_text(10))))
      problems->push_back("session " + name + ": its token ids or conversation fail their checksum");
    if (t.col_int(9) > int64_t(n_tok)) problems->push_back("session " + name + ": durable position past its tokens");
    const int first = int(t.col_int(6)), n = int(t.col_int(7));
    if (n <= 0) continue;
    if (size_t(first + n) > n_tok) {
      problems->push_back("session " + name + ": tail past its tokens");
      continue;
    }
    std::string p = check_record(env_, opts_.dir, t.col_int(2), t.col_int(3), t.col_int(4), uint64_t(t.col_int(5)),
                                 nullptr, t.col_hash(8), first, toks + first, size_t(n), buf);
    ++*checked;
    if (!p.empty()) problems->push_back("session " + name + " tail: " + p);
  }
  return Status::ok();
}

Status KVStore::export_session(const std::string& name, const std::string& path) {
  ANVIL_ASSIGN_OR_RETURN(auto info, get_session(name));
  if (!info) return not_found("no session named '" + name + "' in " + opts_.dir);
  struct Ref {
    int64_t seg, off, len;
    uint64_t sum;
    Hash128 key, parent;
    int first, n;
  };
  std::vector<Ref> refs;
  SqliteStmt q;
  ANVIL_RETURN_IF_ERROR(q.prepare(db_,
      "SELECT p.key, p.parent, p.first_pos, p.segment, p.offset, p.length, p.checksum, length(p.tokens) / 4 "
      "FROM session_pages sp JOIN pages p ON p.key = sp.key WHERE sp.session = ? ORDER BY sp.idx"));
  q.bind(1, name);
  int pos = 0;
  while (true) {
    ANVIL_ASSIGN_OR_RETURN(bool row, q.step());
    if (!row) break;
    if (q.col_int(2) != pos) break;  // a missing page ends what can be exported
    refs.push_back({q.col_int(3), q.col_int(4), q.col_int(5), uint64_t(q.col_int(6)), q.col_hash(0), q.col_hash(1),
                    pos, int(q.col_int(7))});
    pos += int(q.col_int(7));
  }
  q.reset();
  SqliteStmt t;
  ANVIL_RETURN_IF_ERROR(t.prepare(db_,
      "SELECT tail_segment, tail_offset, tail_length, tail_checksum, tail_first, tail_n, tail_parent FROM sessions "
      "WHERE name = ? AND tail_n > 0"));
  t.bind(1, name);
  ANVIL_ASSIGN_OR_RETURN(bool has_tail, t.step());
  if (has_tail && t.col_int(4) == pos)
    refs.push_back({t.col_int(0), t.col_int(1), t.col_int(2), uint64_t(t.col_int(3)), Hash128{}, t.col_hash(6), pos,
                    int(t.col_int(5))});
  if (refs.empty()) return not_found("session '" + name + "' has no stored KV to export");
  // Per (layer, k|v): [heads, total, head_dim], gathered page by page.
  std::vector<uint8_t> buf;
  PageLayout L;
  int total = 0;
  for (auto& r : refs) total += r.n;
  std::vector<std::vector<uint8_t>> out;
  int at = 0;
  for (const Ref& r : refs) {
    const uint8_t* data = nullptr;
    PageLayout rl;
    std::string p = check_record(env_, opts_.dir, r.seg, r.off, r.len, r.sum, r.key.is_zero() ? nullptr : &r.key,
                                 r.parent, r.first, info->tokens.data() + r.first, size_t(r.n), buf, &rl, &data);
    if (!p.empty()) return corrupt("export " + name + ": " + p);
    if (out.empty()) {
      L = rl;
      out.assign(size_t(2 * L.n_layers), std::vector<uint8_t>(L.n_kv_heads * L.block_bytes(total)));
    }
    for (size_t b = 0; b < L.n_blocks(); ++b) {
      const size_t lk = b / L.n_kv_heads, h = b % L.n_kv_heads;
      std::memcpy(out[lk].data() + h * L.block_bytes(total) + L.block_bytes(at), data + b * L.block_bytes(r.n),
                  L.block_bytes(r.n));
    }
    at += r.n;
  }
  SafetensorsWriter w;
  for (int l = 0; l < L.n_layers; ++l)
    for (int kv = 0; kv < 2; ++kv)
      ANVIL_RETURN_IF_ERROR(w.add("layer." + std::to_string(l) + (kv ? ".v" : ".k"), L.dtype,
                                  {L.n_kv_heads, total, L.head_dim}, out[size_t(2 * l + kv)].data(),
                                  out[size_t(2 * l + kv)].size()));
  w.set_metadata("anvil.format", "kv-session");
  w.set_metadata("session", name);
  w.set_metadata("fingerprint", info->fingerprint.hex());
  w.set_metadata("tokens", tokens_to_string(info->tokens));
  w.set_metadata("kv_tokens", std::to_string(total));
  return w.write_file(path);
}

}  // namespace anvil
