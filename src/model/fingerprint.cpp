#include "model/fingerprint.h"

#include <algorithm>

namespace anvil {

Hash128 model_fingerprint(const std::string& config_json, std::vector<const TensorView*> tensors, ThreadPool& pool) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorView* a, const TensorView* b) { return a->name < b->name; });
  // Work items: (tensor, chunk); chunk_base[i] is tensor i's first item.
  struct Item {
    const uint8_t* data;
    size_t n;
  };
  std::vector<Item> items;
  std::vector<size_t> chunk_base;
  for (const TensorView* t : tensors) {
    chunk_base.push_back(items.size());
    for (size_t off = 0; off < t->nbytes; off += kFingerprintChunkBytes)
      items.push_back({t->data + off, std::min(kFingerprintChunkBytes, t->nbytes - off)});
  }
  chunk_base.push_back(items.size());
  std::vector<Hash128> digests(items.size());
  pool.parallel_for(int64_t(items.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) digests[size_t(i)] = hash128(items[size_t(i)].data, items[size_t(i)].n);
  });
  Hasher128 h;
  static constexpr char kTag[] = "anvil.model_fingerprint.v1";
  h.update(kTag, sizeof kTag);
  h.update_pod(uint64_t(config_json.size()));
  h.update(config_json.data(), config_json.size());
  h.update_pod(uint64_t(tensors.size()));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorView* t = tensors[i];
    h.update_pod(uint64_t(t->name.size()));
    h.update(t->name.data(), t->name.size());
    h.update_pod(uint32_t(t->dtype));
    h.update_pod(uint64_t(t->shape.size()));
    h.update(t->shape.data(), t->shape.size() * sizeof(int64_t));
    h.update_pod(uint64_t(t->nbytes));
    for (size_t c = chunk_base[i]; c < chunk_base[i + 1]; ++c) h.update(digests[c]);
  }
  return h.digest();
}

}  // namespace anvil
