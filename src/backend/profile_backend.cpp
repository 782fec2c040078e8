#include "backend/profile_backend.h"

#include "backend/cpu/cpu_backend.h"

namespace anvil {

const char* profile_category_name(ProfileCategory c) {
  switch (c) {
    case ProfileCategory::kRouting: return "routing";
    case ProfileCategory::kExperts: return "expert FFN";
    case ProfileCategory::kAttention: return "attention";
    case ProfileCategory::kDenseFfn: return "dense FFN";
    case ProfileCategory::kRest: return "rest";
    case ProfileCategory::kCount: break;
  }
  return "?";
}

void ProfilingBackend::moe_ffn(Act x, const MoEWeights& w, Act out) {
  // The CPU backend counts its routing and expert phases while profiling is on; the split is taken
  // from the counters' deltas.
  cpu_moe_profile(true);
  const MoEPhaseTimes before = cpu_moe_phase_times();
  (void)in_.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  in_.moe_ffn(x, w, out);
  (void)in_.synchronize();
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const MoEPhaseTimes after = cpu_moe_phase_times();
  cpu_moe_profile(false);  // on only around a profiled call: later unprofiled runs pay no timing
  // One backend op: counted under experts; routing gets its time, not an op of its own.
  const double route = after.calls > before.calls ? after.route_s - before.route_s : 0.0;
  totals_.seconds[int(ProfileCategory::kRouting)] += route;
  totals_.seconds[int(ProfileCategory::kExperts)] += total - route;
  ++totals_.ops[int(ProfileCategory::kExperts)];
}

}  // namespace anvil
