// KVStore maintenance (anvil kv): gc, verify, export.
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <thread>

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
  // Eviction goes by live_bytes: a drifted count is corrected first.
  ANVIL_RETURN_IF_ERROR(live_bytes_recount(db_).status());
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

namespace {

// A pages row as verify reads it.
struct PageRow {
  Hash128 key, parent;
  int first_pos = 0;
  std::vector<int32_t> tokens;
  int64_t seg = 0, off = 0, len = 0;
  uint64_t sum = 0;
  bool operator==(const PageRow&) const = default;
};
constexpr const char* kPageCols = "SELECT key, parent, first_pos, tokens, segment, offset, length, checksum FROM pages";
PageRow page_row(const SqliteStmt& q) {
  PageRow r;
  r.key = q.col_hash(0);
  r.parent = q.col_hash(1);
  r.first_pos = int(q.col_int(2));
  const int32_t* t = static_cast<const int32_t*>(q.col_blob(3));
  r.tokens.assign(t, t + q.col_bytes(3) / 4);
  r.seg = q.col_int(4);
  r.off = q.col_int(5);
  r.len = q.col_int(6);
  r.sum = uint64_t(q.col_int(7));
  return r;
}

// A sessions row as verify reads it.
struct SessRow {
  std::string name, meta;
  std::vector<int32_t> tokens;
  size_t token_bytes = 0;  // the tokens blob's (not a multiple of 4: cut mid-id)
  bool has_sum = false;
  uint64_t sum = 0;
  int64_t durable = 0, tseg = 0, toff = 0, tlen = 0;
  uint64_t tsum = 0;
  int first = 0, n = 0;
  Hash128 tparent;
  bool operator==(const SessRow&) const = default;
};
constexpr const char* kSessCols =
    "SELECT name, tokens, tail_segment, tail_offset, tail_length, tail_checksum, tail_first, tail_n, tail_parent, "
    "durable_pos, meta, sum FROM sessions";
SessRow sess_row(const SqliteStmt& q) {
  SessRow r;
  r.name = q.col_text(0);
  const int32_t* t = static_cast<const int32_t*>(q.col_blob(1));
  r.tokens.assign(t, t + q.col_bytes(1) / 4);
  r.token_bytes = q.col_bytes(1);
  r.tseg = q.col_int(2);
  r.toff = q.col_int(3);
  r.tlen = q.col_int(4);
  r.tsum = uint64_t(q.col_int(5));
  r.first = int(q.col_int(6));
  r.n = int(q.col_int(7));
  r.tparent = q.col_hash(8);
  r.durable = q.col_int(9);
  r.meta = q.col_text(10);
  r.has_sum = !q.col_null(11);
  r.sum = uint64_t(q.col_int(11));
  return r;
}

// Reads the rows of `cols` in key order, `batch` at a time, each batch in a read of its own: a long
// verify holds no snapshot that other processes' changes would leave behind. `each` gets every
// row; `again` re-reads one row by its key now (nullopt: gone).
template <typename Row, typename Key>
Status scan_rows(SqliteDb& db, const std::string& cols, const char* key_col, int batch, Row (*read)(const SqliteStmt&),
                 Key (*key_of)(const Row&), const std::function<Status(Row&)>& each) {
  SqliteStmt first, next;
  const std::string order = std::string(" ORDER BY ") + key_col + " LIMIT " + std::to_string(batch);
  ANVIL_RETURN_IF_ERROR(first.prepare(db, cols + order));
  ANVIL_RETURN_IF_ERROR(next.prepare(db, cols + " WHERE " + key_col + " > ?" + order));
  std::vector<Row> rows;
  bool started = false;
  Key last{};
  while (true) {
    rows.clear();
    SqliteStmt& q = started ? next : first;
    if (started) q.bind(1, last);
    while (true) {
      auto row = q.step();
      if (!row.is_ok()) {
        q.reset();
        return row.status();
      }
      if (!*row) break;
      rows.push_back(read(q));
    }
    q.reset();
    if (rows.empty()) return Status::ok();
    started = true;
    last = key_of(rows.back());
    for (Row& r : rows) ANVIL_RETURN_IF_ERROR(each(r));
  }
}

// Re-reads one row by its key (nullopt: gone).
template <typename Row, typename Key>
Result<std::optional<Row>> reread_row(SqliteStmt& one, const Key& key, Row (*read)(const SqliteStmt&)) {
  one.bind(1, key);
  auto row = one.step();
  if (!row.is_ok()) {
    one.reset();
    return row.status();
  }
  std::optional<Row> out;
  if (*row) out = read(one);
  one.reset();
  return out;
}

// A check that found a problem is done again on the row as the catalog has it now, for as long as
// the row keeps changing: a concurrent gc commits the moved rows of a compacted segment and only
// then deletes its file (compact_segments), eviction deletes rows, and a writer rewrites a
// session's row at every flush, so a stale row can point at a file that is gone or bytes that are
// no longer its. Only a row still there and unchanged (the catalog's current truth) is reported.
template <typename Row, typename Key>
Result<std::string> recheck(SqliteStmt& one, Row& r, const Key& key, Row (*read)(const SqliteStmt&),
                            const std::function<std::string(const Row&)>& check, std::string problem) {
  for (int tries = 0; !problem.empty() && tries < 16; ++tries) {
    ANVIL_ASSIGN_OR_RETURN(auto now, reread_row(one, key, read));
    if (!now) return std::string();  // evicted or removed meanwhile
    if (*now == r) break;            // unchanged: the problem is real
    r = std::move(*now);
    problem = check(r);
  }
  return problem;
}

Hash128 page_key_of(const PageRow& r) { return r.key; }
std::string sess_key_of(const SessRow& r) { return r.name; }

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
  // Each segment's live_bytes against the bytes its rows reference (one statement: one snapshot,
  // and every change of a reference changes live_bytes in the same transaction).
  {
    ANVIL_ASSIGN_OR_RETURN(auto mism, live_bytes_mismatches(db_));
    for (const LiveMismatch& m : mism)
      problems->push_back(segment_file(opts_.dir, m.segment) + ": its catalog row counts " + std::to_string(m.recorded) +
                          " live bytes, its rows reference " + std::to_string(m.referenced) +
                          " (the size cap and compaction go by the count; `anvil kv gc` recounts it)");
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
      // Counted now, not in the snapshot above: a gc may have moved the rows and deleted the file since.
      const std::string sid = std::to_string(id);
      ANVIL_ASSIGN_OR_RETURN(int64_t refs, catalog_int(db_, "SELECT (SELECT COUNT(*) FROM pages WHERE segment = " + sid +
                                                                ") + (SELECT COUNT(*) FROM sessions WHERE tail_segment = " +
                                                                sid + ")"));
      if (refs > 0) problems->push_back(path + ": missing, " + std::to_string(refs) + " records reference it");
    } else if (int64_t(*size) < end) {
      problems->push_back(path + ": " + std::to_string(*size) + " bytes, shorter than its committed " +
                          std::to_string(end));
    }
  }
  // Segment files the catalog does not know: their rows are gone (a lost or damaged catalog WAL
  // rolls the catalog back silently) or a gc was interrupted between its commit and the unlink.
  // Checked again at the end: a segment created after the snapshot above (a writer's, or a
  // concurrent gc's output) is known by then, and one whose row a concurrent gc just deleted is gone.
  std::vector<std::string> unknown;
  if (auto names = env_->list_dir(opts_.dir); names.is_ok())
    for (const std::string& n : *names) {
      int64_t id;
      if (parse_segment_file(n, &id) && !seg_end.count(id)) unknown.push_back(n);
    }
  std::vector<uint8_t> buf;
  // Every page row, each record read and checked (recheck: a concurrent gc or writer).
  {
    SqliteStmt one;
    ANVIL_RETURN_IF_ERROR(one.prepare(db_, std::string(kPageCols) + " WHERE key = ?"));
    std::function<std::string(const PageRow&)> check = [&](const PageRow& r) {
      return check_record(env_, opts_.dir, r.seg, r.off, r.len, r.sum, &r.key, r.parent, r.first_pos, r.tokens.data(),
                          r.tokens.size(), buf);
    };
    Status st = scan_rows<PageRow, Hash128>(db_, kPageCols, "key", 256, page_row, page_key_of,
        [&](PageRow& r) -> Status {
          ++*checked;
          ANVIL_ASSIGN_OR_RETURN(std::string p, recheck(one, r, r.key, page_row, check, check(r)));
          if (!p.empty()) problems->push_back("page " + r.key.hex() + ": " + p);
          return Status::ok();
        });
    ANVIL_RETURN_IF_ERROR(st);
  }
  // Every session row: its checksum, durable position and tail record.
  {
    SqliteStmt one;
    ANVIL_RETURN_IF_ERROR(one.prepare(db_, std::string(kSessCols) + " WHERE name = ?"));
    bool tail_checked = false;
    std::function<std::string(const SessRow&)> check = [&](const SessRow& r) -> std::string {
      tail_checked = false;
      if (std::string why = session_damage(r.token_bytes, r.tokens.data(), r.meta, r.has_sum ? &r.sum : nullptr);
          !why.empty())
        return "session " + r.name + ": " + why;
      if (r.durable > int64_t(r.tokens.size())) return "session " + r.name + ": durable position past its tokens";
      if (r.n <= 0) return "";
      if (size_t(r.first + r.n) > r.tokens.size()) return "session " + r.name + ": tail past its tokens";
      tail_checked = true;
      std::string p = check_record(env_, opts_.dir, r.tseg, r.toff, r.tlen, r.tsum, nullptr, r.tparent, r.first,
                                   r.tokens.data() + r.first, size_t(r.n), buf);
      return p.empty() ? p : "session " + r.name + " tail: " + p;
    };
    Status st = scan_rows<SessRow, std::string>(db_, kSessCols, "name", 64, sess_row, sess_key_of,
        [&](SessRow& r) -> Status {
          ++*checked;
          ANVIL_ASSIGN_OR_RETURN(std::string p, recheck(one, r, r.name, sess_row, check, check(r)));
          if (tail_checked) ++*checked;
          if (!p.empty()) problems->push_back(p);
          return Status::ok();
        });
    ANVIL_RETURN_IF_ERROR(st);
  }
  if (!unknown.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a gc between its commit and the unlink
    for (const std::string& n : unknown) {
      int64_t id = 0;
      parse_segment_file(n, &id);
      ANVIL_ASSIGN_OR_RETURN(int64_t known, catalog_int(db_, "SELECT COUNT(*) FROM segments WHERE id = " + std::to_string(id)));
      auto size = env_->file_size(opts_.dir + "/" + n);
      if (!known && size.is_ok() && *size > 0)
        problems->push_back(opts_.dir + "/" + n + ": " + std::to_string(*size) +
                            " bytes that no catalog row knows (lost catalog rows, or an interrupted gc; `anvil kv gc` "
                            "removes the file)");
    }
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
