// The durable KV store against a real KV pool on the CPU backend: round trips across reopen,
// identity checks (a key match alone is never trusted), corruption and missing files as misses,
// recovery, injected I/O faults (short write, ENOSPC, failed fsync, crash), the bounded queue's
// drop/back-pressure rules, sessions with a partial tail, GC and compaction, recordings cut by a
// crash or a failed commit at random points.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "kvstore/catalog.h"
#include "kvstore/fault_env.h"
#include "kvstore/kvstore.h"
#include "kvstore/session_kind.h"
#include "kvstore/sqlite_db.h"
#include "runtime/kv_pool.h"

namespace anvil {
namespace {

namespace fs = std::filesystem;

constexpr int P = 4;  // page size (tokens)

struct Rig {
  std::unique_ptr<Backend> be = make_cpu_backend(1);
  std::unique_ptr<KVPool> pool;
  Hash128 fp = hash128("test-model", 10);
  FaultEnv env;
  std::string dir;
  explicit Rig(DType dt = DType::kBF16) {
    KVCacheView v;
    v.dtype = dt;
    v.n_layers = 2;
    v.n_kv_heads = 2;
    v.head_dim = 8;
    v.page_size = P;
    v.n_pages = 64;
    pool = std::make_unique<KVPool>(*be, v);
    EXPECT_TRUE(pool->init().is_ok());
    dir = fs::temp_directory_path() / ("anvil_kv_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
  }
  ~Rig() { fs::remove_all(dir); }
  KVStoreOptions opts() {
    KVStoreOptions o;
    o.dir = dir;
    o.env = &env;
    o.flush_ms = 5;
    return o;
  }
  std::unique_ptr<KVStore> open(KVStoreOptions o) {
    auto s = KVStore::open(o);
    EXPECT_TRUE(s.is_ok()) << s.status().message();
    EXPECT_TRUE((*s)->attach(*be, pool->view(), fp).is_ok());
    return std::move(s).value();
  }
  std::unique_ptr<KVStore> open() { return open(opts()); }
  size_t page_bytes() const { return pool->view().page_bytes(); }
  uint8_t* page_ptr(int32_t p) { return static_cast<uint8_t*>(pool->view().base) + size_t(p) * page_bytes(); }
  // A page's bytes: a pattern of (its first token, position in the page).
  void fill(int32_t page, int32_t seed) {
    uint8_t* b = page_ptr(page);
    for (size_t i = 0; i < page_bytes(); ++i) b[i] = uint8_t((seed * 131 + i * 7) & 0xff);
  }
  bool same(int32_t page, int32_t seed) {
    uint8_t* b = page_ptr(page);
    for (size_t i = 0; i < page_bytes(); ++i)
      if (b[i] != uint8_t((seed * 131 + i * 7) & 0xff)) return false;
    return true;
  }
  // Writes pages [first, first + n) of the chain over `tokens` (sequence `seq`), as the engine does.
  void write(KVStore& st, const std::vector<int32_t>& tokens, int first, int n, int seq = 0) {
    Hash128 parent;
    for (int i = 0; i < first + n; ++i) {
      auto toks = std::span<const int32_t>(tokens).subspan(size_t(i) * P, P);
      Hash128 key = kv_page_key(fp, parent, toks);
      if (i >= first) {
        int32_t page = pool->kv_page_alloc();
        fill(page, tokens[size_t(i) * P]);
        st.page_full(seq, key, parent, i * P, toks, page, *pool);
        pool->kv_page_release(page);  // the sequence lets go; the store's retain keeps it alive
      }
      parent = key;
    }
  }
  // Restores as much of the chain as the store has; checks each page's bytes; releases them.
  int restore(KVStore& st, const std::vector<int32_t>& tokens, int max_pages) {
    std::vector<int32_t> pages;
    std::vector<Hash128> keys;
    int n = st.restore_pages(tokens, 0, Hash128{}, max_pages, *pool, &pages, &keys);
    EXPECT_EQ(size_t(n), pages.size());
    for (int i = 0; i < n; ++i) {
      EXPECT_TRUE(same(pages[size_t(i)], tokens[size_t(i) * P])) << "page " << i << " restored with wrong bytes";
      pool->kv_page_release(pages[size_t(i)]);
    }
    return n;
  }
  std::string only_segment() {
    for (auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".kv") return e.path().string();
    return "";
  }
};

std::vector<int32_t> chain_tokens(int n_pages, int base) {
  std::vector<int32_t> t(size_t(n_pages) * P + 1);
  for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t(base + i * 3);
  return t;
}

// Records session `name` over the full pages of `toks` (sequence 0) in a store opened and closed here.
void record_session(Rig& r, const std::string& name, const std::vector<int32_t>& toks, int pages) {
  auto st = r.open();
  ASSERT_TRUE(st->session_begin(name, 0, toks, 64).is_ok());
  r.write(*st, toks, 0, pages);
  ASSERT_TRUE(st->session_end(0, pages * P, -1, *r.pool).is_ok());
}

int64_t verify_problems(KVStore& st) {
  std::vector<std::string> problems;
  int64_t n = 0;
  EXPECT_TRUE(st.verify(&problems, &n).is_ok());
  for (auto& p : problems) std::printf("  verify: %s\n", p.c_str());
  return int64_t(problems.size());
}

TEST(KVStore, PagesSurviveReopenAndAreWrittenOnce) {
  Rig r;
  auto toks = chain_tokens(5, 100);
  {
    auto st = r.open();
    r.write(*st, toks, 0, 5);
    r.write(*st, toks, 0, 5);  // the same pages again: deduplicated, not rewritten
    st->flush();
    st->reap(*r.pool, true);
    EXPECT_EQ(st->counters().pages_written.load(), 5);
    EXPECT_EQ(st->counters().pages_deduped.load(), 5);
    // Bytes written track unique KV: 5 pages plus small headers.
    EXPECT_LE(st->counters().bytes_written.load(), int64_t(5 * r.page_bytes() * 105 / 100 + 5 * 4096));
  }
  EXPECT_EQ(r.pool->n_free(), r.pool->n_pages()) << "every retained page was given back";
  auto st = r.open();
  EXPECT_EQ(r.restore(*st, toks, 5), 5);
  EXPECT_EQ(st->counters().restored_pages.load(), 5);
  // A different continuation shares the first pages only.
  auto other = toks;
  other[size_t(3) * P + 1] += 1;  // page 3 differs
  EXPECT_EQ(r.restore(*st, other, 5), 3);
  EXPECT_EQ(verify_problems(*st), 0);
}

TEST(KVStore, KeyMatchWithOtherTokensIsRejected) {
  Rig r;
  auto a = chain_tokens(1, 100), b = chain_tokens(1, 500);
  auto st = r.open();
  // A record whose key claims tokens b but holds tokens a (what a hash collision would look like).
  Hash128 key_b = kv_page_key(r.fp, Hash128{}, std::span<const int32_t>(b).first(P));
  int32_t page = r.pool->kv_page_alloc();
  r.fill(page, a[0]);
  st->page_full(0, key_b, Hash128{}, 0, std::span<const int32_t>(a).first(P), page, *r.pool);
  r.pool->kv_page_release(page);
  st->flush();
  st->reap(*r.pool, true);
  EXPECT_EQ(r.restore(*st, b, 1), 0);
  EXPECT_EQ(st->counters().restore_corrupt.load(), 1);
  EXPECT_GT(verify_problems(*st), 0) << "verify recomputes the chain key from the record's tokens";
}

TEST(KVStore, OtherFingerprintMisses) {
  Rig r;
  auto toks = chain_tokens(2, 7);
  {
    auto st = r.open();
    r.write(*st, toks, 0, 2);
  }
  r.fp = hash128("another-model", 13);
  auto st = r.open();
  EXPECT_EQ(r.restore(*st, toks, 2), 0);
}

TEST(KVStore, FlippedByteTruncatedOrDeletedSegmentIsAMiss) {
  Rig r;
  auto toks = chain_tokens(4, 9);
  {
    auto st = r.open();
    r.write(*st, toks, 0, 4);
  }
  const std::string seg = r.only_segment();
  ASSERT_FALSE(seg.empty());
  const auto size = fs::file_size(seg);
  {  // flip one byte inside the third record's data
    std::fstream f(seg, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(size * 5 / 8));
    char c;
    f.read(&c, 1);
    f.seekp(std::streamoff(size * 5 / 8));
    c ^= 0x40;
    f.write(&c, 1);
  }
  {
    auto st = r.open();
    EXPECT_EQ(r.restore(*st, toks, 4), 2) << "pages before the corrupt one are used, the rest recomputed";
    EXPECT_EQ(st->counters().restore_corrupt.load(), 1);
    EXPECT_GT(verify_problems(*st), 0);
  }
  fs::resize_file(seg, size / 4 + 10);  // truncated inside the second record
  {
    auto st = r.open();
    EXPECT_EQ(r.restore(*st, toks, 4), 1);
    EXPECT_GT(verify_problems(*st), 0);
  }
  fs::remove(seg);
  {
    auto st = r.open();
    EXPECT_EQ(r.restore(*st, toks, 4), 0);
    EXPECT_GT(verify_problems(*st), 0);
    // The recomputed pages are stored again: the lost segment's rows were dropped.
    r.write(*st, toks, 0, 4);
    st->flush();
    st->reap(*r.pool, true);
  }
  auto st = r.open();
  EXPECT_EQ(r.restore(*st, toks, 4), 4);
  EXPECT_EQ(verify_problems(*st), 0);
}

// A long run is read by several threads where pages are host memory (restore.cpp): a corrupt record
// in the middle still ends the run there, the pages read after it by other threads are given back,
// and every restored page holds its own bytes.
TEST(KVStore, LongRunWithACorruptRecordStopsThereAndLeaksNoPage) {
  Rig r;
  auto toks = chain_tokens(20, 500);
  {
    auto st = r.open();
    r.write(*st, toks, 0, 20);
    st->flush();
    st->reap(*r.pool, true);
  }
  const std::string seg = r.only_segment();
  ASSERT_FALSE(seg.empty());
  const auto size = fs::file_size(seg);
  {  // one byte inside record 13 of 20 (records are equal-sized and in order)
    std::fstream f(seg, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = std::streamoff(size * 13 / 20 + size / 40);
    f.seekp(at);
    char c;
    f.read(&c, 1);
    f.seekp(at);
    c ^= 0x10;
    f.write(&c, 1);
  }
  const int64_t free_before = r.pool->n_free();
  {
    auto st = r.open();
    EXPECT_EQ(r.restore(*st, toks, 20), 13) << "the pages before the corrupt record, each with its own bytes";
    EXPECT_EQ(st->counters().restore_corrupt.load(), 1);
    EXPECT_EQ(r.pool->n_free(), free_before) << "pages read past the corrupt one are given back";
    EXPECT_EQ(r.restore(*st, toks, 12), 12) << "a shorter run of good records";
  }
  EXPECT_EQ(r.pool->n_free(), r.pool->n_pages());
}

TEST(KVStore, DeletedOrGarbageCatalogStartsEmpty) {
  Rig r;
  auto toks = chain_tokens(2, 11);
  {
    auto st = r.open();
    r.write(*st, toks, 0, 2);
  }
  for (const char* f : {"catalog.db", "catalog.db-wal", "catalog.db-shm"}) fs::remove(r.dir + "/" + f);
  {
    auto st = r.open();
    EXPECT_EQ(r.restore(*st, toks, 2), 0);
    auto g = st->gc();  // the old segment is an orphan now: gc removes it
    ASSERT_TRUE(g.is_ok());
    EXPECT_GT(*g, 0);
  }
  {
    std::ofstream(r.dir + "/catalog.db", std::ios::binary | std::ios::trunc) << std::string(8192, 'x');
    fs::remove(r.dir + "/catalog.db-wal");
    fs::remove(r.dir + "/catalog.db-shm");
  }
  auto st = r.open();  // a garbage catalog is moved aside, not an error
  r.write(*st, toks, 0, 2);
  st->flush();
  st->reap(*r.pool, true);
  EXPECT_EQ(r.restore(*st, toks, 2), 2);
}

TEST(KVStore, RecoveryTruncatesUncommittedBytes) {
  Rig r;
  auto toks = chain_tokens(3, 5);
  {
    auto st = r.open();
    r.write(*st, toks, 0, 3);
  }
  const std::string seg = r.only_segment();
  const auto committed = fs::file_size(seg);
  {
    std::ofstream f(seg, std::ios::binary | std::ios::app);
    f << std::string(1000, '\x5a');  // a half-written record of a crashed writer
  }
  auto st = r.open();
  EXPECT_EQ(fs::file_size(seg), committed);
  EXPECT_EQ(r.restore(*st, toks, 3), 3);
  EXPECT_EQ(verify_problems(*st), 0);
}

// A write fault abandons its batch: nothing of it is committed, earlier and later batches are
// intact, and the store verifies clean.
void fault_case(const std::function<void(FaultEnv&)>& inject, const std::function<void(FaultEnv&)>& clear = nullptr) {
  Rig r;
  auto a = chain_tokens(2, 1000), b = chain_tokens(2, 2000), c = chain_tokens(2, 3000);
  {
    auto o = r.opts();
    o.flush_pages = 1000;
    o.flush_ms = 100000;
    auto st = r.open(o);
    r.write(*st, a, 0, 2);
    st->flush();
    inject(r.env);
    r.write(*st, b, 0, 2);
    st->flush();
    if (clear) clear(r.env);
    r.write(*st, c, 0, 2);
    st->flush();
    st->reap(*r.pool, true);
    EXPECT_GE(st->counters().write_errors.load(), 1);
  }
  auto st = r.open();
  EXPECT_EQ(r.restore(*st, a, 2), 2);
  EXPECT_EQ(r.restore(*st, b, 2), 0);
  EXPECT_EQ(r.restore(*st, c, 2), 2);
  EXPECT_EQ(verify_problems(*st), 0);
}

TEST(KVStoreFaults, ShortWrite) { fault_case([](FaultEnv& e) { e.fail_next_append_short(); }); }
TEST(KVStoreFaults, NoSpaceLeft) {
  fault_case([](FaultEnv& e) { e.set_space_left(100); }, [](FaultEnv& e) { e.set_space_left(-1); });
}
TEST(KVStoreFaults, FailedFsyncCommitsNothing) { fault_case([](FaultEnv& e) { e.fail_syncs(1); }); }

TEST(KVStoreFaults, NoSpaceThenSpaceAgain) {
  Rig r;
  auto a = chain_tokens(3, 77);
  {
    auto st = r.open();
    r.env.set_space_left(0);
    r.write(*st, a, 0, 3);
    st->flush();
    r.env.set_space_left(-1);
    r.write(*st, a, 0, 3);  // the failed pages are not in the catalog, so they are written now
    st->flush();
    st->reap(*r.pool, true);
  }
  auto st = r.open();
  EXPECT_EQ(r.restore(*st, a, 3), 3);
  EXPECT_EQ(verify_problems(*st), 0);
}

TEST(KVStoreFaults, CrashDropsUnsyncedBytesCommittedPagesSurvive) {
  Rig r;
  auto a = chain_tokens(2, 10), b = chain_tokens(3, 20);
  {
    auto o = r.opts();
    o.flush_pages = 1000;
    o.flush_ms = 100000;
    auto st = r.open(o);
    r.write(*st, a, 0, 2);
    st->flush();  // synced + committed
    r.write(*st, b, 0, 3);
    for (int i = 0; i < 2000 && st->counters().pages_written.load() < 5; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(st->counters().pages_written.load(), 5) << "b's records appended, not yet synced";
    st->abandon();  // the process dies here ...
    ASSERT_TRUE(r.env.crash().is_ok());  // ... and the machine loses what was not synced
    st->reap(*r.pool, false);
  }
  auto st = r.open();
  EXPECT_EQ(r.restore(*st, a, 2), 2);
  EXPECT_EQ(r.restore(*st, b, 3), 0);
  EXPECT_EQ(verify_problems(*st), 0);
}

TEST(KVStoreFaults, DurabilityNoneCrashIsStillNeverWrongKV) {
  Rig r;
  auto a = chain_tokens(3, 10);
  {
    auto o = r.opts();
    o.durability = Durability::kNone;  // rows are committed without an fsync of their data
    auto st = r.open(o);
    r.write(*st, a, 0, 3);
    st->flush();
    EXPECT_EQ(st->counters().fsyncs.load(), 0);
    st->abandon();
    ASSERT_TRUE(r.env.crash().is_ok());
    st->reap(*r.pool, false);
  }
  auto st = r.open();
  EXPECT_EQ(r.restore(*st, a, 3), 0) << "the rows reference lost bytes: misses, not garbage";
  EXPECT_GT(verify_problems(*st), 0);
}

// What a restarted server warms (KVStore::recent_prefixes): whole chains from this model's root,
// the most recently used first, a shared prefix counted once against the budget, the last chain
// cut to fit; a chain with a missing link, or another model's pages, never.
TEST(KVStore, RecentPrefixesAreWholeChainsMostRecentFirst) {
  Rig r;
  auto a = chain_tokens(5, 100);
  auto b = a;
  for (size_t i = 2 * P; i < b.size(); ++i) b[i] += 7;  // b shares a's first 2 pages
  auto c = chain_tokens(4, 900);
  auto page_tokens = [](const std::vector<int32_t>& t, int n) {
    return std::vector<int32_t>(t.begin(), t.begin() + n * P);
  };
  {
    auto st = r.open();
    r.write(*st, a, 0, 5);
    st->flush();
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    r.write(*st, b, 2, 3);  // b's own pages (its first 2 are a's)
    st->flush();
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    r.write(*st, c, 2, 2);  // c's pages 2-3 only: its chain has no root
    st->flush();
    st->reap(*r.pool, true);
  }
  {  // Another model's chain in the same directory, written last: not ours.
    const Hash128 ours = r.fp;
    r.fp = hash128("other-model", 11);
    auto st = r.open();
    r.write(*st, chain_tokens(3, 500), 0, 3);
    st->flush();
    st->reap(*r.pool, true);
    r.fp = ours;
  }
  auto st = r.open();
  auto all = st->recent_prefixes(100);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0], page_tokens(b, 5));
  EXPECT_EQ(all[1], page_tokens(a, 5));
  auto cut = st->recent_prefixes(6);  // b's 5 pages, then 1 of a's own beyond the 2 shared
  ASSERT_EQ(cut.size(), 2u);
  EXPECT_EQ(cut[0], page_tokens(b, 5));
  EXPECT_EQ(cut[1], page_tokens(a, 3));
  auto one = st->recent_prefixes(3);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0], page_tokens(b, 3));
  EXPECT_TRUE(st->recent_prefixes(0).empty());
}

// The writer's writeback hints (AppendFile::start_writeback): given per record when the threshold
// is a byte, never under durability none; the store's pages and the flush's fdatasync are as
// without them, and the time in fdatasync and in commits is counted.
TEST(KVStore, WritebackHintsAreGivenAndChangeNothing) {
  Rig r;
  auto a = chain_tokens(5, 40), b = chain_tokens(4, 90);
  {
    auto o = r.opts();
    o.writeback_bytes = 1;
    auto st = r.open(o);
    r.write(*st, a, 0, 5);
    st->flush();
    st->reap(*r.pool, true);
    EXPECT_GE(r.env.writebacks(), 5) << "one hint per record at a one-byte threshold";
    EXPECT_GT(st->counters().fsyncs.load(), 0);
    EXPECT_GT(st->counters().sync_ns.load(), 0);
    EXPECT_GT(st->counters().commit_ns.load(), 0);
    EXPECT_LE(st->counters().sync_ns.load() + st->counters().commit_ns.load(), st->counters().writer_busy_ns.load());
  }
  const int64_t after_a = r.env.writebacks();
  {
    auto o = r.opts();
    o.writeback_bytes = 1;
    o.durability = Durability::kNone;
    auto st = r.open(o);
    r.write(*st, b, 0, 4);
    st->flush();
    st->reap(*r.pool, true);
    EXPECT_EQ(r.env.writebacks(), after_a) << "durability none: nothing to start early";
    EXPECT_EQ(st->counters().sync_ns.load(), 0);
  }
  auto st = r.open();
  EXPECT_EQ(r.restore(*st, a, 5), 5);
  EXPECT_EQ(r.restore(*st, b, 4), 4);
  EXPECT_EQ(verify_problems(*st), 0);
}

// The real file system's hint between appends, a truncation and a sync: the file holds exactly
// the bytes appended (after the cut), at the sizes reported.
TEST(KVEnv, PosixWritebackKeepsTheBytes) {
  const std::string path =
      (fs::temp_directory_path() / ("anvil_wb_" + std::to_string(::getpid()) + ".bin")).string();
  fs::remove(path);
  std::vector<uint8_t> want;
  auto chunk = [&](size_t n, int seed) {
    std::vector<uint8_t> c(n);
    for (size_t i = 0; i < n; ++i) c[i] = uint8_t((i * 2654435761u + unsigned(seed)) >> 13);
    return c;
  };
  {
    auto f = Env::posix()->open_append(path);
    ASSERT_TRUE(f.is_ok()) << f.status().message();
    AppendFile& af = **f;
    for (int k = 0; k < 3; ++k) {
      auto c = chunk(size_t(1) << 20, k);
      ASSERT_TRUE(af.append(c.data(), c.size()).is_ok());
      want.insert(want.end(), c.begin(), c.end());
      af.start_writeback();
    }
    ASSERT_TRUE(af.truncate(uint64_t(2) << 20).is_ok());  // after its bytes were handed to the disk
    want.resize(size_t(2) << 20);
    af.start_writeback();  // nothing new: a no-op
    auto c = chunk(size_t(1) << 19, 7);
    ASSERT_TRUE(af.append(c.data(), c.size()).is_ok());
    want.insert(want.end(), c.begin(), c.end());
    af.start_writeback();
    EXPECT_EQ(af.size(), want.size());
    ASSERT_TRUE(af.sync().is_ok());
  }
  auto rf = Env::posix()->open_read(path);
  ASSERT_TRUE(rf.is_ok());
  auto sz = (*rf)->size();
  ASSERT_TRUE(sz.is_ok());
  ASSERT_EQ(*sz, want.size());
  std::vector<uint8_t> got(want.size());
  ASSERT_TRUE((*rf)->read_at(0, got.data(), got.size()).is_ok());
  EXPECT_TRUE(got == want);
  fs::remove(path);
}

TEST(KVStore, FullQueueDropsAnonymousPagesButBlocksASession) {
  Rig r;
  auto o = r.opts();
  o.queue_pages = 2;
  auto st = r.open(o);
  r.env.hold_appends(true);  // a stalled disk
  auto a = chain_tokens(7, 100);
  r.write(*st, a, 0, 1);
  for (int i = 0; i < 5000 && st->queued() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(st->queued(), 0u) << "the writer took the first page and is stuck writing it";
  r.write(*st, a, 1, 6);  // the ring holds 2: the other 4 are dropped
  EXPECT_EQ(st->counters().pages_dropped.load(), 4);
  // A session's page waits for room instead.
  auto s = chain_tokens(1, 900);
  ASSERT_TRUE(st->session_begin("s", /*seq=*/7, s, 64).is_ok());
  std::atomic<bool> done{false};
  std::thread t([&] {
    r.write(*st, s, 0, 1, /*seq=*/7);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(done.load()) << "a session page must not be dropped; dropped " << st->counters().pages_dropped.load()
                            << " enq " << st->counters().pages_enqueued.load() << " hw " << st->counters().queue_high_water.load();
  r.env.hold_appends(false);
  t.join();
  EXPECT_TRUE(done.load());
  auto d = st->session_end(7, P, -1, *r.pool);
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(*d, P);
  EXPECT_GT(st->counters().decode_blocked_ns.load(), 100'000'000);
}

// A session's row that cannot be committed (here another connection holds the catalog's write
// lock past the busy timeout, as a full disk fails SQLite's commit) is reported by session_finish
// instead of lost silently; a row that failed once is written again by the next flush.
TEST(KVStore, ASessionWhoseRowCannotCommitIsReportedAndRetried) {
  Rig r;
  auto o = r.opts();
  o.busy_timeout_ms = 20;
  auto st = r.open(o);
  auto toks = chain_tokens(3, 500);  // 3 full pages
  SqliteDb other;
  ASSERT_TRUE(other.open(r.dir + "/catalog.db", 1000).is_ok());
  // 1. The lock held through the session's end: its last state never commits.
  ASSERT_TRUE(st->session_begin("lost", 0, toks, 64).is_ok());
  ASSERT_TRUE(other.exec("BEGIN IMMEDIATE").is_ok());
  r.write(*st, toks, 0, 3);
  auto d = st->session_end(0, 3 * P, -1, *r.pool);
  ASSERT_FALSE(d.is_ok()) << "the session's row never committed, so it must not be reported saved";
  EXPECT_NE(d.status().message().find("session 'lost' was not saved"), std::string::npos) << d.status().message();
  EXPECT_GE(st->counters().write_errors.load(), 1);
  ASSERT_TRUE(other.exec("ROLLBACK").is_ok());
  // 2. The lock held for a while mid-recording, then let go: the next flush writes the row again.
  auto toks2 = chain_tokens(3, 900);
  ASSERT_TRUE(st->session_begin("kept", 1, toks2, 64).is_ok());
  ASSERT_TRUE(other.exec("BEGIN IMMEDIATE").is_ok());
  const int64_t errors = st->counters().write_errors.load();
  r.write(*st, toks2, 0, 3, /*seq=*/1);
  for (int i = 0; i < 2000 && st->counters().write_errors.load() == errors; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_GT(st->counters().write_errors.load(), errors) << "a commit must have failed while the lock was held";
  ASSERT_TRUE(other.exec("ROLLBACK").is_ok());
  d = st->session_end(1, 3 * P, -1, *r.pool);
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  auto info = st->get_session("kept");
  ASSERT_TRUE(info.is_ok() && *info);
  EXPECT_EQ((*info)->tokens, toks2);
  auto lost = st->get_session("lost");
  ASSERT_TRUE(lost.is_ok());
  EXPECT_FALSE(*lost) << "no state of 'lost' ever committed";
}

// A session of no tokens (anvil run's conversation after /reset: its meta is what it holds) is saved
// and read back: its empty token list was bound as NULL, which the catalog's NOT NULL column refused
// ("session 'empty' was not saved"), and the session kept its earlier state.
TEST(KVStore, SessionOfNoTokensIsSaved) {
  Rig r;
  auto toks = chain_tokens(2, 70);
  record_session(r, "empty", toks, 2);
  {
    auto st = r.open();
    ASSERT_TRUE(st->session_begin("empty", 0, std::vector<int32_t>{}, 64, "cleared").is_ok());
    auto d = st->session_end(0, 0, -1, *r.pool);
    ASSERT_TRUE(d.is_ok()) << d.status().message();
    EXPECT_EQ(*d, 0);
  }
  auto st = r.open();
  auto info = st->get_session("empty");
  ASSERT_TRUE(info.is_ok() && *info) << (info.is_ok() ? "no session" : info.status().message());
  EXPECT_TRUE((*info)->tokens.empty());
  EXPECT_EQ((*info)->durable_pos, 0);
  EXPECT_EQ((*info)->meta, "cleared");
  EXPECT_EQ(verify_problems(*st), 0);
}

TEST(KVStore, SessionTailRestoresExactRows) {
  Rig r;
  auto toks = chain_tokens(3, 40);  // 13 tokens: 3 full pages + 1
  toks.push_back(999);
  toks.push_back(998);              // 15 tokens
  const int n_kv = 14;              // KV for 14 of them: the tail page holds 2
  {
    auto st = r.open();
    ASSERT_TRUE(st->session_begin("chat", 0, toks, 64, "meta!").is_ok());
    r.write(*st, toks, 0, 3);
    int32_t tail = r.pool->kv_page_alloc();
    r.fill(tail, 4242);
    auto d = st->session_end(0, n_kv, tail, *r.pool);
    ASSERT_TRUE(d.is_ok());
    EXPECT_EQ(*d, n_kv);
    r.pool->kv_page_release(tail);
  }
  auto st = r.open();
  auto info = st->get_session("chat");
  ASSERT_TRUE(info.is_ok() && *info);
  EXPECT_EQ((*info)->tokens, toks);
  EXPECT_EQ((*info)->durable_pos, n_kv);
  EXPECT_EQ((*info)->meta, "meta!");
  std::vector<int32_t> pages;
  std::vector<Hash128> keys;
  ASSERT_EQ(st->restore_pages(toks, 0, Hash128{}, 3, *r.pool, &pages, &keys), 3);
  int32_t tp = -1;
  ASSERT_EQ(st->restore_tail(toks, 3 * P, keys.back(), int(toks.size()) - 1 - 3 * P, *r.pool, &tp), 2);
  // Rows 0..1 of every (layer, k/v, head) block equal the original; the page is otherwise fresh.
  const PageLayout L{DType::kBF16, 2, 2, 8, P};
  std::vector<uint8_t> want(r.page_bytes());
  for (size_t i = 0; i < want.size(); ++i) want[i] = uint8_t((4242 * 131 + i * 7) & 0xff);
  for (size_t b = 0; b < L.n_blocks(); ++b)
    EXPECT_EQ(std::memcmp(r.page_ptr(tp) + b * L.block_bytes(P), want.data() + b * L.block_bytes(P), L.block_bytes(2)), 0);
  // A request whose tokens differ inside the tail gets no tail.
  auto other = toks;
  other[13] += 1;
  int32_t tp2 = -1;
  EXPECT_EQ(st->restore_tail(other, 3 * P, keys.back(), 2, *r.pool, &tp2), 0);
  // Fork: the new session shares everything; removing the original keeps the fork's pages.
  ASSERT_TRUE(st->fork_session("chat", "chat2").is_ok());
  EXPECT_FALSE(st->fork_session("chat", "chat2").is_ok());
  ASSERT_TRUE(st->remove_session("chat").is_ok());
  auto f = st->get_session("chat2");
  ASSERT_TRUE(f.is_ok() && *f);
  EXPECT_EQ((*f)->tokens, toks);
  ASSERT_TRUE(st->gc(0).is_ok());
  for (int32_t p : pages) r.pool->kv_page_release(p);
  r.pool->kv_page_release(tp);
  EXPECT_EQ(r.restore(*st, toks, 3), 3) << "pages a session references are never evicted";
  const std::string out = r.dir + "/export.safetensors";
  ASSERT_TRUE(st->export_session("chat2", out).is_ok());
  EXPECT_EQ(verify_problems(*st), 0);
}

TEST(KVStore, GcEvictsLeastRecentlyUsedAndCompacts) {
  Rig r;
  auto o = r.opts();
  o.segment_bytes = 1;  // a segment per flush, so old ones are sealed and compactable
  std::vector<std::vector<int32_t>> chains;
  {
    auto st = r.open(o);
    for (int c = 0; c < 6; ++c) {
      chains.push_back(chain_tokens(2, 10000 * (c + 1)));
      r.write(*st, chains.back(), 0, 2);
      st->flush();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // distinct last_used
    }
    st->reap(*r.pool, true);
    EXPECT_EQ(r.restore(*st, chains[0], 2), 2);  // chain 0 is used again: most recent now
    st->flush();
  }
  const auto before = fs::directory_iterator(r.dir);
  auto st = r.open(o);
  const StoreStats s0 = st->stats();
  EXPECT_EQ(s0.pages, 12);
  auto reclaimed = st->gc(uint64_t(s0.page_bytes / 2));
  ASSERT_TRUE(reclaimed.is_ok()) << reclaimed.status().message();
  const StoreStats s1 = st->stats();
  EXPECT_LE(s1.page_bytes, s0.page_bytes / 2);
  EXPECT_GT(*reclaimed, 0);
  EXPECT_LT(s1.segment_file_bytes, s0.segment_file_bytes);
  EXPECT_EQ(r.restore(*st, chains[0], 2), 2) << "recently used: kept";
  EXPECT_EQ(r.restore(*st, chains[1], 2), 0) << "least recently used: evicted";
  EXPECT_EQ(r.restore(*st, chains[5], 2), 2);
  EXPECT_EQ(verify_problems(*st), 0);
}

TEST(KVStore, RecordIsReadableBySafetensorsPython) {
  if (std::system("python3 -c 'import safetensors, numpy' 2>/dev/null") != 0)
    GTEST_SKIP() << "python3 with safetensors and numpy is not installed";
  Rig r(DType::kF32);
  auto toks = chain_tokens(1, 321);
  {
    auto st = r.open();
    r.write(*st, toks, 0, 1);
  }
  const std::string seg = r.only_segment();
  // The segment holds exactly one record; numpy checks layer 1's V against the fill pattern.
  const std::string py =
      "import sys, numpy as np\n"
      "from safetensors.numpy import load\n"
      "from safetensors import safe_open\n"
      "d = load(open(sys.argv[1], 'rb').read())\n"
      "assert sorted(d) == ['layer.0.k', 'layer.0.v', 'layer.1.k', 'layer.1.v'], sorted(d)\n"
      "v = d['layer.1.v']\n"
      "assert v.shape == (2, 4, 8) and v.dtype == np.float32, (v.shape, v.dtype)\n"
      "page = np.array([(321 * 131 + i * 7) & 0xff for i in range(2 * 2 * 2 * 4 * 8 * 4)], np.uint8)\n"
      "want = page.view(np.float32).reshape(2, 2, 2, 4, 8)[1, 1]\n"
      "assert np.array_equal(v.view(np.uint32), want.view(np.uint32))\n"
      "m = safe_open(sys.argv[1], 'np').metadata()\n"
      "assert m['anvil.format'] == 'kv-page' and m['tokens'] == '321,324,327,330', m\n"
      "print('ok')\n";
  const std::string script = r.dir + "/check.py";
  std::ofstream(script) << py;
  FILE* p = popen(("python3 " + script + " " + seg + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096];
  std::string out;
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << out;
  EXPECT_EQ(out, "ok\n");
}

// The server records one session per running request: several at once, interleaved, each with its
// own tokens, tail and meta; a preempted request's recording is detached and bound again.
TEST(KVStore, SessionsRecordedAtOnceStayApart) {
  Rig r;
  auto a = chain_tokens(3, 40), b = chain_tokens(2, 700);  // 13 and 9 tokens
  const int kv_a = 13, kv_b = 9;                           // 3 and 2 full pages + 1 row each
  {
    auto st = r.open();
    ASSERT_TRUE(st->session_begin("a", 0, a, 64).is_ok());
    ASSERT_TRUE(st->session_begin("b", 1, b, 64).is_ok());
    EXPECT_FALSE(st->session_begin("a", 2, b, 64).is_ok()) << "one name, one recording";
    EXPECT_FALSE(st->session_begin("c", 1, b, 64).is_ok()) << "one sequence, one recording";
    EXPECT_TRUE(st->session_recording("a"));
    r.write(*st, a, 0, 2, 0);
    r.write(*st, b, 0, 2, 1);
    r.write(*st, a, 2, 1, 0);
    const int32_t t14 = 14, t9 = 900;
    st->session_note(0, std::span<const int32_t>(&t14, 1), kv_a, -1, *r.pool);  // a: 14 tokens
    // b is preempted: detached, a note to its old sequence is not b's; bound to sequence 5 again.
    ASSERT_TRUE(st->session_rebind("b", -1).is_ok());
    st->session_note(1, std::span<const int32_t>(&t9, 1), 8, -1, *r.pool);
    ASSERT_TRUE(st->session_rebind("b", 5).is_ok());
    st->session_note(5, std::span<const int32_t>(&t9, 1), kv_b, -1, *r.pool);  // b: 10 tokens
    int32_t tail_a = r.pool->kv_page_alloc(), tail_b = r.pool->kv_page_alloc();
    r.fill(tail_a, 1111);
    r.fill(tail_b, 2222);
    ASSERT_TRUE(st->session_close("b", kv_b, tail_b, *r.pool).is_ok());
    ASSERT_TRUE(st->session_close("a", kv_a, tail_a, *r.pool).is_ok());
    EXPECT_FALSE(st->session_close("a", kv_a, tail_a, *r.pool).is_ok()) << "closed twice";
    auto db = st->session_finish("b", "meta-b");
    auto da = st->session_finish("a", "meta-a");
    ASSERT_TRUE(da.is_ok() && db.is_ok());
    EXPECT_EQ(*da, kv_a);
    EXPECT_EQ(*db, kv_b);
    EXPECT_FALSE(st->session_recording("a"));
    st->reap(*r.pool, true);
    r.pool->kv_page_release(tail_a);
    r.pool->kv_page_release(tail_b);
  }
  auto st = r.open();
  auto ia = st->get_session("a"), ib = st->get_session("b");
  ASSERT_TRUE(ia.is_ok() && *ia && ib.is_ok() && *ib);
  auto want_a = a, want_b = b;
  want_a.push_back(14);
  want_b.push_back(900);
  EXPECT_EQ((*ia)->tokens, want_a);
  EXPECT_EQ((*ib)->tokens, want_b) << "the note to b's old sequence must not count";
  EXPECT_EQ((*ia)->durable_pos, kv_a);
  EXPECT_EQ((*ib)->durable_pos, kv_b);
  EXPECT_EQ((*ia)->meta, "meta-a");
  EXPECT_EQ((*ib)->meta, "meta-b");
  // Each tail holds its own rows.
  for (auto [toks, kv, seed] : {std::tuple{want_a, kv_a, 1111}, std::tuple{want_b, kv_b, 2222}}) {
    std::vector<int32_t> pages;
    std::vector<Hash128> keys;
    const int full = kv / P;
    ASSERT_EQ(st->restore_pages(toks, 0, Hash128{}, full, *r.pool, &pages, &keys), full);
    int32_t tp = -1;
    ASSERT_EQ(st->restore_tail(toks, full * P, keys.back(), int(toks.size()) - 1 - full * P, *r.pool, &tp), kv % P);
    EXPECT_EQ(r.page_ptr(tp)[0], uint8_t((seed * 131) & 0xff));
    for (int32_t p : pages) r.pool->kv_page_release(p);
    r.pool->kv_page_release(tp);
  }
}

// ---- accounting (segments.live_bytes), verify under a concurrent gc, healing a damaged run ----

// Each segment's live_bytes against the bytes its rows reference, computed here independently of the
// store: every page row's length, plus each distinct session tail record once. "" when all agree.
std::string live_bytes_drift(const std::string& dir) {
  SqliteDb db;
  if (!db.open(dir + "/catalog.db", 1000).is_ok()) return "cannot open the catalog";
  SqliteStmt segs;
  EXPECT_TRUE(segs.prepare(db, "SELECT id, live_bytes FROM segments").is_ok());
  std::map<int64_t, int64_t> recorded, referenced;
  while (*segs.step()) recorded[segs.col_int(0)] = segs.col_int(1);
  SqliteStmt pages;
  EXPECT_TRUE(pages.prepare(db, "SELECT segment, length FROM pages").is_ok());
  while (*pages.step()) referenced[pages.col_int(0)] += pages.col_int(1);
  SqliteStmt tails;
  EXPECT_TRUE(tails.prepare(db, "SELECT tail_segment, tail_offset, tail_length FROM sessions WHERE tail_segment IS "
                                "NOT NULL AND tail_length > 0").is_ok());
  std::set<std::pair<int64_t, int64_t>> seen;
  while (*tails.step())
    if (seen.insert({tails.col_int(0), tails.col_int(1)}).second) referenced[tails.col_int(0)] += tails.col_int(2);
  std::string out;
  for (auto [id, live] : recorded)
    if (live != referenced[id])
      out += "segment " + std::to_string(id) + ": live_bytes " + std::to_string(live) + ", referenced " +
             std::to_string(referenced[id]) + "; ";
  for (auto [id, bytes] : referenced)
    if (!recorded.count(id) && bytes > 0) out += "segment " + std::to_string(id) + " has no row but is referenced; ";
  return out;
}

int64_t total_live_bytes(const std::string& dir) {
  SqliteDb db;
  EXPECT_TRUE(db.open(dir + "/catalog.db", 1000).is_ok());
  return *catalog_live_bytes(db);
}

std::vector<std::string> verify_list(KVStore& st) {
  std::vector<std::string> problems;
  int64_t n = 0;
  EXPECT_TRUE(st.verify(&problems, &n).is_ok());
  for (auto& p : problems) std::printf("  verify: %s\n", p.c_str());
  return problems;
}

// Records (or continues) session `name` as the engine does: its full pages, then a tail of the
// rows past the last page boundary (none when n_kv ends on one).
void save_session(Rig& r, KVStore& st, const std::string& name, const std::vector<int32_t>& toks, int n_kv,
                  int seed = 77, bool all_durable = true) {
  ASSERT_TRUE(st.session_begin(name, 0, toks, 256).is_ok());
  r.write(st, toks, 0, n_kv / P);
  int32_t tail = -1;
  if (n_kv % P) {
    tail = r.pool->kv_page_alloc();
    r.fill(tail, seed);
  }
  auto d = st.session_end(0, n_kv, tail, *r.pool);
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  if (all_durable) EXPECT_GE(*d, n_kv);  // more where another session stored the page the tail is part of
  if (tail >= 0) r.pool->kv_page_release(tail);
}

// Session "s" saved in a store of its own: 2 full pages of chain_tokens(2, 600), 2 more tokens, and
// KV for 10 of its 11 tokens (a tail of 2 rows at 8). Returns its tokens.
std::vector<int32_t> save_pages_and_a_tail(Rig& r) {
  auto toks = chain_tokens(2, 600);  // 9 tokens
  toks.push_back(77);
  toks.push_back(78);
  auto st = r.open();
  save_session(r, *st, "s", toks, 10, /*seed=*/4242);
  return toks;
}

// A fork shares its parent's tail record: counted once, however many sessions reference it, and
// gone only with the last of them. A resume whose KV ends on a page boundary drops the old tail.
TEST(KVStoreAccounting, LiveBytesFollowForksRemovesAndBoundaryResumes) {
  Rig r;
  {
    auto st = r.open();
    auto toks = chain_tokens(3, 40);  // 13 tokens
    toks.push_back(5);
    save_session(r, *st, "a", toks, 14);  // 3 pages + a tail of 2
    EXPECT_EQ(live_bytes_drift(r.dir), "");
    for (const char* f : {"b", "c", "d"}) {
      ASSERT_TRUE(st->fork_session("a", f).is_ok());
      EXPECT_EQ(live_bytes_drift(r.dir), "") << "after fork " << f;
    }
    // A fork continued: its row takes a tail of its own, the shared one stays (a, c, d have it).
    auto more = toks;
    more.push_back(6);
    save_session(r, *st, "b", more, 15);
    EXPECT_EQ(live_bytes_drift(r.dir), "") << "after b's own turn";
    for (const char* f : {"a", "b", "c", "d"}) {
      ASSERT_TRUE(st->remove_session(f).is_ok());
      EXPECT_EQ(live_bytes_drift(r.dir), "") << "after rm " << f;
    }
    ASSERT_TRUE(st->gc(0).is_ok());
    EXPECT_EQ(st->stats().pages, 0) << "no session left: gc --max 0 evicts every page";
    EXPECT_EQ(total_live_bytes(r.dir), 0);
    EXPECT_EQ(live_bytes_drift(r.dir), "");
  }
  {
    auto st = r.open();
    auto toks = chain_tokens(2, 900);  // 9 tokens
    save_session(r, *st, "x", toks, 9);  // 2 pages + a tail of 1
    auto more = chain_tokens(3, 900);
    more.resize(16);  // 4 full pages
    more.push_back(1);
    save_session(r, *st, "x", more, 16);  // ends on a page boundary: the row has no tail any more
    auto info = st->get_session("x");
    ASSERT_TRUE(info.is_ok() && *info);
    EXPECT_EQ((*info)->tail_n, 0);
    EXPECT_EQ(live_bytes_drift(r.dir), "") << "the old tail's bytes are dead";
    EXPECT_EQ(verify_problems(*st), 0);
  }
}

// A random sequence of saves, resumes (a tail or a page boundary), forks, removals, gc at several
// caps, with segments rolling over every few records (compaction) and a small cap (the writer's own
// eviction), reopening the store now and then: after every step live_bytes equals the bytes the
// rows reference, and verify finds nothing. Every save and resume ends with all its KV durable: under
// so small a cap the writer evicted a recording's pages before its row referenced them (invariant 7).
TEST(KVStoreAccounting, RandomSaveResumeForkRmGcKeepsLiveBytesExact) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    Rig r;
    std::mt19937 rng(seed);
    auto pick = [&](int n) { return int(rng() % uint32_t(n)); };
    auto o = r.opts();
    o.segment_bytes = 3 * r.page_bytes();
    o.max_bytes = 24 * r.page_bytes();
    std::map<std::string, std::vector<int32_t>> sessions;  // what the test expects the store to hold
    int next_name = 0;
    auto st = r.open(o);
    for (int step = 0; step < 120; ++step) {
      const int op = pick(10);
      std::string what;
      if (op < 3 || sessions.empty()) {  // a new session
        const std::string name = "s" + std::to_string(next_name++);
        auto toks = chain_tokens(1 + pick(4), 1000 * (1 + pick(6)));  // shared prefixes now and then
        toks.resize(toks.size() - 1 + size_t(pick(P)));
        const int n_kv = int(toks.size()) - pick(2);
        what = "save " + name + " n_kv " + std::to_string(n_kv);
        save_session(r, *st, name, toks, n_kv, step);
        sessions[name] = toks;
      } else if (op < 6) {  // a resume: a few more tokens, restored from the store first
        auto it = std::next(sessions.begin(), pick(int(sessions.size())));
        auto toks = it->second;
        for (int k = pick(7); k > 0; --k) toks.push_back(int32_t(rng() % 5000));
        if (toks.size() > 200) continue;
        const int n_kv = int(toks.size()) - pick(2);
        what = "resume " + it->first + " n_kv " + std::to_string(n_kv);
        r.restore(*st, toks, n_kv / P);
        save_session(r, *st, it->first, toks, n_kv, step);
        it->second = toks;
      } else if (op < 7) {
        auto it = std::next(sessions.begin(), pick(int(sessions.size())));
        const std::string name = "s" + std::to_string(next_name++);
        what = "fork " + it->first + " -> " + name;
        ASSERT_TRUE(st->fork_session(it->first, name).is_ok());
        sessions[name] = it->second;
      } else if (op < 9) {
        auto it = std::next(sessions.begin(), pick(int(sessions.size())));
        what = "rm " + it->first;
        ASSERT_TRUE(st->remove_session(it->first).is_ok());
        sessions.erase(it);
      } else {
        const uint64_t caps[] = {0, uint64_t(st->stats().page_bytes / 2), 1ull << 40};
        const uint64_t cap = caps[pick(3)];
        what = "gc " + std::to_string(cap);
        ASSERT_TRUE(st->gc(cap).is_ok());
      }
      st->flush();
      ASSERT_EQ(live_bytes_drift(r.dir), "") << "seed " << seed << " step " << step << ": " << what;
      if (pick(8) == 0) {  // a new process: a new segment, the recount at start finds nothing to do
        st.reset();
        st = r.open(o);
      }
    }
    EXPECT_EQ(verify_problems(*st), 0) << "seed " << seed;
    for (auto& [name, toks] : sessions) {
      auto info = st->get_session(name);
      ASSERT_TRUE(info.is_ok() && *info) << name;
      EXPECT_EQ((*info)->tokens, toks) << name;
    }
    // Every session removed and a cap of 0: nothing is left live.
    for (auto& [name, toks] : sessions) ASSERT_TRUE(st->remove_session(name).is_ok());
    ASSERT_TRUE(st->gc(0).is_ok());
    EXPECT_EQ(st->stats().pages, 0) << "seed " << seed;
    EXPECT_EQ(total_live_bytes(r.dir), 0) << "seed " << seed;
  }
}

// ---- eviction under the size cap: a session being recorded keeps its pages ----

// Which pages of the chain over `toks` (pages [0, n)) the catalog holds now, read on a connection
// of its own (a restore would touch them, changing the LRU order under test).
std::vector<bool> pages_held(Rig& r, const std::vector<int32_t>& toks, int n) {
  SqliteDb db;
  EXPECT_TRUE(db.open(r.dir + "/catalog.db", 1000).is_ok());
  SqliteStmt q;
  EXPECT_TRUE(q.prepare(db, "SELECT COUNT(*) FROM pages WHERE key = ?").is_ok());
  std::vector<bool> held;
  Hash128 parent;
  for (int i = 0; i < n; ++i) {
    const Hash128 key = kv_page_key(r.fp, parent, std::span<const int32_t>(toks).subspan(size_t(i) * P, P));
    q.bind(1, key);
    auto row = q.step();
    held.push_back(row.is_ok() && *row && q.col_int(0) == 1);
    q.reset();
    parent = key;
  }
  return held;
}

int count_held(const std::vector<bool>& held) { return int(std::count(held.begin(), held.end(), true)); }

// The bytes one page's record takes in the store (what the cap counts per page).
uint64_t page_record_bytes() {
  Rig r;
  {
    auto st = r.open();
    r.write(*st, chain_tokens(1, 5), 0, 1);
  }
  auto st = r.open();
  return uint64_t(st->stats().page_bytes);
}

// Anonymous traffic (another request's prompt, a prefix): `chains` chains of `pages` pages each,
// each committed by a flush of its own, so every one is more recent than what came before.
void anonymous_traffic(Rig& r, KVStore& st, int chains, int pages, int base) {
  for (int c = 0; c < chains; ++c) {
    r.write(st, chain_tokens(pages, base + 7919 * c), 0, pages, /*seq=*/40 + c);
    st.flush();
    st.reap(*r.pool, true);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // distinct last_used
  }
}

// A long conversation recorded turn after turn under a tight cap, with other traffic in between:
// the pages each turn adds are committed (a flush of their own, as under a long prefill) before any
// tail of the turn was noted. They were unreferenced until the turn's row was written at its end,
// and, older than the traffic that followed, the writer's eviction took them first: the session
// lost its cache (its durable position said so) while anonymous pages stayed. Now the recording's
// pages are referenced in the transaction that commits them, so only anonymous pages go.
TEST(KVStoreEviction, ARecordingSessionKeepsItsPagesUnderATightCap) {
  const uint64_t rec = page_record_bytes();
  Rig r;
  auto o = r.opts();
  o.flush_ms = 60'000;  // no commit but the test's flushes; no tail falls due by itself
  o.max_bytes = 14 * rec;
  auto st = r.open(o);
  const int turns = 4, per_turn = 3;
  auto toks = chain_tokens(turns * per_turn, 100);
  for (int t = 0; t < turns; ++t) {
    const int upto = (t + 1) * per_turn;
    std::vector<int32_t> so_far(toks.begin(), toks.begin() + upto * P + 1);
    ASSERT_TRUE(st->session_begin("chat", 0, so_far, 256).is_ok());
    for (int i = t * per_turn; i < upto; ++i) {  // the turn's prefill: committed page by page
      r.write(*st, so_far, i, 1);
      st->flush();
    }
    anonymous_traffic(r, *st, 2, 2, 50'000 + 1000 * t);  // other requests while the turn runs
    const std::vector<bool> mid = pages_held(r, toks, upto);
    EXPECT_EQ(count_held(mid), upto) << "turn " << t << ": the recording lost " << upto - count_held(mid)
                                     << " of its " << upto << " pages to eviction while it ran";
    auto d = st->session_end(0, upto * P, -1, *r.pool);
    ASSERT_TRUE(d.is_ok()) << d.status().message();
    EXPECT_EQ(*d, upto * P) << "turn " << t << ": the session's durable position";
  }
  // The cap held: anonymous pages made the room.
  EXPECT_LE(uint64_t(total_live_bytes(r.dir)), o.max_bytes);
  EXPECT_GT(st->counters().pages_evicted.load(), 0);
  // A later resume restores the whole conversation.
  st.reset();
  st = r.open(o);
  EXPECT_EQ(r.restore(*st, toks, turns * per_turn), turns * per_turn);
  EXPECT_EQ(live_bytes_drift(r.dir), "");
  EXPECT_EQ(verify_problems(*st), 0);
}

// The same across processes (two store handles on one directory, as two processes): one records a
// session while the other serves anonymous traffic under the same cap, its writer evicting, and
// runs anvil kv gc. The recording's committed pages are the catalog's oldest unreferenced ones and
// were the other process's first victims; now they are referenced from their first commit.
TEST(KVStoreEviction, AnotherProcessesEvictionLeavesARecordingsPages) {
  const uint64_t rec = page_record_bytes();
  Rig r;
  auto o = r.opts();
  o.flush_ms = 60'000;
  o.max_bytes = 10 * rec;
  auto a = r.open(o);  // records "long"
  auto toks = chain_tokens(6, 300);
  ASSERT_TRUE(a->session_begin("long", 0, toks, 256).is_ok());
  for (int i = 0; i < 6; ++i) {
    r.write(*a, toks, i, 1);
    a->flush();
  }
  a->reap(*r.pool, true);
  auto b = r.open(o);  // another process on the store: its own traffic, its own writer's eviction
  EXPECT_EQ(b->claim_session("long").code(), StatusCode::kBusy) << "the recording's claim is across processes";
  anonymous_traffic(r, *b, 4, 2, 90'000);
  EXPECT_GT(b->counters().pages_evicted.load(), 0) << "the other process's writer evicted";
  EXPECT_EQ(count_held(pages_held(r, toks, 6)), 6) << "the other process's writer evicted the recording's pages";
  ASSERT_TRUE(b->gc(0).is_ok());  // anvil kv gc --max 0 meanwhile
  EXPECT_EQ(count_held(pages_held(r, toks, 6)), 6) << "gc evicted the recording's pages";
  auto d = a->session_end(0, 6 * P, -1, *r.pool);
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  EXPECT_EQ(*d, 6 * P);
  EXPECT_EQ(r.restore(*b, toks, 6), 6);
  EXPECT_EQ(live_bytes_drift(r.dir), "");
}

// A recording's row is now written in the commit of its first page, before its first tail note. A
// resumed session's row keeps the tail it had there while the recording's tokens still hold that
// tail's tokens (a resume appends to them): a crash before the recording's own first tail loses no
// durable row. Where they do not (anvil run dropped the oldest turns), the old tail is let go, with
// live_bytes exact either way.
TEST(KVStoreEviction, ARowWrittenForARecordingsPagesKeepsTheTailItHad) {
  Rig r;
  const auto toks = save_pages_and_a_tail(r);
  auto o = r.opts();
  o.flush_ms = 60'000;
  {
    auto st = r.open(o);
    auto more = toks;
    more.push_back(79);  // the next turn's prompt: the tail's page is not full yet
    ASSERT_TRUE(st->session_begin("s", 0, more, 64).is_ok());
    r.write(*st, more, 1, 1);  // page 1 computed again (its record was found damaged, say)
    st->flush();               // the row is written for it: the recording's tokens, the old tail
    st->reap(*r.pool, true);
    auto mid = st->get_session("s");
    ASSERT_TRUE(mid.is_ok() && *mid);
    EXPECT_EQ((*mid)->tokens, more);
    st->abandon();  // the process dies before the recording's first tail note
  }
  {
    auto st = r.open(o);
    auto info = st->get_session("s");
    ASSERT_TRUE(info.is_ok() && *info);
    EXPECT_EQ((*info)->tail_first, 2 * P);
    EXPECT_EQ((*info)->tail_n, 2) << "the row lost the tail it had";
    EXPECT_EQ((*info)->durable_pos, 10);
    std::vector<int32_t> pages;
    std::vector<Hash128> keys;
    ASSERT_EQ(st->restore_pages((*info)->tokens, 0, Hash128{}, 2, *r.pool, &pages, &keys), 2);
    int32_t tp = -1;
    EXPECT_EQ(st->restore_tail((*info)->tokens, 2 * P, keys.back(), 2, *r.pool, &tp), 2);
    EXPECT_EQ(r.page_ptr(tp)[0], uint8_t((4242 * 131) & 0xff));
    for (int32_t p : pages) r.pool->kv_page_release(p);
    r.pool->kv_page_release(tp);
    EXPECT_EQ(live_bytes_drift(r.dir), "");
    // Other tokens where the tail was: the row written for page 0 has no tail, and durable goes by pages.
    auto other = toks;
    other[8] += 1;
    ASSERT_TRUE(st->session_begin("s", 0, other, 64).is_ok());
    r.write(*st, other, 0, 1);
    st->flush();
    auto now = st->get_session("s");
    ASSERT_TRUE(now.is_ok() && *now);
    EXPECT_EQ((*now)->tokens, other);
    EXPECT_EQ((*now)->tail_n, 0) << "a tail of tokens the session no longer has";
    EXPECT_EQ((*now)->durable_pos, 2 * P);
    EXPECT_EQ(live_bytes_drift(r.dir), "");
    auto d = st->session_end(0, 2 * P, -1, *r.pool);
    ASSERT_TRUE(d.is_ok()) << d.status().message();
    EXPECT_EQ(live_bytes_drift(r.dir), "");
    EXPECT_EQ(verify_problems(*st), 0);
  }
}

// The tail a resumed session's row keeps (above) is the KV of its tokens only where the recording's
// tokens equal the row's up to the tail's end, not only across the tail's own positions: anvil run,
// dropping the oldest turns, may bring the same tokens to where the tail was on another prefix (a
// repetitive text; a chat template's closing tokens). The row kept that tail there: its durable
// position counted it on top of the new pages, and kv export appended that other prefix's KV to the
// session's. Now it is let go, as for any other tokens.
TEST(KVStoreEviction, ARowKeepsItsTailOnlyOnTheSamePrefix) {
  Rig r;
  const auto toks = save_pages_and_a_tail(r);
  auto o = r.opts();
  o.flush_ms = 60'000;
  auto st = r.open(o);
  auto other = toks;
  other[0] += 1;  // another first page; the tail's tokens (8, 9) are where they were
  ASSERT_TRUE(st->session_begin("s", 0, other, 64).is_ok());
  r.write(*st, other, 0, 2);  // both pages of the new prefix committed, no tail note yet
  st->flush();
  st->reap(*r.pool, true);
  auto now = st->get_session("s");
  ASSERT_TRUE(now.is_ok() && *now);
  EXPECT_EQ((*now)->tokens, other);
  EXPECT_EQ((*now)->tail_n, 0) << "the row kept a tail computed on another prefix";
  EXPECT_EQ((*now)->durable_pos, 2 * P) << "the durable position counts a tail of another prefix";
  EXPECT_EQ(live_bytes_drift(r.dir), "");
  const std::string out = r.dir + "/s.safetensors";
  ASSERT_TRUE(st->export_session("s", out).is_ok());
  std::ifstream f(out, std::ios::binary);
  uint64_t hdr = 0;
  f.read(reinterpret_cast<char*>(&hdr), 8);
  std::string h(size_t(hdr), '\0');
  f.read(h.data(), std::streamsize(hdr));
  EXPECT_EQ(nlohmann::json::parse(h)["__metadata__"]["kv_tokens"], std::to_string(2 * P))
      << "kv export appended another prefix's tail";
  auto d = st->session_end(0, 2 * P, -1, *r.pool);
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  EXPECT_EQ(*d, 2 * P);
  EXPECT_EQ(live_bytes_drift(r.dir), "");
  EXPECT_EQ(verify_problems(*st), 0);
}

// A commit that fails after the recording's row is written in it (a full disk fails SQLite's COMMIT;
// here a trigger fails the last statement before it) rolls back the row and its page references with
// the batch's pages, which are lost (recomputed on a resume). The writer counted both as done anyway:
// the next commit wrote no page reference for any page it had known of (the session's pages stayed
// evictable, by this process or any other, while it was recorded) and a durable position that
// counted the lost pages (reported to the user as saved, missing on resume). Now its account of
// what is written and what is durable is rolled back with the transaction.
TEST(KVStoreEviction, AFailedCommitRollsBackTheRecordingsReferencesAndDurablePosition) {
  Rig r;
  auto o = r.opts();
  o.flush_ms = 60'000;
  auto st = r.open(o);
  auto toks = chain_tokens(3, 500);  // 3 full pages
  ASSERT_TRUE(st->session_begin("s", 0, toks, 64).is_ok());
  SqliteDb other;
  ASSERT_TRUE(other.open(r.dir + "/catalog.db", 1000).is_ok());
  ASSERT_TRUE(other.exec("CREATE TRIGGER fail_commit BEFORE UPDATE OF committed_end ON segments "
                         "BEGIN SELECT RAISE(ABORT, 'injected: the disk is full'); END").is_ok());
  r.write(*st, toks, 0, 2);
  ::testing::internal::CaptureStderr();
  st->flush();  // pages 0 and 1, the row and its references: rolled back
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("catalog commit failed"), std::string::npos) << err;
  EXPECT_EQ(st->counters().write_errors.load(), 1);
  ASSERT_TRUE(other.exec("DROP TRIGGER fail_commit").is_ok());
  r.write(*st, toks, 2, 1);
  st->flush();  // page 2 and the row: committed
  st->reap(*r.pool, true);
  auto refs = catalog_int(other, "SELECT COUNT(*) FROM session_pages WHERE session = 's'");
  ASSERT_TRUE(refs.is_ok());
  EXPECT_EQ(*refs, 3) << "the recording's pages are not referenced: evictable while it is recorded";
  const std::vector<bool> held = pages_held(r, toks, 3);
  EXPECT_EQ(held, (std::vector<bool>{false, false, true})) << "pages 0 and 1 went with the failed commit";
  auto mid = st->get_session("s");
  ASSERT_TRUE(mid.is_ok() && *mid);
  EXPECT_EQ((*mid)->durable_pos, 0) << "the durable position counts pages that were never committed";
  auto d = st->session_end(0, 3 * P, -1, *r.pool);
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  EXPECT_EQ(*d, 0) << "reported durable, but pages 0 and 1 are not in the store";
  EXPECT_EQ(r.restore(*st, toks, 3), 0);
  EXPECT_EQ(live_bytes_drift(r.dir), "");
  EXPECT_EQ(verify_problems(*st), 0);
}

// ---- crashes at random points of recordings (a new session, a resume, a resume whose tokens changed, a fork) ----

// The rows a resumed tail must hold: the tail page's rows below `n` as fill(seed) wrote them.
bool tail_rows_are(Rig& r, int32_t page, int32_t seed, int n) {
  const PageLayout L{DType::kBF16, 2, 2, 8, P};
  std::vector<uint8_t> want(r.page_bytes());
  for (size_t i = 0; i < want.size(); ++i) want[i] = uint8_t((seed * 131 + i * 7) & 0xff);
  for (size_t b = 0; b < L.n_blocks(); ++b)
    if (std::memcmp(r.page_ptr(page) + b * L.block_bytes(P), want.data() + b * L.block_bytes(P), L.block_bytes(n)) != 0)
      return false;
  return true;
}

// A tail's bytes as a function of what it is the KV of (its first token and length, its position).
int32_t tail_seed(const std::vector<int32_t>& toks, int first, int n) {
  return toks[size_t(first)] * 7 + first * 131 + n;
}

// Each seed: rounds of a recording (a new session; a resume that appends; a resume whose first page
// changed as after anvil run's dropped turns, its last tokens kept; a fork continued), its pages
// committed flush by flush, tail notes between, a small cap and segments rolling over, now and then
// a commit that fails; the process dies (abandon) at a random point or ends the recording. After each round, reopened: verify and
// live_bytes are clean, and every session restores at least what its row says is durable, the
// tail's rows being the KV of the session's own tokens.
TEST(KVStoreCrash, RecordingsCutAtRandomPointsRestoreWhatTheyReportDurable) {
  const uint64_t rec = page_record_bytes();
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    Rig r;
    std::mt19937 rng(seed);
    auto pick = [&](int n) { return int(rng() % uint32_t(n)); };
    std::map<std::string, std::vector<int32_t>> last;  // tokens as last begun (a crash may leave them)
    for (int round = 0; round < 10; ++round) {
      auto o = r.opts();
      o.flush_ms = pick(2) ? 1 : 60'000;
      o.max_bytes = pick(2) ? 12 * rec : (64ull << 20);
      o.segment_bytes = uint64_t(pick(2) ? 3 : 1000) * rec;
      auto st = r.open(o);
      std::string name = "s" + std::to_string(pick(3));
      std::vector<int32_t> toks;
      const int op = pick(4);
      std::string what;
      if (!last.count(name) || op == 0) {
        auto info = st->get_session(name);
        if (info.is_ok() && *info) ASSERT_TRUE(st->remove_session(name).is_ok());
        toks = chain_tokens(1 + pick(4), 1000 * int(seed) + 100 * round);
        toks.resize(toks.size() - 1 + size_t(pick(P)));
        what = "new";
      } else {
        auto info = st->get_session(name);
        ASSERT_TRUE(info.is_ok());
        if (!*info) continue;
        toks = (*info)->tokens;
        if (op == 2 && toks.size() > size_t(P)) {  // dropped turns: another first page, the rest kept
          for (int i = 0; i < P; ++i) toks[size_t(i)] += 1 + int32_t(seed);
          what = "changed";
        } else if (op == 3) {
          const std::string f = name + "f" + std::to_string(round);
          ASSERT_TRUE(st->fork_session(name, f).is_ok());
          name = f;
          what = "fork";
        } else {
          what = "resume";
        }
        for (int k = pick(2 * P) + 1; k > 0; --k) toks.push_back(int32_t(5000 + pick(50)));
      }
      last[name] = toks;
      SCOPED_TRACE("seed " + std::to_string(seed) + " round " + std::to_string(round) + ": " + what + " " + name +
                   ", " + std::to_string(toks.size()) + " tokens");
      const int n_kv = int(toks.size()) - pick(2);
      const int full = n_kv / P;
      ASSERT_TRUE(st->session_begin(name, 0, toks, 256).is_ok());
      const int crash_at = pick(2) ? pick(full + 2) : -1;  // after this many pages (-1: no crash)
      const int fail_at = pick(3) ? -1 : pick(full + 1);    // a commit that fails after this page
      bool crashed = false;
      for (int i = 0; i <= full && !crashed; ++i) {
        if (i == crash_at) {
          if (pick(2)) st->flush();
          st->abandon();
          crashed = true;
          break;
        }
        if (i == full) break;
        r.write(*st, toks, i, 1);
        if (i == fail_at) {  // a full disk fails the commit's last statement (the rows are written)
          SqliteDb other;
          ASSERT_TRUE(other.open(r.dir + "/catalog.db", 10000).is_ok());
          ASSERT_TRUE(other.exec("CREATE TRIGGER fail_commit BEFORE UPDATE OF committed_end ON segments "
                                 "BEGIN SELECT RAISE(ABORT, 'injected: the disk is full'); END").is_ok());
          ::testing::internal::CaptureStderr();
          st->flush();
          (void)::testing::internal::GetCapturedStderr();
          ASSERT_TRUE(other.exec("DROP TRIGGER fail_commit").is_ok());
        }
        if (pick(2)) st->flush();
        if (pick(3) == 0 && (i + 1) * P < n_kv) {  // a tail note (flush_ms 1: due) of the KV so far
          const int kv = (i + 1) * P + pick(std::min(P, n_kv - (i + 1) * P));
          int32_t tail = -1;
          if (kv % P) {
            tail = r.pool->kv_page_alloc();
            r.fill(tail, tail_seed(toks, kv - kv % P, kv % P));
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
          st->session_note(0, {}, kv, tail, *r.pool);
          if (tail >= 0) r.pool->kv_page_release(tail);
          if (pick(2)) st->flush();
        }
        st->reap(*r.pool, false);
      }
      if (!crashed) {
        int32_t tail = -1;
        if (n_kv % P) {
          tail = r.pool->kv_page_alloc();
          r.fill(tail, tail_seed(toks, n_kv - n_kv % P, n_kv % P));
        }
        auto d = st->session_end(0, n_kv, tail, *r.pool);
        ASSERT_TRUE(d.is_ok()) << d.status().message();
        if (tail >= 0) r.pool->kv_page_release(tail);
      }
      st.reset();
      st = r.open(o);
      EXPECT_EQ(verify_problems(*st), 0);
      EXPECT_EQ(live_bytes_drift(r.dir), "");
      for (const SessionInfo& s : st->list_sessions()) {
        ASSERT_TRUE(s.damaged.empty()) << s.damaged;
        EXPECT_LE(s.durable_pos, int(s.tokens.size())) << s.name;
        std::vector<int32_t> pages;
        std::vector<Hash128> keys;
        const int want_pages = s.durable_pos / P;
        const int got = st->restore_pages(s.tokens, 0, Hash128{}, want_pages, *r.pool, &pages, &keys);
        int restored = got * P;
        if (got == want_pages && s.durable_pos % P) {
          int32_t tp = -1;
          const int n = st->restore_tail(s.tokens, want_pages * P, want_pages ? keys.back() : Hash128{},
                                         s.durable_pos % P, *r.pool, &tp);
          if (n > 0) {
            EXPECT_TRUE(tail_rows_are(r, tp, tail_seed(s.tokens, want_pages * P, s.tail_n), n))
                << s.name << ": a tail that is not the KV of the session's tokens";
            r.pool->kv_page_release(tp);
          }
          restored += n;
        }
        for (int32_t p : pages) r.pool->kv_page_release(p);
        EXPECT_GE(restored, s.durable_pos) << s.name << ": listed durable, not restored (tail " << s.tail_first << "+"
                                           << s.tail_n << ", " << s.tokens.size() << " tokens)";
      }
    }
  }
}

// When what sessions reference alone is over the cap (the documented exception): every anonymous
// page goes, no session page does, the store stays over its cap and says so once on stderr (again
// only after it was back under); kv rm and gc then bring it under the cap.
TEST(KVStoreEviction, SessionsOverTheCapAreKeptAndSaidSo) {
  const uint64_t rec = page_record_bytes();
  Rig r;
  auto o = r.opts();
  o.max_bytes = 4 * rec;
  auto st = r.open(o);
  anonymous_traffic(r, *st, 2, 1, 70'000);
  const auto a = chain_tokens(3, 100), b = chain_tokens(3, 200);
  ::testing::internal::CaptureStderr();
  save_session(r, *st, "a", a, 3 * P);
  save_session(r, *st, "b", b, 3 * P);  // 6 pages of sessions, a cap of 4
  anonymous_traffic(r, *st, 2, 1, 80'000);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_held(pages_held(r, a, 3)), 3);
  EXPECT_EQ(count_held(pages_held(r, b, 3)), 3);
  EXPECT_EQ(st->stats().pages, 6) << "every anonymous page is evicted first";
  EXPECT_GT(uint64_t(total_live_bytes(r.dir)), o.max_bytes);
  EXPECT_EQ(st->counters().over_cap_warnings.load(), 1) << err;
  EXPECT_NE(err.find("over --kv-store-max"), std::string::npos) << err;
  EXPECT_NE(err.find("anvil kv rm"), std::string::npos) << err;
  // kv rm of one session: the next gc brings the store under its cap.
  ASSERT_TRUE(st->remove_session("b").is_ok());
  ASSERT_TRUE(st->gc().is_ok());
  EXPECT_LE(uint64_t(total_live_bytes(r.dir)), o.max_bytes);
  EXPECT_EQ(count_held(pages_held(r, a, 3)), 3);
  // Under the cap again at a flush, then over it once more: said again.
  anonymous_traffic(r, *st, 1, 1, 90'000);
  ::testing::internal::CaptureStderr();
  save_session(r, *st, "c", chain_tokens(3, 300), 3 * P);
  anonymous_traffic(r, *st, 1, 1, 95'000);
  (void)::testing::internal::GetCapturedStderr();
  EXPECT_EQ(st->counters().over_cap_warnings.load(), 2);
  EXPECT_EQ(live_bytes_drift(r.dir), "");
  EXPECT_EQ(verify_problems(*st), 0);
}

// gc under a cap that needs more than one batch of evictions (1,024 pages) reaches it in one call:
// it took one batch per call, so a kv gc, or a writer's eviction, left the store over its cap.
TEST(KVStoreEviction, OneGcEvictsMoreThanABatch) {
  Rig r;
  auto o = r.opts();
  o.flush_pages = 256;
  auto st = r.open(o);
  const int chains = 1100;
  for (int c = 0; c < chains; ++c) {
    r.write(*st, chain_tokens(1, 10 * c), 0, 1, /*seq=*/c % 8);
    if (c % 32 == 31) st->reap(*r.pool, true);
  }
  st->flush();
  st->reap(*r.pool, true);
  ASSERT_EQ(st->stats().pages, chains);
  ASSERT_TRUE(st->gc(0).is_ok());
  EXPECT_EQ(st->stats().pages, 0);
  EXPECT_EQ(st->counters().pages_evicted.load(), chains);
  EXPECT_EQ(live_bytes_drift(r.dir), "");
}

// A catalog whose live_bytes drifted (an older anvil's accounting): verify names the segment, gc
// recounts it first, and so does a model run's writer when it starts.
TEST(KVStoreAccounting, VerifyReportsDriftedLiveBytesAndGcOrAttachRecounts) {
  Rig r;
  record_session(r, "a", chain_tokens(3, 70), 3);
  auto skew = [&](int64_t by) {  // and the mark that this accounting kept the catalog: an older anvil's
    SqliteDb db;
    ASSERT_TRUE(db.open(r.dir + "/catalog.db", 1000).is_ok());
    ASSERT_TRUE(db.exec("UPDATE segments SET live_bytes = live_bytes + " + std::to_string(by)).is_ok());
    ASSERT_TRUE(db.exec("DELETE FROM meta WHERE k = 'live_bytes'").is_ok());
  };
  skew(-5000);
  {
    KVStoreOptions o = r.opts();
    o.repair = false;
    auto st = KVStore::open(o);
    ASSERT_TRUE(st.is_ok());
    auto problems = verify_list(**st);
    ASSERT_EQ(problems.size(), 1u);
    EXPECT_NE(problems[0].find("live bytes"), std::string::npos) << problems[0];
    ASSERT_TRUE((*st)->gc(1ull << 40).is_ok());
    EXPECT_EQ(live_bytes_drift(r.dir), "");
    EXPECT_TRUE(verify_list(**st).empty());
  }
  skew(123456);
  {
    auto st = r.open();
    st->flush();  // the writer recounts before it takes its first descriptor
    EXPECT_EQ(live_bytes_drift(r.dir), "");
    EXPECT_EQ(verify_problems(*st), 0);
  }
  {  // once: a catalog this accounting has kept is not scanned at every start
    SqliteDb db;
    ASSERT_TRUE(db.open(r.dir + "/catalog.db", 1000).is_ok());
    ASSERT_TRUE(db.exec("UPDATE segments SET live_bytes = live_bytes + 7").is_ok());
    auto st = r.open();
    st->flush();
    EXPECT_NE(live_bytes_drift(r.dir), "");
    ASSERT_TRUE(st->gc(1ull << 40).is_ok());
    EXPECT_EQ(live_bytes_drift(r.dir), "");
  }
}

// An Env that calls `hook` (once) just before the first call of the kind named, then goes on: a
// test puts another process's action (a gc) exactly between two steps of the store.
struct HookEnv : Env {
  Env* base = Env::posix();
  std::string when;  // "open_read" (a segment file) or "list_dir"
  std::function<void()> hook;
  void fire(const char* what, const std::string& path) {
    if (hook && when == what && (when != "open_read" || path.ends_with(".kv"))) {
      auto h = std::move(hook);
      hook = nullptr;
      h();
    }
  }
  Result<std::unique_ptr<AppendFile>> open_append(const std::string& p) override { return base->open_append(p); }
  Result<std::unique_ptr<ReadFile>> open_read(const std::string& p) override {
    fire("open_read", p);
    return base->open_read(p);
  }
  bool exists(const std::string& p) override { return base->exists(p); }
  Result<uint64_t> file_size(const std::string& p) override { return base->file_size(p); }
  Status truncate(const std::string& p, uint64_t n) override { return base->truncate(p, n); }
  Status remove(const std::string& p) override { return base->remove(p); }
  Status create_dirs(const std::string& p) override { return base->create_dirs(p); }
  Result<std::vector<std::string>> list_dir(const std::string& p) override {
    fire("list_dir", p);
    return base->list_dir(p);
  }
  Status sync_dir(const std::string& p) override { return base->sync_dir(p); }
  bool locked_by_other(const std::string& p) override { return base->locked_by_other(p); }
};

// kv verify while another process's gc compacts: the gc commits the moved rows, then deletes the old
// segment, and creates a segment verify's first snapshot did not know. Verify must report nothing
// (nothing is damaged), whether the gc runs just before it reads the records or just before it
// lists the directory. Real damage is still found: see FlippedByteTruncatedOrDeletedSegmentIsAMiss.
TEST(KVStoreAccounting, VerifyDuringACompactionReportsNoPhantomDamage) {
  for (const char* when : {"open_read", "list_dir"}) {
    Rig r;
    auto keep = chain_tokens(3, 100), drop = chain_tokens(4, 700);
    {
      auto st = r.open();
      ASSERT_TRUE(st->session_begin("keep", 0, keep, 64).is_ok());
      r.write(*st, drop, 0, 4, /*seq=*/1);  // anonymous: evictable (then the segment is under half live)
      r.write(*st, keep, 0, 3);
      auto d = st->session_end(0, 3 * P, -1, *r.pool);
      ASSERT_TRUE(d.is_ok());
      auto t = keep;
      t.push_back(9);
      save_session(r, *st, "tailed", t, 14);  // a session tail in the segment too
    }
    HookEnv env;
    KVStoreOptions o = r.opts();
    o.env = &env;
    o.repair = false;
    auto verifier = KVStore::open(o);
    ASSERT_TRUE(verifier.is_ok());
    auto gc_store = KVStore::open(r.opts());
    ASSERT_TRUE(gc_store.is_ok());
    const std::string before = r.only_segment();
    bool gc_ran = false;
    env.when = when;
    env.hook = [&] {
      auto g = (*gc_store)->gc(0);  // evicts the anonymous pages, then compacts their segment
      ASSERT_TRUE(g.is_ok()) << g.status().message();
      gc_ran = true;
    };
    auto problems = verify_list(**verifier);
    ASSERT_TRUE(gc_ran) << when;
    EXPECT_FALSE(fs::exists(before)) << "the gc compacted the segment verify had listed";
    EXPECT_TRUE(problems.empty()) << when << ": " << problems.size() << " phantom problems";
    EXPECT_TRUE(verify_list(**verifier).empty());
    EXPECT_EQ(live_bytes_drift(r.dir), "");
    auto st = r.open();
    EXPECT_EQ(r.restore(*st, keep, 3), 3) << "the moved pages";
  }
}

// A damaged run: the restore stops at the first bad record, and every later record of the run is
// checked too, so that one resume stores every bad page again (a truncated segment used to heal one
// page per resume while the session was reported durable throughout). Sound pages past the first
// bad one are kept, not rewritten.
TEST(KVStoreAccounting, OneResumeHealsEveryDamagedPageOfTheRun) {
  for (const char* damage : {"truncate", "flip"}) {
    Rig r;
    auto toks = chain_tokens(8, 300);  // 33 tokens: 8 pages
    record_session(r, "s", toks, 8);
    const std::string seg = r.only_segment();
    const auto size = fs::file_size(seg);
    int good = 0, bad = 0;
    if (std::string(damage) == "truncate") {
      fs::resize_file(seg, size / 3);  // records 0 and 1 whole, 2..7 gone
      good = 2, bad = 6;
    } else {
      for (int rec : {3, 6}) {  // one byte inside records 3 and 6 of 8 (equal-sized, in order)
        std::fstream f(seg, std::ios::in | std::ios::out | std::ios::binary);
        const auto at = std::streamoff(size * size_t(rec) / 8 + size / 16);
        f.seekp(at);
        char c;
        f.read(&c, 1);
        f.seekp(at);
        c ^= 0x08;
        f.write(&c, 1);
      }
      good = 3, bad = 2;
    }
    {
      auto st = r.open();
      EXPECT_EQ(r.restore(*st, toks, 8), good) << damage;
      // The resume recomputes pages good..7 and records the session again.
      ASSERT_TRUE(st->session_begin("s", 0, toks, 64).is_ok());
      r.write(*st, toks, good, 8 - good);
      auto d = st->session_end(0, 8 * P, -1, *r.pool);
      ASSERT_TRUE(d.is_ok());
      EXPECT_EQ(*d, 8 * P);
      EXPECT_EQ(st->counters().pages_written.load(), bad) << damage << ": exactly the bad pages are stored again";
    }
    auto st = r.open();
    EXPECT_EQ(r.restore(*st, toks, 8), 8) << damage << ": the next resume restores the whole session";
    for (const std::string& p : verify_list(*st))
      EXPECT_EQ(p.find("page "), std::string::npos) << "no page row is bad any more";
    EXPECT_EQ(live_bytes_drift(r.dir), "");
  }
}

}  // namespace
}  // namespace anvil

namespace anvil {
namespace {

// The restore checks a record's header by comparing it with the header this version writes for the
// expected metadata (page_record_header_matches) instead of parsing it: it must accept exactly that
// header, whatever the data checksum, and nothing that differs in any field.
TEST(KVPageRecord, HeaderMatchesOnlyTheExpectedHeader) {
  PageLayout L{DType::kBF16, 2, 2, 8, P};
  PageMeta m;
  m.fingerprint = hash128("fp", 2);
  m.key = hash128("key", 3);
  m.parent = hash128("parent", 6);
  m.first_pos = 8;
  m.tokens = {1, 2, 3, 4};
  std::vector<uint8_t> data(L.data_bytes(P), 7);
  const std::string h = page_record_header(L, m, data.data(), data.size());
  auto matches = [&](const std::string& hdr, const PageMeta& want) {
    return page_record_header_matches(reinterpret_cast<const uint8_t*>(hdr.data()), hdr.size(), L, want);
  };
  EXPECT_TRUE(matches(h, m));
  data[0] = 8;  // another data checksum: still this header
  EXPECT_TRUE(matches(page_record_header(L, m, data.data(), data.size()), m));
  // The same header parses to the same metadata (what the fast check stands in for).
  std::string rec = h;
  rec.append(reinterpret_cast<const char*>(data.data()), data.size());
  PageMeta parsed;
  const uint8_t* d = nullptr;
  ASSERT_TRUE(page_record_parse(reinterpret_cast<const uint8_t*>(rec.data()), rec.size(), L, m.fingerprint, &parsed, &d,
                                "rec", false)
                  .is_ok());
  EXPECT_EQ(parsed.key, m.key);
  EXPECT_EQ(parsed.tokens, m.tokens);
  for (int field = 0; field < 5; ++field) {
    PageMeta other = m;
    if (field == 0) other.key = hash128("key2", 4);
    if (field == 1) other.parent = Hash128{};
    if (field == 2) other.first_pos = 12;
    if (field == 3) other.tokens[3] = 5;
    if (field == 4) other.fingerprint = hash128("fp2", 3);
    EXPECT_FALSE(matches(h, other)) << "field " << field;
  }
  PageLayout L2 = L;
  L2.n_kv_heads = 1;
  EXPECT_FALSE(page_record_header_matches(reinterpret_cast<const uint8_t*>(h.data()), h.size(), L2, m));
  std::string bad = h;
  bad[bad.find("\"data_xxh3\":\"") + 13] = 'z';  // not a hex digit
  EXPECT_FALSE(matches(bad, m));
  EXPECT_FALSE(matches(h.substr(0, h.size() - 1), m));
}

}  // namespace
}  // namespace anvil

namespace anvil {
namespace {

// page_record_header builds its tensor entries once per layout and splices the metadata in: the
// bytes must be those of dumping the whole header as one JSON object (what records already in
// stores were written as), for full and partial pages alike.
TEST(KVPageRecord, HeaderIsTheWholeObjectDumped) {
  PageLayout L{DType::kBF16, 3, 2, 8, P};
  for (int n : {P, 2, P}) {
    PageMeta m;
    m.fingerprint = hash128("fp", 2);
    m.key = hash128("k", 1);
    m.first_pos = 4;
    for (int i = 0; i < n; ++i) m.tokens.push_back(100 + i);
    std::vector<uint8_t> data(L.data_bytes(n), 3);
    const std::string h = page_record_header(L, m, data.data(), data.size());
    uint64_t len;
    std::memcpy(&len, h.data(), 8);
    ASSERT_EQ(len + 8, h.size());
    auto j = nlohmann::ordered_json::parse(h.substr(8));
    ASSERT_TRUE(j.is_object());
    EXPECT_EQ(j.size(), size_t(2 * L.n_layers + 1));
    std::string dumped = j.dump();
    while ((8 + dumped.size()) % 8) dumped += ' ';
    EXPECT_EQ(dumped, h.substr(8)) << "n = " << n;
    EXPECT_EQ(j["layer.2.v"]["shape"], nlohmann::json({2, n, 8}));
  }
}

// A session row whose token ids were damaged (a flipped bit in the catalog) is an error naming it,
// and verify reports it, never another conversation resumed; a catalog of format 1 (no checksum
// column) is brought to format 2 when opened, its rows read as they are.
TEST(KVStore, DamagedSessionRowIsAnErrorAndFormatOneIsMigrated) {
  Rig r;
  const auto toks = chain_tokens(2, 300);
  record_session(r, "s", toks, 2);
  const std::string cat = r.dir + "/catalog.db";
  auto set_tokens = [&](std::vector<int32_t> t) {
    SqliteDb db;
    ASSERT_TRUE(db.open(cat, 1000).is_ok());
    SqliteStmt u;
    ASSERT_TRUE(u.prepare(db, "UPDATE sessions SET tokens = ? WHERE name = 's'").is_ok());
    u.bind_blob(1, t.data(), t.size() * 4);
    ASSERT_TRUE(u.run().is_ok());
  };
  {
    auto st = r.open();
    auto good = st->get_session("s");
    ASSERT_TRUE(good.is_ok() && *good) << good.status().message();
    EXPECT_EQ((*good)->tokens, toks);
    EXPECT_EQ(verify_problems(*st), 0);
  }
  auto flipped = toks;
  flipped[5] ^= 1;
  set_tokens(flipped);
  {
    auto st = r.open();
    auto bad = st->get_session("s");
    ASSERT_FALSE(bad.is_ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(bad.status().message().find("session 's' is damaged"), std::string::npos) << bad.status().message();
    EXPECT_EQ(verify_problems(*st), 1);
  }
  {  // back to format 1: no sum column, version 1; the flipped row can no longer be told apart
    SqliteDb db;
    ASSERT_TRUE(db.open(cat, 1000).is_ok());
    ASSERT_TRUE(db.exec("ALTER TABLE sessions DROP COLUMN sum").is_ok());
    ASSERT_TRUE(db.exec("UPDATE meta SET v = '1' WHERE k = 'format_version'").is_ok());
  }
  set_tokens(toks);
  {
    auto st = r.open();
    auto old = st->get_session("s");
    ASSERT_TRUE(old.is_ok() && *old) << old.status().message();
    EXPECT_EQ((*old)->tokens, toks);
    EXPECT_EQ(verify_problems(*st), 0);
  }
  SqliteDb db;
  ASSERT_TRUE(db.open(cat, 1000).is_ok());
  auto v = catalog_int(db, "SELECT CAST(v AS INTEGER) FROM meta WHERE k = 'format_version'");
  ASSERT_TRUE(v.is_ok());
  EXPECT_EQ(*v, kCatalogVersion);
  auto col = catalog_int(db, "SELECT COUNT(*) FROM pragma_table_info('sessions') WHERE name = 'sum'");
  ASSERT_TRUE(col.is_ok());
  EXPECT_EQ(*col, 1);
}

// A store directory removed while a session is recorded: its commits went into files that are gone,
// so the session is reported unsaved, never as saved.
TEST(KVStore, SessionIsUnsavedWhenTheStoreDirectoryIsRemovedMeanwhile) {
  Rig r;
  const auto toks = chain_tokens(2, 500);
  auto st = r.open();
  ASSERT_TRUE(st->session_begin("s", 0, toks, 64).is_ok());
  r.write(*st, toks, 0, 1);
  // Moved away (as removed, to this process: its path no longer leads to the files; a remove would
  // race the writer's next segment file).
  fs::rename(r.dir, r.dir + ".gone");
  r.write(*st, toks, 1, 1);
  auto end = st->session_end(0, 2 * P, -1, *r.pool);
  ASSERT_FALSE(end.is_ok());
  EXPECT_NE(end.status().message().find("removed or replaced"), std::string::npos) << end.status().message();
  st.reset();
  fs::remove_all(r.dir + ".gone");
}

// A catalog of a later format is refused by name and left as it is; a damaged one is reported
// as it is when repair is off (anvil kv) and moved aside when on (a model run: the store is a cache).
TEST(KVStore, NewerOrDamagedCatalogsAreReportedNotOverwritten) {
  Rig r;
  record_session(r, "s", chain_tokens(2, 300), 2);
  const std::string cat = r.dir + "/catalog.db";
  {
    SqliteDb db;
    ASSERT_TRUE(db.open(cat, 1000).is_ok());
    ASSERT_TRUE(db.exec("UPDATE meta SET v = '99' WHERE k = 'format_version'").is_ok());
  }
  auto newer = KVStore::open(r.opts());
  ASSERT_FALSE(newer.is_ok());
  EXPECT_EQ(newer.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(newer.status().message().find("format version 99"), std::string::npos) << newer.status().message();
  {
    SqliteDb db;
    ASSERT_TRUE(db.open(cat, 1000).is_ok());
    ASSERT_TRUE(db.exec("UPDATE meta SET v = '1' WHERE k = 'format_version'").is_ok());
    ASSERT_TRUE(db.exec("PRAGMA wal_checkpoint(TRUNCATE)").is_ok());
  }
  {  // the header page overwritten: SQLite no longer sees a database
    std::fstream f(cat, std::ios::in | std::ios::out | std::ios::binary);
    const std::string zeros(4096, '\0');
    f.write(zeros.data(), std::streamsize(zeros.size()));
  }
  for (const char* sfx : {"-wal", "-shm"}) fs::remove(cat + sfx);
  auto o = r.opts();
  o.repair = false;
  auto inspect = KVStore::open(o);
  ASSERT_FALSE(inspect.is_ok());
  EXPECT_EQ(inspect.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(inspect.status().message().find("is damaged"), std::string::npos) << inspect.status().message();
  size_t aside = 0;
  for (auto& e : fs::directory_iterator(r.dir)) aside += e.path().filename().string().find(".corrupt-") != std::string::npos;
  EXPECT_EQ(aside, 0u) << "repair off must not move the catalog";
  auto repaired = KVStore::open(r.opts());
  ASSERT_TRUE(repaired.is_ok()) << repaired.status().message();
  for (auto& e : fs::directory_iterator(r.dir)) aside += e.path().filename().string().find(".corrupt-") != std::string::npos;
  EXPECT_EQ(aside, 1u);
}

// A directory with other files and nothing of a store (a model directory given by mistake) is not
// filled with a catalog; an empty one, or one with only segment files left, is a store.
TEST(KVStore, ADirectoryOfOtherFilesIsNotTakenForAStore) {
  Rig r;
  fs::create_directories(r.dir);
  std::ofstream(r.dir + "/config.json") << "{}";
  auto o = r.opts();
  auto st = KVStore::open(o);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.status().message().find("not a KV store"), std::string::npos) << st.status().message();
  EXPECT_FALSE(fs::exists(r.dir + "/catalog.db"));
  fs::remove(r.dir + "/config.json");
  std::ofstream(r.dir + "/seg-00000001.kv") << "";
  EXPECT_TRUE(KVStore::open(o).is_ok()) << "a store whose catalog is gone is still a store";
}

// A segment file the catalog does not know (its rows lost with a damaged WAL, or a gc cut short)
// is a verify problem, not silence; gc removes it.
TEST(KVStore, VerifyReportsSegmentFilesNoRowKnows) {
  Rig r;
  auto st = r.open();
  r.write(*st, chain_tokens(2, 700), 0, 2);
  st->flush();
  std::vector<std::string> problems;
  int64_t n = 0;
  ASSERT_TRUE(st->verify(&problems, &n).is_ok());
  EXPECT_TRUE(problems.empty()) << problems[0];
  std::ofstream(r.dir + "/seg-00009999.kv", std::ios::binary) << std::string(100, 'x');
  ASSERT_TRUE(st->verify(&problems, &n).is_ok());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("seg-00009999.kv: 100 bytes that no catalog row knows"), std::string::npos) << problems[0];
}


// Invariant 9 for removal: a session another store handle (another process) records is not removed
// under it; its recording would write the row back at its next flush without the page references
// it wrote before, and a later gc would evict those pages. Refused with kBusy naming the session,
// and the row stays as it is; once the recording ends, the removal works and nothing brings it back.
TEST(KVStore, RemovingASessionAnotherProcessRecordsIsRefused) {
  Rig r;
  const auto toks = chain_tokens(2, 300);  // 9 tokens
  record_session(r, "s", toks, 2);
  auto rec = r.open();  // the recorder: goes on with s
  ASSERT_TRUE(rec->session_begin("s", 0, toks, 64).is_ok());
  auto other = KVStore::open(r.opts());  // anvil kv rm, or a server's DELETE, in another process
  ASSERT_TRUE(other.is_ok()) << other.status().message();
  Status rm = (*other)->remove_session("s");
  ASSERT_FALSE(rm.is_ok()) << "removed a session another process records";
  EXPECT_EQ(rm.code(), StatusCode::kBusy);
  EXPECT_NE(rm.message().find("cannot remove session 's'"), std::string::npos) << rm.message();
  EXPECT_NE(rm.message().find("in use by another process"), std::string::npos) << rm.message();
  auto still = (*other)->get_session("s");
  ASSERT_TRUE(still.is_ok() && *still);
  EXPECT_EQ((*still)->tokens, toks);
  // Claiming it (to read and continue it) is refused alike, as kBusy.
  Status claim = (*other)->claim_session("s");
  EXPECT_EQ(claim.code(), StatusCode::kBusy) << claim.message();
  // The recorder itself cannot remove what it records.
  EXPECT_EQ(rec->remove_session("s").code(), StatusCode::kBusy);
  // The recording goes on and ends; its rows are all there.
  const int32_t t1 = 5000;
  rec->session_note(0, std::span<const int32_t>(&t1, 1), int(toks.size()) - 1, -1, *r.pool);
  auto d = rec->session_end(0, 2 * P, -1, *r.pool);
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  // Now the name is free: removed, and it stays removed (the recorder flushes nothing more).
  ASSERT_TRUE((*other)->remove_session("s").is_ok());
  rec->flush();
  auto gone = (*other)->get_session("s");
  ASSERT_TRUE(gone.is_ok());
  EXPECT_FALSE(*gone);
  // A removal lets its claim go (a recording may take the name again), and keeps one the caller
  // held before (anvil run's, across its turns).
  record_session(r, "t", toks, 2);
  ASSERT_TRUE((*other)->claim_session("t").is_ok());
  ASSERT_TRUE((*other)->remove_session("t").is_ok());
  EXPECT_EQ(rec->claim_session("t").code(), StatusCode::kBusy) << "the caller's own claim was let go by the removal";
  (*other)->release_session("t");
  EXPECT_TRUE(rec->claim_session("t").is_ok());
  rec->release_session("t");
  record_session(r, "u", toks, 2);
  ASSERT_TRUE((*other)->remove_session("u").is_ok());
  EXPECT_TRUE(rec->claim_session("u").is_ok()) << "the removal kept the claim it took";
}

// kv ls / GET /v1/sessions: a session whose row fails its checksum is listed, marked damaged with
// the reason (naming no path: the server shows it to clients), never left out silently.
TEST(KVStore, ListSessionsMarksADamagedRow) {
  Rig r;
  const auto toks = chain_tokens(2, 300);
  record_session(r, "good", toks, 2);
  record_session(r, "bad", toks, 2);
  {
    SqliteDb db;
    ASSERT_TRUE(db.open(r.dir + "/catalog.db", 1000).is_ok());
    auto flipped = toks;
    flipped[3] ^= 1;
    SqliteStmt u;
    ASSERT_TRUE(u.prepare(db, "UPDATE sessions SET tokens = ? WHERE name = 'bad'").is_ok());
    u.bind_blob(1, flipped.data(), flipped.size() * 4);
    ASSERT_TRUE(u.run().is_ok());
  }
  auto st = r.open();
  auto all = st->list_sessions();
  ASSERT_EQ(all.size(), 2u) << "the damaged session was left out";
  EXPECT_EQ(all[0].name, "bad");
  EXPECT_EQ(all[0].damaged, "its token ids or conversation fail their checksum");
  EXPECT_TRUE(all[0].tokens.empty()) << "a damaged row's tokens are not trusted";
  EXPECT_EQ(all[0].fingerprint, r.fp);
  EXPECT_GT(all[0].updated_us, 0);
  EXPECT_EQ(all[1].name, "good");
  EXPECT_TRUE(all[1].damaged.empty());
  EXPECT_EQ(all[1].tokens, toks);
  ASSERT_TRUE(st->remove_session("bad").is_ok()) << "a damaged session can be removed";
  EXPECT_EQ(st->list_sessions().size(), 1u);
}

// find_session: one session as list_sessions lists it. A damaged row is found, marked, with the
// columns its checksum does not cover (so a caller tells it from a missing session, and another
// model's from this one's), and the catalog is left unchanged; a sound row is get_session's.
TEST(KVStore, FindSessionMarksADamagedRowAndChangesNothing) {
  Rig r;
  const auto toks = chain_tokens(2, 300);
  record_session(r, "good", toks, 2);
  record_session(r, "bad", toks, 2);
  const std::string cat = r.dir + "/catalog.db";
  auto row = [&] {
    SqliteDb db;
    EXPECT_TRUE(db.open(cat, 1000).is_ok());
    SqliteStmt q;
    EXPECT_TRUE(q.prepare(db, "SELECT hex(tokens) || '|' || hex(meta) || '|' || quote(sum) || '|' || durable_pos FROM "
                              "sessions WHERE name = 'bad'").is_ok());
    auto got = q.step();
    return got.is_ok() && *got ? q.col_text(0) : std::string();
  };
  {
    SqliteDb db;
    ASSERT_TRUE(db.open(cat, 1000).is_ok());
    ASSERT_TRUE(db.exec("UPDATE sessions SET tokens = substr(tokens, 1, length(tokens) - 1) WHERE name = 'bad'").is_ok());
  }
  const std::string before = row();
  ASSERT_FALSE(before.empty());
  auto st = r.open();
  auto bad = st->find_session("bad");
  ASSERT_TRUE(bad.is_ok()) << bad.status().message();
  ASSERT_TRUE(bad->has_value()) << "a damaged session was taken for a missing one";
  const SessionInfo& b = **bad;
  EXPECT_EQ(b.name, "bad");
  EXPECT_EQ(b.damaged, "its token ids or conversation fail their checksum");
  EXPECT_TRUE(b.tokens.empty() && b.meta.empty()) << "a damaged row's tokens are not trusted";
  EXPECT_EQ(b.fingerprint, r.fp);
  EXPECT_EQ(b.durable_pos, 2 * P);  // record_session committed its 2 pages
  EXPECT_GT(b.updated_us, 0);
  EXPECT_EQ(st->get_session("bad").status().code(), StatusCode::kCorrupt) << "get_session still refuses it";
  auto good = st->find_session("good");
  ASSERT_TRUE(good.is_ok() && *good) << good.status().message();
  EXPECT_TRUE((*good)->damaged.empty());
  EXPECT_EQ((*good)->tokens, toks);
  auto none = st->find_session("none");
  ASSERT_TRUE(none.is_ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_EQ(row(), before) << "find_session changed the damaged row";
}

// The metas every anvil has written (anvil generate and /v1/completions: ""; anvil run: messages,
// document and turns; /v1/chat/completions: messages and document) read as their kinds; anything
// else, which no anvil writes, is unreadable.
TEST(KVStore, SessionKindReadsWhatEachWriterRecords) {
  EXPECT_EQ(session_kind(""), SessionKind::kCompletion);
  EXPECT_EQ(session_kind(R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo",)"
                         R"("reasoning_content":"hm"}],"document":[],"turns":1})"),
            SessionKind::kChat);
  EXPECT_EQ(session_kind(R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text",)"
                         R"("text":"hi"}]}],"document":[]})"),
            SessionKind::kChat);
  EXPECT_EQ(session_kind(R"({"messages":[]})"), SessionKind::kChat);
  EXPECT_EQ(session_kind(R"({"messages":[],"document":[1,2,2147483647],"turns":3})"), SessionKind::kRunText);
  for (const char* m : {"meta!", "{", "null", "[]", "{}", "\"\"", R"({"massages":[]})", R"({"messages":5})",
                        R"({"messages":[1]})", R"({"messages":[{"content":"x"}]})", R"({"messages":[{"role":7}]})",
                        R"({"messages":[],"document":"x"})", R"({"messages":[],"document":[1.5]})",
                        R"({"messages":[],"document":[2147483648]})", R"({"messages":[],"document":[-2147483649]})",
                        R"({"messages":[{"role":"user","content":"hi"}],"document":[]})" "x"})
    EXPECT_EQ(session_kind(m), SessionKind::kUnreadable) << m;
}

// A row of the older catalog format (no checksum) is damaged when its meta is of no kind anvil
// writes or its token ids are cut mid-id: get_session refuses it naming the session, the reason and
// kv rm; find_session and list_sessions mark it with the same reason (no path in it); verify
// reports it. Rows of that format with the metas anvil writes are read as they are. (The meta was
// taken as a completion document: a chat request was told to use /v1/completions, and anvil
// generate --resume overwrote it.)
TEST(KVStore, AnOlderRowWithAnUnreadableMetaIsDamaged) {
  Rig r;
  const auto toks = chain_tokens(2, 300);
  const std::string chat = R"({"messages":[{"role":"user","content":"hi"}],"document":[],"turns":1})";
  const std::string text = R"({"messages":[],"document":[5,6],"turns":1})";
  const std::map<std::string, std::string> metas = {
      {"doc", ""}, {"chat", chat}, {"text", text}, {"bad", chat}, {"cut", ""}};
  for (const auto& [name, meta] : metas) {
    auto st = r.open();
    ASSERT_TRUE(st->session_begin(name, 0, toks, 64, meta).is_ok());
    r.write(*st, toks, 0, 2);
    ASSERT_TRUE(st->session_end(0, 2 * P, -1, *r.pool, meta).is_ok());
  }
  {  // rows as format 1 left them: no checksum
    SqliteDb db;
    ASSERT_TRUE(db.open(r.dir + "/catalog.db", 1000).is_ok());
    ASSERT_TRUE(db.exec("UPDATE sessions SET sum = NULL").is_ok());
    ASSERT_TRUE(db.exec("UPDATE sessions SET meta = substr(meta, 1, 20) WHERE name = 'bad'").is_ok());
    ASSERT_TRUE(db.exec("UPDATE sessions SET tokens = substr(tokens, 1, length(tokens) - 2) WHERE name = 'cut'").is_ok());
  }
  auto st = r.open();
  for (const char* name : {"doc", "chat", "text"}) {
    auto s = st->get_session(name);
    ASSERT_TRUE(s.is_ok() && *s) << name << ": " << s.status().message();
    EXPECT_EQ((*s)->meta, metas.at(name));
    EXPECT_EQ((*s)->tokens, toks);
  }
  const std::string unreadable = "its conversation is unreadable";
  const std::string cut = "its token ids are cut short: " + std::to_string(toks.size() * 4 - 2) + " bytes";
  auto bad = st->get_session("bad");
  ASSERT_FALSE(bad.is_ok()) << "a format-1 row with an unreadable meta was read as a session";
  EXPECT_EQ(bad.status().code(), StatusCode::kCorrupt);
  for (const std::string& part : {std::string("session 'bad' is damaged (") + unreadable, std::string("anvil kv rm bad")})
    EXPECT_NE(bad.status().message().find(part), std::string::npos) << bad.status().message();
  EXPECT_EQ(st->get_session("cut").status().code(), StatusCode::kCorrupt);
  auto found = st->find_session("bad");
  ASSERT_TRUE(found.is_ok() && *found) << found.status().message();
  EXPECT_EQ((*found)->damaged.rfind(unreadable, 0), 0u) << (*found)->damaged;
  EXPECT_EQ((*found)->damaged.find(r.dir), std::string::npos) << "a path in " << (*found)->damaged;
  EXPECT_TRUE((*found)->meta.empty() && (*found)->tokens.empty());
  std::map<std::string, std::string> listed;
  for (const SessionInfo& s : st->list_sessions()) listed[s.name] = s.damaged;
  ASSERT_EQ(listed.size(), 5u);
  EXPECT_EQ(listed["bad"], (*found)->damaged);
  EXPECT_EQ(listed["cut"].rfind(cut, 0), 0u) << listed["cut"];
  for (const char* name : {"doc", "chat", "text"}) EXPECT_EQ(listed[name], "") << name;
  std::vector<std::string> problems;
  int64_t n = 0;
  ASSERT_TRUE(st->verify(&problems, &n).is_ok());
  ASSERT_EQ(problems.size(), 2u) << ::testing::PrintToString(problems);
  EXPECT_EQ(problems[0], "session bad: " + listed["bad"]);
  EXPECT_EQ(problems[1], "session cut: " + listed["cut"]);
}

}  // namespace
// A COMMIT that fails with the transaction still open (here a deferred foreign key, which SQLite
// checks at COMMIT and then leaves the transaction open; a busy lock does the same) must not leave
// the connection inside it: SqliteDb::commit rolls it back, so the next BEGIN works and nothing of
// the failed transaction is committed later by someone else's COMMIT.
TEST(KVStoreCatalog, AFailedCommitLeavesNoTransactionOpen) {
  const std::string path = fs::temp_directory_path() / ("anvil_commit_" + std::to_string(::getpid()) + ".db");
  fs::remove(path);
  {
    SqliteDb db;
    ASSERT_TRUE(db.open(path, 1000).is_ok());
    ASSERT_TRUE(db.exec("PRAGMA foreign_keys = ON").is_ok());
    ASSERT_TRUE(db.exec("CREATE TABLE p(id INTEGER PRIMARY KEY)").is_ok());
    ASSERT_TRUE(db.exec("CREATE TABLE c(pid INTEGER REFERENCES p(id) DEFERRABLE INITIALLY DEFERRED)").is_ok());
    ASSERT_TRUE(db.exec("BEGIN IMMEDIATE").is_ok());
    ASSERT_TRUE(db.exec("INSERT INTO c VALUES (7)").is_ok());  // no parent 7: fails at COMMIT
    Status st = db.commit();
    EXPECT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("COMMIT"), std::string::npos) << st.message();
    EXPECT_TRUE(sqlite3_get_autocommit(db.handle())) << "the failed transaction is still open";
    // The connection works as before, and the failed insert is gone.
    ASSERT_TRUE(db.exec("BEGIN IMMEDIATE").is_ok());
    ASSERT_TRUE(db.exec("INSERT INTO p VALUES (1)").is_ok());
    ASSERT_TRUE(db.commit().is_ok());
    SqliteStmt n;
    ASSERT_TRUE(n.prepare(db, "SELECT (SELECT COUNT(*) FROM c), (SELECT COUNT(*) FROM p)").is_ok());
    ASSERT_TRUE(*n.step());
    EXPECT_EQ(n.col_int(0), 0);
    EXPECT_EQ(n.col_int(1), 1);
  }
  fs::remove(path);
}

}  // namespace anvil
