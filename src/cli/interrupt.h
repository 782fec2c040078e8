// Ctrl-C during generation: the first SIGINT sets a flag that the token callback (and, between
// prefill chunks, GenerateRequest::keep_prefilling) reads, so the answer stops cleanly (its summary
// still printed); a second one before the flag is cleared exits at once (130). No SA_RESTART, so a
// blocking read of the next line returns EINTR instead of waiting.
#pragma once

namespace anvil::cli {

void install_sigint_handler();
bool interrupted();
void clear_interrupted();

}  // namespace anvil::cli
