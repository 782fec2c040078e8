#include "model/loader.h"

#include <xxhash.h>

#include <filesystem>

#include "base/mmap_file.h"
#include "format/hf_cache.h"

namespace anvil {

Result<std::unique_ptr<LoadedModel>> load_model(const std::string& path_or_repo) {
  ANVIL_ASSIGN_OR_RETURN(std::string dir, resolve_model_path(path_or_repo));
  auto m = std::make_unique<LoadedModel>();
  m->source = dir;
  m->dir = dir;
  ANVIL_ASSIGN_OR_RETURN(m->config, load_model_config(dir));
  ANVIL_ASSIGN_OR_RETURN(m->checkpoint, Checkpoint::open(dir));
  const Checkpoint* ck = m->checkpoint.get();
  ANVIL_ASSIGN_OR_RETURN(m->weights,
                         bind_weights(m->config, [ck](const std::string& n) { return ck->find(n); }, dir));
  // Fingerprint: config.json text plus every tensor's name, dtype, shape and a sample of its bytes.
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  auto cfg_text = read_file(dir + "/config.json");
  if (cfg_text.is_ok()) XXH3_64bits_update(st, cfg_text->data(), cfg_text->size());
  for (const std::string& n : ck->names()) {
    const TensorView* t = ck->find(n);
    XXH3_64bits_update(st, n.data(), n.size());
    XXH3_64bits_update(st, &t->dtype, sizeof t->dtype);
    XXH3_64bits_update(st, t->shape.data(), t->shape.size() * sizeof(int64_t));
    XXH3_64bits_update(st, t->data, std::min<size_t>(t->nbytes, 64));
  }
  m->fingerprint = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return m;
}

Result<std::unique_ptr<LoadedModel>> load_synthetic(const std::string& spec) {
  std::string name = spec, quant = "q4g64";
  if (auto c = spec.find(':'); c != std::string::npos) {
    name = spec.substr(0, c);
    quant = spec.substr(c + 1);
  }
  ANVIL_ASSIGN_OR_RETURN(SynthShape shape, synth_shape(name));
  ANVIL_ASSIGN_OR_RETURN(SynthQuant q, parse_synth_quant(quant));
  auto m = std::make_unique<LoadedModel>();
  m->source = "synthetic:" + name + ":" + q.name();
  // The config first: an architecture this build cannot run fails before gigabytes are generated.
  ANVIL_ASSIGN_OR_RETURN(m->config, parse_model_config(synth_config_json(shape, q), m->source + " config"));
  ANVIL_ASSIGN_OR_RETURN(m->synthetic, synth_build(shape, q));
  m->config.eos_token_ids = {151645, 151643};
  const SynthModel* sm = m->synthetic.get();
  ANVIL_ASSIGN_OR_RETURN(m->weights,
                         bind_weights(m->config, [sm](const std::string& n) { return sm->find(n); }, m->source));
  m->fingerprint = XXH3_64bits(m->source.data(), m->source.size());
  return m;
}

}  // namespace anvil
