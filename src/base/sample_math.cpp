// The host instance of det_exp. anvil_core is compiled with -ffp-contract=off, so the adds and
// multiplies below stay separate IEEE operations, the same ones the CUDA kernel issues.
#include "base/sample_math.h"

#include <cmath>

namespace anvil::sampling {

double HostOps::rint(double a) { return std::nearbyint(a); }

double det_exp(double x) { return det_exp_impl<HostOps>(x); }

}  // namespace anvil::sampling
