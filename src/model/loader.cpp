#include "model/loader.h"

#include <cstdio>
#include <filesystem>
#include <set>

#include "base/mmap_file.h"
#include "format/hf_cache.h"
#include "model/fingerprint.h"

namespace anvil {

Result<std::unique_ptr<LoadedModel>> load_model(const std::string& path_or_repo, const std::string& revision) {
  ANVIL_ASSIGN_OR_RETURN(std::string dir, resolve_model_path(path_or_repo, revision));
  auto m = std::make_unique<LoadedModel>();
  m->source = dir;
  m->dir = dir;
  ANVIL_ASSIGN_OR_RETURN(m->config, load_model_config(dir));
  ANVIL_ASSIGN_OR_RETURN(m->checkpoint, Checkpoint::open(dir));
  const Checkpoint* ck = m->checkpoint.get();
  std::set<std::string> asked;  // every name the binding looked for
  ANVIL_ASSIGN_OR_RETURN(m->weights, bind_weights(m->config,
                                                  [ck, &asked](const std::string& n) {
                                                    asked.insert(n);
                                                    return ck->find(n);
                                                  },
                                                  dir));
  // Tensors the model never asked for: config.json describes another model than the weights (fewer
  // layers, another architecture's extra parts, a bias it has no place for). The output would be
  // silently wrong. (RoPE's cached inverse frequencies are derived, and a tied model's stored
  // lm_head copy is the embedding, as transformers takes it.)
  std::vector<std::string> unused;
  for (const std::string& n : ck->names())
    if (!asked.count(n) && n.find("rotary_emb.inv_freq") == std::string::npos &&
        !(m->config.tie_word_embeddings && n.rfind("lm_head.", 0) == 0))
      unused.push_back(n);
  if (!unused.empty())
    std::fprintf(stderr,
                 "[anvil] warning: %zu tensors of %s are not used by the %d-layer %s model config.json "
                 "describes (e.g. %s): do config.json and the weights belong together?\n",
                 unused.size(), dir.c_str(), m->config.num_hidden_layers, m->config.model_type.c_str(), unused[0].c_str());
  // Fingerprint: config.json and every byte of every tensor (model/fingerprint.h). A config that
  // cannot be read here, although parsed above, is an error: the identity would silently omit it.
  auto cfg_text = read_file(dir + "/config.json");
  if (!cfg_text.is_ok()) return cfg_text.status().with_context("fingerprinting the model");
  std::vector<const TensorView*> tensors;
  for (const std::string& n : ck->names()) tensors.push_back(ck->find(n));
  ThreadPool pool(ThreadPool::default_threads(), 0);
  m->fingerprint = model_fingerprint(*cfg_text, std::move(tensors), pool);
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
  std::vector<const TensorView*> tensors;
  for (const TensorView& t : sm->tensors) tensors.push_back(&t);
  ThreadPool pool(ThreadPool::default_threads(), 0);
  m->fingerprint = model_fingerprint(sm->config_json, std::move(tensors), pool);
  return m;
}

}  // namespace anvil
